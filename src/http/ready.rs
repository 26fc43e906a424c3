//! `GET /readyz`: is the database reachable, and is the broker? The broker check keeps one
//! connection open between probes ([`BrokerProbe`]), so a probe every few seconds opens no
//! connection (and leaves no trail of them in the broker's log); a new one is opened only when
//! the kept one has closed.
//!
//! Anyone may ask: the answer is `{"status": "ok" | "unavailable", "checks": {"database":
//! "ok" | "down", "broker": "ok" | "down"}}`. The error texts name the broker's user, host and
//! vhost and the database's, so they are added (`details`) only for callers that pass the API's
//! bearer token (or when the API has none and so listens on loopback only).
//!
//! A `worker` or `relay` with `--metrics-addr` answers `/readyz` on that listener from its own
//! state ([`Readiness`]): `broker` is `ok` while its session is live and its connection open
//! (the worker consuming the work queue; the relay with its confirm channel and its database
//! wake-up source open), and
//! `database` while its pool answers a ping. The same body, never with details. A process that
//! works without a queue it could not declare (a retry tier, the dead-letter queue) stays ready
//! and adds `"missing": ["queue <name>"]` while it declares it again ([`crate::broker::declare_and_repair`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::{
    Json,
    extract::State,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use lapin::Connection;
use serde_json::{Map, Value, json};
use tokio::sync::Mutex;

use super::ApiState;
use crate::config::UrlList;
use crate::db::Database;

/// How long one probe may take to open a broker connection: a probe answers in bounded time
/// even when a node drops packets instead of refusing them.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a worker's or relay's probe waits for its database to answer a ping.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// What `/readyz` checks in a `worker` or `relay` process: its broker session, and its database.
#[derive(Clone)]
pub struct Readiness {
    /// The connection of the process's live broker session, `None` between sessions
    /// ([`crate::worker::Worker::live`], [`crate::relay::Relay::live`]).
    pub session: tokio::sync::watch::Receiver<Option<lapin::ConnectionStatus>>,
    pub db: Database,
}

impl Readiness {
    /// `200` with every check `ok`, else `503`; the body names each check.
    pub async fn respond(&self) -> Response {
        // Read now: a session whose connection died is not ready, even before its loop notices.
        let broker = self
            .session
            .borrow()
            .as_ref()
            .is_some_and(|s| s.connected());
        let db = matches!(
            tokio::time::timeout(PING_TIMEOUT, self.db.ping()).await,
            Ok(Ok(()))
        );
        answer(&[("broker", broker), ("database", db)])
    }
}

/// The `/readyz` answer for these checks: `{"status", "checks"}`, `200` or `503`.
fn answer(checks: &[(&str, bool)]) -> Response {
    let up = checks.iter().all(|(_, ok)| *ok);
    let mut body = json!({
        "status": if up { "ok" } else { "unavailable" },
        "checks": checks.iter().map(|(name, ok)| (name.to_string(), json!(if *ok { "ok" } else { "down" }))).collect::<Map<String, Value>>(),
    });
    // Parts of the topology the process works without (still ready), while it declares them
    // again.
    let missing = crate::broker::missing_parts();
    if !missing.is_empty() {
        body["missing"] = json!(missing);
    }
    let code = if up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

/// The readiness probe's broker connection, opened on the first probe and kept while it stays
/// open. Probes take turns, so concurrent probes never open more than one.
pub struct BrokerProbe {
    urls: UrlList,
    name: String,
    kept: Mutex<Option<Connection>>,
    opened: AtomicU64,
}

impl BrokerProbe {
    /// A probe of `urls`; its connection shows as `name` in `rabbitmqctl list_connections`.
    pub fn new(urls: UrlList, name: impl Into<String>) -> BrokerProbe {
        BrokerProbe {
            urls,
            name: name.into(),
            kept: Mutex::new(None),
            opened: AtomicU64::new(0),
        }
    }

    /// How many connections this probe has opened so far.
    pub fn connections_opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// `Ok` while the kept connection is open; otherwise after opening a new one.
    pub async fn check(&self) -> anyhow::Result<()> {
        let mut kept = self.kept.lock().await;
        if kept.as_ref().is_some_and(|c| c.status().connected()) {
            return Ok(());
        }
        // A closed connection is dropped; lapin closes what is left of it.
        *kept = None;
        let conn = tokio::time::timeout(
            CONNECT_TIMEOUT,
            crate::broker::connect(&self.urls, &self.name),
        )
        .await
        .map_err(|_| anyhow::anyhow!("no connection to RabbitMQ within {CONNECT_TIMEOUT:?}"))??;
        self.opened.fetch_add(1, Ordering::Relaxed);
        *kept = Some(conn);
        Ok(())
    }
}

pub(super) async fn ready(State(state): State<Arc<ApiState>>, headers: HeaderMap) -> Response {
    let (db, broker) = tokio::join!(state.db.ping(), state.broker_probe.check());
    let checks = [
        ("database", db.map_err(|e| e.to_string())),
        ("broker", broker.map_err(|e| format!("{e:#}"))),
    ];
    let up = checks.iter().all(|(_, r)| r.is_ok());
    let mut body = json!({
        "status": if up { "ok" } else { "unavailable" },
        "checks": checks.iter().map(|(name, r)| (name.to_string(), json!(if r.is_ok() { "ok" } else { "down" }))).collect::<Map<String, Value>>(),
    });
    if !up && super::authorized(&state, &headers) {
        let details: Map<String, Value> = checks
            .iter()
            .filter_map(|(name, r)| r.as_ref().err().map(|e| (name.to_string(), json!(e))))
            .collect();
        body["details"] = Value::Object(details);
    }
    let code = if up {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_probe_of_an_unreachable_broker_counts_no_connection_and_says_why() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let urls: UrlList = format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
            .parse()
            .unwrap();
        let probe = BrokerProbe::new(urls, "test probe");
        let err = probe.check().await.unwrap_err();
        assert!(format!("{err:#}").contains("127.0.0.1"), "{err:#}");
        assert_eq!(probe.connections_opened(), 0);
    }
}
