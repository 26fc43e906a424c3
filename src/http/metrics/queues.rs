//! Queue depths for `/metrics`: the work queue, each retry tier and the dead-letter queue, read
//! with a passive `queue.declare` (which creates nothing and needs no management plugin) on a
//! connection of their own, kept between scrapes.
//!
//! A scrape never waits long for the broker: the read gets [`READ_TIMEOUT`], and when it fails
//! or runs out the last values are served with their age (`mailroom_queue_depth_age_seconds`),
//! a stale value being more use than a hung scrape. Concurrent scrapes take turns, so they open
//! one connection at most.

use std::time::{Duration, Instant};

use lapin::{Connection, options::QueueDeclareOptions, types::FieldTable};
use tokio::sync::Mutex;

use super::text::{gauge, header, sample};
use crate::broker::Topology;
use crate::config::UrlList;

/// How long a scrape waits for fresh depths (connecting included).
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// One queue's depth: its role (`work`, `retry`, `dead`), the retry tier's delay label, and
/// the broker's counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Depth {
    pub role: &'static str,
    pub tier: Option<String>,
    /// Messages ready for delivery (unacknowledged ones are not counted by the broker here).
    pub messages: u32,
    pub consumers: u32,
}

/// The broker's queues, read at scrape time.
pub struct QueueDepths {
    urls: UrlList,
    topology: Topology,
    name: String,
    state: Mutex<Kept>,
}

/// The kept connection, and the last depths read with when they were read.
#[derive(Default)]
struct Kept {
    conn: Option<Connection>,
    last: Option<(Instant, Vec<Depth>)>,
}

impl QueueDepths {
    /// Depths of `topology`'s queues on `urls`; the connection shows as `name` in
    /// `rabbitmqctl list_connections`.
    pub fn new(urls: UrlList, topology: Topology, name: impl Into<String>) -> QueueDepths {
        QueueDepths {
            urls,
            topology,
            name: name.into(),
            state: Mutex::default(),
        }
    }

    /// Fresh depths when the broker answers within [`READ_TIMEOUT`], else the last ones; with
    /// their age. `None` before any read succeeded.
    pub async fn read(&self) -> Option<(Duration, Vec<Depth>)> {
        let Ok(mut state) = tokio::time::timeout(READ_TIMEOUT, self.state.lock()).await else {
            return None;
        };
        let Kept { conn: kept, last } = &mut *state;
        match tokio::time::timeout(READ_TIMEOUT, self.refresh(kept)).await {
            Ok(Ok(depths)) => *last = Some((Instant::now(), depths)),
            Ok(Err(e)) => {
                *kept = None;
                tracing::warn!(
                    error = format!("{e:#}"),
                    "metrics: cannot read the queue depths"
                );
            }
            Err(_) => {
                *kept = None;
                tracing::warn!(timeout = ?READ_TIMEOUT, "metrics: the broker did not tell the queue depths in time");
            }
        }
        last.as_ref().map(|(at, d)| (at.elapsed(), d.clone()))
    }

    /// Reads every queue on a new channel of the kept (or a new) connection.
    async fn refresh(&self, kept: &mut Option<Connection>) -> anyhow::Result<Vec<Depth>> {
        if !kept.as_ref().is_some_and(|c| c.status().connected()) {
            *kept = Some(crate::broker::connect(&self.urls, &self.name).await?);
        }
        let Some(conn) = kept.as_ref() else {
            unreachable!("connected just above");
        };
        let channel = conn.create_channel().await?;
        let mut depths = Vec::new();
        for (role, tier, queue) in self.queues() {
            let passive = QueueDeclareOptions::default().passive();
            let q = channel
                .queue_declare(queue.as_str().into(), passive, FieldTable::default())
                .await
                .map_err(|e| anyhow::anyhow!("queue {queue}: {e}"))?;
            let (messages, consumers) = (q.message_count(), q.consumer_count());
            depths.push(Depth {
                role,
                tier,
                messages,
                consumers,
            });
        }
        let _ = channel.close(200, "depths read".into()).await;
        Ok(depths)
    }

    /// Each queue with its role and tier.
    fn queues(&self) -> Vec<(&'static str, Option<String>, String)> {
        let t = &self.topology;
        let mut all = vec![("work", None, t.queue.clone())];
        for d in &t.retry_delays {
            all.push(("retry", Some(Topology::delay_label(*d)), t.retry_queue(*d)));
        }
        all.push(("dead", None, t.dead.clone()));
        all
    }
}

/// Writes the depths and consumers by queue, and their age.
pub async fn write(out: &mut String, q: &QueueDepths) {
    let Some((age, depths)) = q.read().await else {
        return;
    };
    type Pick = fn(&Depth) -> u32;
    let families: [(&str, &str, Pick); 2] = [
        (
            "mailroom_queue_messages",
            "Messages ready in each queue (work, retry tiers, dead).",
            |d| d.messages,
        ),
        (
            "mailroom_queue_consumers",
            "Consumers of each queue (the workers on `work`).",
            |d| d.consumers,
        ),
    ];
    for (name, help, pick) in families {
        header(out, name, "gauge", help);
        for d in &depths {
            let mut labels = vec![("queue", d.role)];
            if let Some(tier) = &d.tier {
                labels.push(("tier", tier));
            }
            sample(out, name, &labels, pick(d));
        }
    }
    let help = "Seconds since the queue depths were read (near 0 when this scrape read them).";
    gauge(
        out,
        "mailroom_queue_depth_age_seconds",
        help,
        age.as_secs_f64(),
    );
}
