//! `mailroom run`: relay, worker and HTTP API in one process, sharing the database and broker
//! settings, the templates, the shutdown signal and `/metrics`.

use tokio_util::sync::CancellationToken;

use super::{
    HttpConfig, RelayTuning, WorkerConfig, api_state, bind, build_relay, build_worker,
    check_broker, check_database, follow_templates, queue_depths, spawn_ingest, spawn_metrics,
    stop_metrics,
};
use crate::http;
use crate::http::Readiness;
use crate::http::metrics::Metrics;

/// What `mailroom run` needs: the worker's settings (its database, broker and metrics address
/// serve all three), the relay's tuning and the API's listener.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub worker: WorkerConfig,
    pub relay: RelayTuning,
    pub http: HttpConfig,
}

/// Runs the three until `shutdown`; the API wakes the relay after each new outbox row.
pub async fn run_all(config: &RunConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let (db, broker) = (&config.worker.database_url, &config.worker.broker);
    let worker = build_worker(&config.worker)?;
    check_database(db).await?;
    check_broker(&broker.amqp_url, "mailroom run").await?;
    let reload = config.worker.template_reload_interval;
    follow_templates(worker.templates(), reload, &shutdown)?;
    let relay = build_relay(db, broker, &config.relay)?;
    let listener = bind(&config.http).await?;
    let metrics = Metrics {
        worker: Some(worker.stats()),
        relay: Some(relay.stats()),
        queues: Some(queue_depths(broker, "run")),
        ..Metrics::default()
    };
    // The extra listener's /readyz: the worker's session and database.
    let readiness = Readiness {
        session: worker.live(),
        db: worker.database(),
    };
    let templates = Some(worker.templates());
    let wake = Some(relay.waker());
    let state = api_state(&config.http, db, broker, templates, metrics, wake)?;
    let metrics = state.metrics.clone();
    let extra = spawn_metrics(config.worker.metrics_addr, metrics, readiness, &shutdown).await?;
    let ingest = spawn_ingest(db, broker, config.worker.dead_letter_retention, &shutdown)?;
    let (w, r, h, _) = tokio::join!(
        worker.run(shutdown.clone()),
        relay.run(shutdown.clone()),
        http::serve(listener, state, shutdown.clone()),
        ingest
    );
    stop_metrics(extra, &shutdown).await?;
    w.and(r).and(h)
}
