//! `/readyz` on the `--metrics-addr` listener of a real `worker` and `relay`: 200 while the
//! process's broker session and database are up, 503 naming the check that is down while a
//! fault proxy resets every connection to the database or to RabbitMQ, 200 again once healed.
//! A scrape while the broker is partitioned answers at once with the last queue depths and
//! their age. The shared services are never touched: only the proxies in front of them.

use serde_json::Value;
use tokio::process::Child;

use crate::helpers::*;

/// Proxies in front of the test's database and broker.
struct Proxies {
    db: FaultProxy,
    amqp: FaultProxy,
    db_url: String,
    amqp_url: String,
}

impl Proxies {
    async fn start(app: &TestApp) -> Proxies {
        let port = |u: &str| url::Url::parse(u).unwrap().port().unwrap();
        let db = FaultProxy::start(port(&app.db_url)).await;
        let amqp = FaultProxy::start(port(&app.amqp_url)).await;
        let (db_url, amqp_url) = (db.url_through(&app.db_url), amqp.url_through(&app.amqp_url));
        Proxies {
            db,
            amqp,
            db_url,
            amqp_url,
        }
    }

    /// `--database-url` and `--amqp-url` through the proxies, and `--metrics-addr`.
    fn args<'a>(&'a self, metrics: &'a str) -> [&'a str; 6] {
        [
            "--database-url",
            &self.db_url,
            "--amqp-url",
            &self.amqp_url,
            "--metrics-addr",
            metrics,
        ]
    }
}

/// Waits until `/readyz` on `addr` answers `code`; returns its body.
async fn readyz_becomes(addr: &str, code: u16, why: &str) -> Value {
    let client = reqwest::Client::new();
    eventually(why, || async {
        let resp = client
            .get(format!("http://{addr}/readyz"))
            .send()
            .await
            .ok()?;
        if resp.status().as_u16() != code {
            return None;
        }
        resp.json::<Value>().await.ok()
    })
    .await
}

/// Up, broker down, up, database down, up: each as `/readyz` says it.
async fn follows_its_connections(process: Child, addr: &str, proxies: &Proxies) {
    let ok = readyz_becomes(addr, 200, "ready with both up").await;
    assert_eq!(ok["status"], "ok", "{ok}");

    // The broker first: an idle process must notice a lost connection by itself.
    proxies.amqp.set(Fault::Reset);
    let down = readyz_becomes(addr, 503, "unready without its broker").await;
    assert_eq!(down["checks"]["broker"], "down", "{down}");
    assert_eq!(down["status"], "unavailable", "{down}");
    proxies.amqp.set(Fault::Pass);
    readyz_becomes(addr, 200, "ready once the broker is back").await;

    proxies.db.set(Fault::Reset);
    let down = readyz_becomes(addr, 503, "unready without its database").await;
    assert_eq!(down["checks"]["database"], "down", "{down}");
    proxies.db.set(Fault::Pass);
    readyz_becomes(addr, 200, "ready once the database is back").await;
    terminate(&process).await;
}

#[tokio::test]
async fn a_worker_is_ready_only_while_its_broker_session_and_database_are_up() {
    let app = TestApp::spawn().await;
    let proxies = Proxies::start(&app).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let worker = app.spawn_worker_process(&proxies.args(&addr), &[]);
    follows_its_connections(worker, &addr, &proxies).await;
}

#[tokio::test]
async fn a_relay_is_ready_only_while_its_session_and_database_are_up() {
    let app = TestApp::spawn().await;
    let proxies = Proxies::start(&app).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let relay = app.spawn_relay_process(&proxies.args(&addr), &[]);
    follows_its_connections(relay, &addr, &proxies).await;
}

/// The value of the unlabelled series `name` in a `/metrics` text.
fn value_of(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn a_scrape_while_the_broker_is_partitioned_answers_with_the_last_depths_and_their_age() {
    let app = TestApp::spawn().await;
    let proxies = Proxies::start(&app).await;
    let addr = format!("127.0.0.1:{}", free_port());
    let worker = app.spawn_worker_process(&proxies.args(&addr), &[]);
    let fresh = eventually("queue depths read through the proxy", || async {
        let text = scrape_metrics(&addr).await?;
        text.contains("mailroom_queue_messages{").then_some(text)
    })
    .await;
    assert!(
        value_of(&fresh, "mailroom_queue_depth_age_seconds").unwrap() < 1.0,
        "{fresh}"
    );

    // The broker stops answering, sockets open: a read that waited for it would never end.
    proxies.amqp.set(Fault::Blackhole);
    let stale = tokio::time::timeout(std::time::Duration::from_secs(15), scrape_metrics(&addr))
        .await
        .expect("a scrape during a partition answers instead of hanging")
        .expect("the metrics listener answers");
    assert!(stale.contains("mailroom_queue_messages{"), "{stale}");
    let age = value_of(&stale, "mailroom_queue_depth_age_seconds").unwrap();
    assert!(age >= 1.0, "the depths are served as stale: age {age}");
    proxies.amqp.set(Fault::Pass);
    terminate(&worker).await;
}
