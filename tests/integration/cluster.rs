//! mailroom on a three-node RabbitMQ cluster (`scripts/cluster`: rmqc1..3@localhost on
//! 5681-5683): a relay and two workers given all three URLs keep sending while the node that
//! leads the work queue is SIGKILLed, and after it restarts every job was sent once and nothing
//! is left in any queue.
//!
//! Disruptive (it kills a node), so ignored unless asked for; it runs only against the test
//! cluster, never the shared node on 5672, and skips itself, saying why, when
//! `MAILROOM_TEST_CLUSTER_URLS` (set by scripts/test when `scripts/cluster --status` succeeds)
//! is not set.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lapin::options::{QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use tokio::process::Command;
use tokio::time::Instant;

use crate::helpers::*;

/// Jobs committed over the run, one every [`EVERY`].
const JOBS: usize = 400;
const EVERY: Duration = Duration::from_millis(50);
/// How long the leader stays dead before it is restarted.
const OUTAGE: Duration = Duration::from_secs(12);

fn cluster_urls() -> Option<String> {
    std::env::var("MAILROOM_TEST_CLUSTER_URLS").ok()
}

/// `scripts/cluster ARGS`: its stdout, or a panic with its stderr.
async fn cluster_script(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster");
    let out = Command::new(script).args(args).output().await.unwrap();
    assert!(
        out.status.success(),
        "scripts/cluster {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `rabbitmqctl list_queues name leader members` on node `via`: queue → (leader, members).
async fn quorum_layout(via: u8) -> HashMap<String, (String, usize)> {
    let out = Command::new("rabbitmqctl")
        .args(["-q", "-n", &format!("rmqc{via}@localhost")])
        .args(["list_queues", "name", "leader", "members"])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut cols = line.split('\t');
            let (name, leader, members) = (cols.next()?, cols.next()?, cols.next()?);
            Some((
                name.to_string(),
                (leader.to_string(), members.matches("rmqc").count()),
            ))
        })
        .collect()
}

async fn signal(pid: &str, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, pid])
        .status()
        .await
        .unwrap();
    assert!(ok.success(), "kill {sig} {pid}");
}

/// The count of messages the SMTP server has accepted, sampled every 100 ms until `stop`.
fn sample_counts(
    app: Arc<TestApp>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(Instant, usize)>> {
    tokio::spawn(async move {
        let mut samples = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            samples.push((Instant::now(), app.smtp.received().len()));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        samples
    })
}

/// The longest time between `from` and `to` during which the count did not grow while jobs
/// were waiting (the count below `total`).
fn longest_stall(
    samples: &[(Instant, usize)],
    from: Instant,
    to: Instant,
    total: usize,
) -> Duration {
    let mut longest = Duration::ZERO;
    let mut since: Option<(Instant, usize)> = None;
    for &(at, count) in samples.iter().filter(|(at, _)| *at >= from && *at <= to) {
        match since {
            Some((start, n)) if n == count && count < total => {
                longest = longest.max(at - start);
            }
            _ => since = Some((at, count)),
        }
    }
    longest
}

/// What happened while a node was down.
struct Outage {
    sent_in_outage: usize,
    stall: Duration,
    restart: Duration,
}

/// Starts a relay and two workers on `urls`, commits [`JOBS`] jobs over the run, SIGKILLs node
/// `node` once 50 are sent, restarts it after [`OUTAGE`]; then checks every job was sent once,
/// and every queue is empty once the processes stopped.
async fn kill_node_under_load(app: &Arc<TestApp>, urls: &str, node: u8) -> Outage {
    let pid = cluster_script(&["--pid", &node.to_string()]).await;
    let amqp = ["--amqp-url", urls];
    let workers = [
        app.spawn_worker_process(&amqp, &[]),
        app.spawn_worker_process(&amqp, &[]),
    ];
    let relay = app.spawn_relay_process(&amqp, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample_counts(app.clone(), stop.clone());
    let producer = {
        let app = app.clone();
        tokio::spawn(async move {
            for i in 0..JOBS {
                app.enqueue(&app.email_job(&format!("cluster-{i}")))
                    .await
                    .unwrap();
                tokio::time::sleep(EVERY).await;
            }
        })
    };

    app.smtp.wait_for(50).await;
    let killed_at = Instant::now();
    let sent_at_kill = app.smtp.received().len();
    signal(&pid, "-KILL").await;
    tokio::time::sleep(OUTAGE).await;
    let sent_in_outage = app.smtp.received().len() - sent_at_kill;
    let restarted_at = Instant::now();
    cluster_script(&[]).await;
    let back_at = Instant::now();

    producer.await.unwrap();
    let got = app
        .smtp
        .wait_for_within(JOBS, Duration::from_secs(120))
        .await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    for i in 0..JOBS {
        let id = app.message_id(&format!("cluster-{i}"), "welcome");
        assert_eq!(app.smtp.count(&id), 1, "cluster-{i} sent once");
    }
    assert_eq!(got.len(), JOBS, "nothing unexpected");
    for worker in &workers {
        terminate(worker).await;
    }
    terminate(&relay).await;
    assert_queues_empty(app, urls).await;
    assert_eq!(app.unpublished().await, 0);
    Outage {
        sent_in_outage,
        stall: longest_stall(&samples, killed_at, back_at, JOBS),
        restart: back_at - restarted_at,
    }
}

/// Every queue of the app is empty (read through a new connection: the app's own may have gone
/// down with a node).
async fn assert_queues_empty(app: &TestApp, urls: &str) {
    let conn = mailroom::broker::connect(&urls.parse().unwrap(), "cluster test")
        .await
        .unwrap();
    let t = &app.topology;
    let mut queues = vec![t.queue.clone(), t.dead.clone()];
    queues.extend(t.retry_delays.iter().map(|d| t.retry_queue(*d)));
    for queue in queues {
        let ch = conn.create_channel().await.unwrap();
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let q = ch
            .queue_declare(queue.as_str().into(), passive, FieldTable::default())
            .await
            .unwrap();
        assert_eq!(q.message_count(), 0, "{queue} empty");
    }
}

/// The node number of `rmqcN@localhost`.
fn node_number(name: &str) -> u8 {
    name.strip_prefix("rmqc")
        .and_then(|s| s.split('@').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("node {name:?}"))
}

/// The cluster's URLs, or `None` after saying why the test skips.
fn cluster_or_skip(test: &str) -> Option<String> {
    let urls = cluster_urls();
    if urls.is_none() {
        eprintln!(
            "SKIP {test}: MAILROOM_TEST_CLUSTER_URLS is not set (start the cluster with \
             scripts/cluster; scripts/test then sets it)"
        );
    }
    urls
}

#[tokio::test]
#[ignore = "disruptive: SIGKILLs a node of the scripts/cluster test cluster"]
async fn disruptive_cluster_work_queue_leader_killed_and_restarted_loses_and_stalls_nothing() {
    let Some(urls) = cluster_or_skip("disruptive_cluster_work_queue_leader_killed") else {
        return;
    };
    let first = urls.split(',').next().unwrap().to_string();
    let app = Arc::new(TestApp::spawn_on(first, &[]).await);
    let layout = quorum_layout(2).await;
    let (leader, members) = layout[&app.topology.queue].clone();
    assert_eq!(members, 3, "three replicas of the work queue: {layout:?}");
    assert_eq!(
        layout[&app.topology.dead].1, 3,
        "a quorum dead-letter queue: {layout:?}"
    );

    let outage = kill_node_under_load(&app, &urls, node_number(&leader)).await;
    eprintln!(
        "cluster: leader {leader} SIGKILLed for {OUTAGE:?} (restart took {:?}); {} jobs sent \
         while it was down; longest stall {:?}",
        outage.restart, outage.sent_in_outage, outage.stall
    );
    assert!(
        outage.sent_in_outage > 0,
        "work went on while {leader} was down"
    );
}

#[tokio::test]
#[ignore = "disruptive: SIGKILLs a node of the scripts/cluster test cluster"]
async fn disruptive_cluster_home_node_of_a_classic_dead_queue_killed_stops_nothing() {
    let Some(urls) = cluster_or_skip("disruptive_cluster_home_node_of_a_classic_dead_queue") else {
        return;
    };
    let nodes: Vec<&str> = urls.split(',').collect();
    let app = Arc::new(TestApp::spawn_on(nodes[0].to_string(), &[]).await);
    // An installation not yet migrated: <ns>.dead classic, its home node 2.
    let on_node_2 = lapin::Connection::connect(nodes[1], Default::default())
        .await
        .unwrap();
    let ch = on_node_2.create_channel().await.unwrap();
    let t = &app.topology;
    ch.queue_delete(t.dead.as_str().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(t.dead.as_str().into(), durable, FieldTable::default())
        .await
        .unwrap();
    ch.queue_bind(
        t.dead.as_str().into(),
        t.dlx.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    drop(on_node_2);

    // Node 2 first: every process must fail over, and redeclare without the dead queue.
    let order = [nodes[1], nodes[0], nodes[2]].join(",");
    let outage = kill_node_under_load(&app, &order, 2).await;
    eprintln!(
        "cluster: rmqc2 (home of the classic {}) SIGKILLed for {OUTAGE:?}; {} jobs sent while \
         it was down; longest stall {:?}",
        t.dead, outage.sent_in_outage, outage.stall
    );
    assert!(
        outage.sent_in_outage > 0,
        "work went on without the dead-letter queue"
    );
}
