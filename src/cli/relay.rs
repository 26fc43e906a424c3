//! `mailroom relay`: its arguments, parsed into [`RelayConfig`].

use std::time::Duration;

use clap::Args;

use super::{BrokerArgs, DatabaseArgs, MetricsOptions};
use crate::config;
use crate::relay::{Relay, WakeupChoice};
use crate::startup::{self, RelayConfig, RelayTuning};

#[derive(Debug, Args)]
pub struct RelayOptions {
    /// Outbox rows claimed, published and marked per batch.
    #[arg(long, env = "MAILROOM_RELAY_BATCH", default_value_t = 500)]
    pub relay_batch: i64,
    /// Bytes of message bodies per batch at most (a batch is cut there; one row always goes).
    #[arg(long, env = "MAILROOM_RELAY_BATCH_BYTES", default_value_t = crate::relay::DEFAULT_BATCH_BYTES)]
    pub relay_batch_bytes: usize,
    /// PostgreSQL: the longest wait between probes of an idle outbox (covers notifications lost
    /// while the listener reconnects); LISTEN/NOTIFY wakes an idle relay at once.
    #[arg(long, env = "MAILROOM_RELAY_POLL", default_value = "5s", value_parser = config::parse_duration)]
    pub relay_poll: Duration,
    /// The wait between lock-free probes of the outbox while rows keep coming; it doubles while
    /// none do, up to --relay-poll (PostgreSQL) or --relay-poll-max (MySQL/MariaDB).
    #[arg(long, env = "MAILROOM_RELAY_POLL_MIN", default_value = "10ms", value_parser = config::parse_duration)]
    pub relay_poll_min: Duration,
    /// MySQL/MariaDB: the longest wait between polls of an idle outbox, i.e. the most latency
    /// the poll adds and one lock-free query per interval.
    #[arg(long, env = "MAILROOM_RELAY_POLL_MAX", default_value = "1s", value_parser = config::parse_duration)]
    pub relay_poll_max: Duration,
    /// What wakes an idle relay: `auto`, the best the server allows (PostgreSQL: the WAL, then
    /// NOTIFY, then polling; MySQL/MariaDB: the binary log, then polling); `notify` (PostgreSQL:
    /// never the WAL); `poll`. Each relay says at startup which one runs and why.
    #[arg(long, env = "MAILROOM_RELAY_WAKEUP", value_enum, default_value_t = WakeupChoice::Auto)]
    pub relay_wakeup: WakeupChoice,
    /// Outbox commits a second from which the relay pauses its stream (the WAL or the binary
    /// log) and probes every --relay-poll-min instead, until the outbox is quiet; 0 never
    /// pauses. The server decodes or sends every transaction for the stream, and each commit
    /// it reports is published alone; rows a probe finds together travel together, for up to
    /// --relay-poll-min more latency.
    #[arg(long, env = "MAILROOM_RELAY_STREAM_PAUSE_ABOVE", default_value_t = crate::relay::wal::PAUSE_ABOVE)]
    pub relay_stream_pause_above: u32,
    /// How long the marks of the batch that drained the outbox may stay uncommitted, so that
    /// the next wake-ups' rows share their commit (publishing never waits for it); a crash in
    /// that time publishes those rows again, which the worker's claim makes harmless. 0 commits
    /// every batch at once; at most 10s, and at most half the database server's limit on a
    /// transaction left open (read at each session's start).
    #[arg(long, env = "MAILROOM_RELAY_COMMIT_HOLD", default_value = "10ms", value_parser = parse_commit_hold)]
    pub relay_commit_hold: Duration,
    /// PostgreSQL: how often a scan of the outbox starts from its first row instead of from
    /// the relay's floor (below which every row is published or will never be; the index
    /// entries published rows leave there until a VACUUM are skipped). Only a row whose
    /// `parked_at` an operator cleared waits for it. 0 scans from the first row every time.
    #[arg(long, env = "MAILROOM_RELAY_FULL_SCAN_EVERY", default_value = "5s", value_parser = config::parse_duration)]
    pub relay_full_scan_every: Duration,
    /// Published outbox rows older than this are deleted (in batches of 1,000).
    #[arg(long, env = "MAILROOM_OUTBOX_RETENTION", default_value = "7d", value_parser = config::parse_duration)]
    pub outbox_retention: Duration,
}

impl RelayOptions {
    /// The settings these arguments give (shared with `run`).
    pub fn tuning(&self) -> RelayTuning {
        RelayTuning {
            batch: self.relay_batch,
            batch_bytes: self.relay_batch_bytes,
            poll: self.relay_poll,
            poll_min: self.relay_poll_min,
            poll_max: self.relay_poll_max,
            outbox_retention: self.outbox_retention,
            wakeup: self.relay_wakeup,
            stream_pause_above: self.relay_stream_pause_above,
            commit_hold: self.relay_commit_hold,
            full_scan_every: self.relay_full_scan_every,
        }
    }
}

/// A duration of at most [`crate::relay::MAX_COMMIT_HOLD`].
fn parse_commit_hold(s: &str) -> Result<Duration, String> {
    let hold = config::parse_duration(s)?;
    let max = crate::relay::MAX_COMMIT_HOLD;
    if hold > max {
        return Err(format!(
            "{s} is longer than {max:?}: held marks keep their rows locked and a crash publishes them again"
        ));
    }
    Ok(hold)
}

#[derive(Debug, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    #[command(flatten)]
    pub broker: BrokerArgs,
    #[command(flatten)]
    pub relay: RelayOptions,
    #[command(flatten)]
    pub metrics: MetricsOptions,
}

impl RelayArgs {
    /// The settings these arguments give.
    pub fn config(&self) -> RelayConfig {
        RelayConfig {
            database_url: self.db.database_url.clone(),
            broker: self.broker.config(),
            relay: self.relay.tuning(),
            metrics_addr: self.metrics.metrics_addr,
        }
    }

    /// Builds the relay these options describe ([`startup::build_relay`]).
    pub fn build(&self) -> anyhow::Result<Relay> {
        let config = self.config();
        startup::build_relay(&config.database_url, &config.broker, &config.relay)
    }

    /// Runs the relay until SIGTERM/SIGINT ([`startup::run_relay`]).
    pub async fn run(&self) -> anyhow::Result<()> {
        let shutdown = crate::shutdown::on_signals()?;
        startup::run_relay(&self.config(), shutdown).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_hold_past_its_bound_is_refused_naming_the_bound() {
        assert_eq!(parse_commit_hold("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_commit_hold("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_commit_hold("10s"), Ok(Duration::from_secs(10)));
        let err = parse_commit_hold("11s").unwrap_err();
        assert!(err.contains("longer than 10s"), "{err}");
        assert!(parse_commit_hold("soon").is_err());
    }
}
