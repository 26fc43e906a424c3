//! `mailroom relay`: its settings, and the relay built from them.

use std::net::SocketAddr;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{
    BrokerConfig, check_broker, check_database, queue_depths, spawn_metrics, stop_metrics,
};
use crate::config::SecretUrl;
use crate::db::{Database, OnAcquire};
use crate::http::Readiness;
use crate::http::metrics::Metrics;
use crate::relay::{Relay, RelaySettings, WakeupChoice};

/// How the relay batches, polls and cleans up (`mailroom relay --help` says what each means);
/// shared by `relay` and `run`. Zero sizes are raised to one.
#[derive(Clone, Debug)]
pub struct RelayTuning {
    pub batch: i64,
    pub batch_bytes: usize,
    pub poll: Duration,
    pub poll_min: Duration,
    pub poll_max: Duration,
    pub outbox_retention: Duration,
    /// The best wake-up source to try.
    pub wakeup: WakeupChoice,
    /// Outbox commits a second that pause the WAL or binary log stream (0: never).
    pub stream_pause_above: u32,
    /// How long a drained batch's marks may wait for the next rows' commit.
    pub commit_hold: Duration,
    /// PostgreSQL: how often a scan starts from the outbox's first row, not the floor.
    pub full_scan_every: Duration,
}

/// What `mailroom relay` needs.
#[derive(Clone, Debug)]
pub struct RelayConfig {
    pub database_url: SecretUrl,
    pub broker: BrokerConfig,
    pub relay: RelayTuning,
    /// A `/metrics` listener of its own.
    pub metrics_addr: Option<SocketAddr>,
}

/// Runs the relay and the optional metrics listener until `shutdown`.
pub async fn run_relay(config: &RelayConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let relay = build_relay(&config.database_url, &config.broker, &config.relay)?;
    check_database(&config.database_url).await?;
    check_broker(&config.broker.amqp_url, "mailroom relay").await?;
    // One connection of its own for the scrape-time queries and the readiness ping.
    let db = Database::connect_lazy(&config.database_url, 1)?;
    let metrics = Metrics {
        relay: Some(relay.stats()),
        db: Some(db.clone()),
        queues: Some(queue_depths(&config.broker, "relay")),
        ..Metrics::default()
    };
    let readiness = Readiness {
        session: relay.live(),
        db,
    };
    let server = spawn_metrics(config.metrics_addr, metrics, readiness, &shutdown).await?;
    let result = relay.run(shutdown.clone()).await;
    stop_metrics(server, &shutdown).await?;
    result
}

/// Builds the relay (it connects lazily).
pub fn build_relay(
    database_url: &SecretUrl,
    broker: &BrokerConfig,
    tuning: &RelayTuning,
) -> anyhow::Result<Relay> {
    // The relay retries a failed batch or probe on its next turn: no ping before each use.
    let db = Database::connect_lazy_with(database_url, 4, OnAcquire::NoPing)?;
    let settings = RelaySettings {
        amqp: broker.amqp_url.clone(),
        topology: broker.topology(),
        batch_size: tuning.batch.max(1),
        batch_bytes: tuning.batch_bytes.max(1),
        poll_interval: tuning.poll,
        poll_min: tuning.poll_min,
        poll_max: tuning.poll_max,
        retention: tuning.outbox_retention,
        name: format!("mailroom relay (pid {})", std::process::id()),
        // The WAL (src/relay/wal.rs) or the binary log (src/relay/binlog.rs) wakes the relay.
        database_url: Some(database_url.clone()),
        wakeup: tuning.wakeup,
        stream_pause_above: tuning.stream_pause_above,
        commit_hold: tuning.commit_hold.min(crate::relay::MAX_COMMIT_HOLD),
        full_scan_every: tuning.full_scan_every,
    };
    Ok(Relay::new(settings, db))
}
