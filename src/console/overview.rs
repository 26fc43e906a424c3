//! The Overview section: the pipeline at a glance, from [`crate::overview::overview`] (the
//! same gathering as `GET /v1/overview`). Sent, retried and dead per minute over the last hour
//! as bar charts drawn in SVG on the server, each also said in text and in a table; the queue
//! depths, the outbox, the SMTP circuits and the workers seen.
//!
//! The page holds a panel that htmx replaces every [`REFRESH`] with `GET /console/overview`
//! (the panel alone); the panel says when it was read, so a stale one is visible.

use std::sync::Arc;

use axum::{Extension, extract::State};
use chrono::{DateTime, Utc};
use maud::{Markup, html};

use super::Console;
use super::auth::Session;
use super::layout::{self, Section};
use crate::db::fleet::Minute;
use crate::overview::{FleetMember, Outbox, Overview, QueueSource, Queues, overview};

/// How often the panel refreshes itself: often enough to watch a backlog drain.
const REFRESH: &str = "every 5s";
/// The chart's drawing: one bar per minute, this wide with this gap, at most this tall.
const BAR: u32 = 8;
const GAP: u32 = 2;
const HEIGHT: u32 = 48;

/// What the Overview reads beyond the database.
pub(super) struct Pipeline {
    /// The broker's queue depths; `None` where no broker is configured.
    queues: Option<Arc<dyn QueueSource>>,
    /// The exchange name the workers beat under.
    namespace: String,
}

impl Console {
    /// The console with its Overview: `queues` reads the broker's depths, `namespace` is the
    /// topology's exchange (the workers' heartbeats are kept per namespace).
    pub fn with_pipeline(
        mut self,
        queues: Option<Arc<dyn QueueSource>>,
        namespace: &str,
    ) -> Console {
        self.pipeline = Some(Pipeline {
            queues,
            namespace: namespace.to_owned(),
        });
        self
    }
}

/// `GET /console`.
pub(super) async fn page(
    State(console): State<Arc<Console>>,
    Extension(session): Extension<Session>,
) -> Markup {
    let content = panel(&console).await;
    layout::page(
        &session,
        console.designer,
        Section::Overview,
        "Overview",
        content,
    )
}

/// `GET /console/overview`: the panel alone, what htmx swaps in.
pub(super) async fn refresh(State(console): State<Arc<Console>>) -> Markup {
    panel(&console).await
}

async fn panel(console: &Console) -> Markup {
    let (Some(db), Some(pipeline)) = (&console.db, &console.pipeline) else {
        return html! { p.notice { "No database here: the Overview needs " code { "mailroom serve" }
        " or " code { "mailroom run" } "." } };
    };
    let o = overview(db, pipeline.queues.as_deref(), &pipeline.namespace).await;
    html! {
        div id="overview" hx-get="/console/overview" hx-trigger=(REFRESH) hx-swap="outerHTML" {
            p.muted { "Namespace " code { (o.namespace) } ", read at " (time(o.generated_at))
                " UTC; refreshed every 5 seconds." }
            @if !o.unavailable.is_empty() {
                div.errors role="status" { p { strong { "Not all sources answered" } }
                    ul { @for line in &o.unavailable { li { (line) } } } }
            }
            (last_hour(&o))
            div.tiles {
                (queues(pipeline.queues.is_some(), o.queues.as_ref()))
                (outbox(o.outbox.as_ref()))
                (circuits(&o))
            }
            (workers(&o.workers))
        }
    }
}

fn time(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S").to_string()
}

/// The last hour: the totals in words, a chart per series, and the busy minutes as a table.
fn last_hour(o: &Overview) -> Markup {
    let t = &o.last_hour;
    let busy: Vec<&Minute> = o
        .minutes
        .iter()
        .filter(|m| m.sent + m.retried + m.dead > 0)
        .collect();
    html! {
        section aria-labelledby="hour-title" {
            h2 id="hour-title" { "Last hour" }
            p id="hour-totals" { (t.sent) " sent, " (t.retried) " retried, " (t.dead) " dead." }
            div.charts {
                (chart("sent", &o.minutes, |m| m.sent))
                (chart("retried", &o.minutes, |m| m.retried))
                (chart("dead", &o.minutes, |m| m.dead))
            }
            details {
                summary { "Per minute, as a table" }
                @if busy.is_empty() { p { "Nothing was sent, retried or dead-lettered this hour." } }
                @else {
                    div.table-wrap { table id="minutes" {
                        caption { "Minutes that counted something (UTC); the others counted nothing." }
                        thead { tr { th scope="col" { "Minute" } th scope="col" { "Sent" }
                            th scope="col" { "Retried" } th scope="col" { "Dead" } } }
                        tbody { @for m in &busy { tr {
                            th scope="row" { (m.minute.format("%H:%M")) }
                            td { (m.sent) } td { (m.retried) } td { (m.dead) }
                        } } }
                    } }
                }
            }
        }
    }
}

/// One series as bars, oldest minute on the left; its label says the total and the peak, so
/// the picture is never the only way to read it.
fn chart(series: &str, minutes: &[Minute], value: impl Fn(&Minute) -> i64) -> Markup {
    let peak = minutes.iter().map(&value).max().unwrap_or(0);
    let total: i64 = minutes.iter().map(&value).sum();
    let width = minutes.len() as u32 * (BAR + GAP);
    let label = format!(
        "{series} per minute over the last hour: {total} in all, at most {peak} in a minute"
    );
    html! {
        figure.chart {
            figcaption { span.series { (series) } " " span.muted { (total) " · peak " (peak) "/min" } }
            svg class=(format!("bars {series}")) role="img" aria-label=(label)
                viewBox=(format!("0 0 {width} {HEIGHT}")) preserveAspectRatio="none" {
                @for (i, m) in minutes.iter().enumerate() {
                    @let v = value(m);
                    @let h = bar_height(v, peak);
                    rect x=(i as u32 * (BAR + GAP)) y=(HEIGHT - h) width=(BAR) height=(h) {
                        title { (m.minute.format("%H:%M")) ": " (v) " " (series) }
                    }
                }
                line x1="0" y1=(HEIGHT) x2=(width) y2=(HEIGHT) {}
            }
        }
    }
}

/// A bar's height: proportional to the peak, and at least a sliver when not zero.
fn bar_height(value: i64, peak: i64) -> u32 {
    if value <= 0 || peak <= 0 {
        return 0;
    }
    ((value * i64::from(HEIGHT)) / peak).clamp(2, i64::from(HEIGHT)) as u32
}

fn queues(configured: bool, queues: Option<&Queues>) -> Markup {
    html! {
        section.tile id="queues" aria-labelledby="queues-title" {
            h2 id="queues-title" { "Queues" }
            @match queues {
                None if configured => p.status-error { "Broker unreachable: queue depths unknown." },
                None => p { "No broker configured for this process." },
                Some(q) => {
                    table {
                        thead { tr { th scope="col" { "Queue" } th scope="col" { "Ready" }
                            th scope="col" { "Consumers" } } }
                        tbody { @for d in &q.queues { tr {
                            th scope="row" { (d.role) @if let Some(tier) = &d.tier { " " (tier) } }
                            td { (d.messages) } td { (d.consumers) }
                        } } }
                    }
                    @if q.age_seconds >= 5.0 {
                        p.muted { "Read " (q.age_seconds.round()) " s ago: the broker did not answer since." }
                    }
                }
            }
        }
    }
}

fn outbox(outbox: Option<&Outbox>) -> Markup {
    html! {
        section.tile id="outbox" aria-labelledby="outbox-title" {
            h2 id="outbox-title" { "Outbox" }
            @match outbox {
                None => p.status-error { "Database unavailable: the outbox is unknown." },
                Some(o) => dl.facts {
                    dt { "Waiting to be published" } dd { (o.pending) }
                    dt { "Parked (failed too often)" } dd { (o.parked) }
                    dt { "Relay lag" } dd { (format!("{:.1}", o.relay_lag_seconds)) " s" }
                },
            }
        }
    }
}

fn circuits(o: &Overview) -> Markup {
    let running = o.workers.iter().filter(|w| w.state == "running").count();
    html! {
        section.tile id="circuit" aria-labelledby="circuit-title" {
            h2 id="circuit-title" { "SMTP circuit" }
            @if running == 0 { p { "No worker running." } }
            @else if o.circuits_open == 0 {
                p.status-ok { "Closed on every running worker (" (running) ")." }
            } @else {
                p.status-error { "Open on " (o.circuits_open) " of " (running)
                    " running workers: they wait before sending again." }
            }
        }
    }
}

fn workers(workers: &[FleetMember]) -> Markup {
    html! {
        section aria-labelledby="workers-title" {
            h2 id="workers-title" { "Workers seen this hour" }
            @if workers.is_empty() { p { "No worker beat in the last hour." } }
            @else {
                div.table-wrap { table id="workers" {
                    thead { tr { th scope="col" { "Worker" } th scope="col" { "Host" }
                        th scope="col" { "Version" } th scope="col" { "State" }
                        th scope="col" { "Last heartbeat (UTC)" } th scope="col" { "In flight" }
                        th scope="col" { "Circuit" } th scope="col" { "Sent · retried · dead" } } }
                    tbody { @for w in workers { @let s = &w.worker; tr {
                        th scope="row" { code { (s.worker_id) } }
                        td { (s.host) " (pid " (s.pid) ")" }
                        td { (s.version) }
                        td { span class=(format!("state-{}", w.state)) { (w.state) } }
                        td { (time(s.last_seen)) " (" (s.silent_for.round()) " s ago)" }
                        td { (s.in_flight) }
                        td { @if s.circuit_open { strong { "open" } } @else { "closed" } }
                        td { (s.sent) " · " (s.retried) " · " (s.dead) }
                    } } }
                } }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bar_is_proportional_to_the_peak_and_a_small_count_still_shows() {
        assert_eq!(bar_height(0, 10), 0);
        assert_eq!(bar_height(10, 10), HEIGHT);
        assert_eq!(bar_height(5, 10), HEIGHT / 2);
        assert_eq!(bar_height(1, 1000), 2);
    }
}
