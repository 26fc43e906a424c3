//! `/metrics` in the Prometheus text format (version 0.0.4), rendered at scrape time from the
//! counters the worker ([`Stats`]), the relay ([`RelayStats`]) and the template watcher
//! ([`LiveTemplates`]) already keep, plus what is read at scrape time: the outbox backlog from
//! the database, the queue depths from the broker ([`queues`]), the process from `/proc/self`
//! ([`process`]). Every metric, its type, labels and meaning: docs/METRICS.md.
//!
//! Hand-written rather than the `prometheus-client` crate: the counters already exist as
//! atomics that the worker, the relay and the tests read; a registry would mean counting
//! everything twice or wrapping every atomic, for a format of a few lines of text ([`text`]).
//! The whole output is checked by a real parser (`promtool check metrics`, in the integration
//! tests), and every name the shipped dashboard and alerts use must appear in it.
//!
//! Labels stay bounded: `kind` is a template's name or `other`, `class` one of the error
//! classes, `queue`/`tier` the configured queues.

pub mod process;
pub mod queues;
mod relay;
pub mod text;
mod worker;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::db::Database;
use crate::relay::RelayStats;
use crate::render::LiveTemplates;
use crate::worker::Stats;
pub use queues::QueueDepths;
use text::{header, sample};

/// What a process can report; each part is present when the process runs it. Every process
/// reports its build and `process_*` metrics.
#[derive(Clone, Default)]
pub struct Metrics {
    pub worker: Option<Arc<Stats>>,
    pub relay: Option<Arc<RelayStats>>,
    pub templates: Option<Arc<LiveTemplates>>,
    /// For the outbox backlog and the relay lag, read at scrape time.
    pub db: Option<Database>,
    /// For the queue depths, read at scrape time.
    pub queues: Option<Arc<QueueDepths>>,
}

impl Metrics {
    /// The exposition text.
    pub async fn render(&self) -> String {
        let mut out = String::new();
        process::build_info(&mut out);
        process::write(&mut out);
        topology(&mut out);
        if let Some(w) = &self.worker {
            let kinds = self
                .templates
                .as_ref()
                .map(|t| t.current().kinds())
                .unwrap_or_default();
            worker::write(&mut out, w, &kinds);
        }
        if let Some(r) = &self.relay {
            relay::write(&mut out, r);
        }
        // The two reads at scrape time run side by side, each bounded by its own timeout.
        let (outbox, queues) = tokio::join!(
            async {
                let mut out = String::new();
                if let Some(db) = &self.db {
                    relay::outbox(&mut out, db).await;
                }
                out
            },
            async {
                let mut out = String::new();
                if let Some(q) = &self.queues {
                    queues::write(&mut out, q).await;
                }
                out
            }
        );
        out.push_str(&outbox);
        out.push_str(&queues);
        if let Some(t) = &self.templates {
            templates(&mut out, t);
        }
        out
    }
}

/// The template watcher's section: reloads by result, and the revision in use.
fn templates(out: &mut String, t: &LiveTemplates) {
    let name = "mailroom_template_reloads_total";
    header(
        out,
        name,
        "counter",
        "Template directory reloads, by result.",
    );
    for (result, n) in [("ok", &t.reloads_ok), ("failed", &t.reloads_failed)] {
        sample(out, name, &[("result", result)], n.load(Ordering::Relaxed));
    }
    let name = "mailroom_template_info";
    let help = "The template set in use (1): its revision, a content hash.";
    header(out, name, "gauge", help);
    let revision = t.current().revision().to_owned();
    sample(out, name, &[("revision", &revision)], 1);
}
/// `mailroom_topology_missing`: one series per queue this process could not declare (and is
/// declaring again in the background); no series while the topology is complete.
fn topology(out: &mut String) {
    let name = "mailroom_topology_missing";
    text::header(
        out,
        name,
        "gauge",
        "Queues (and their bindings) this process could not declare; it works without them and retries.",
    );
    for part in crate::broker::missing_parts() {
        text::sample(out, name, &[("part", &part)], 1);
    }
}
