//! What the cluster tests share: driving `scripts/cluster` and `rabbitmqctl` on its nodes, and
//! [`under_load`], which keeps a relay and two workers busy through a fault and then checks
//! that every job was sent once and nothing is left in any queue.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use tokio::process::Command;
use tokio::time::Instant;

use crate::helpers::*;

/// Jobs are committed one every [`EVERY`], at least [`MIN_JOBS`] and until the fault is over,
/// then [`TAIL`] more: the flow after recovery is checked too.
const EVERY: Duration = Duration::from_millis(50);
const MIN_JOBS: usize = 400;
const TAIL: usize = 40;
/// The fault starts once this many jobs were sent.
const SENT_BEFORE_FAULT: usize = 50;

/// The cluster's URLs, or `None` after saying why the test skips.
pub fn cluster_or_skip(test: &str) -> Option<String> {
    let urls = std::env::var("MAILROOM_TEST_CLUSTER_URLS").ok();
    if urls.is_none() {
        eprintln!(
            "SKIP {test}: MAILROOM_TEST_CLUSTER_URLS is not set (start the cluster with \
             scripts/cluster; scripts/test then sets it)"
        );
    }
    urls
}

/// `scripts/cluster ARGS`: its stdout, or a panic with its stderr.
pub async fn cluster_script(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster");
    let out = Command::new(script).args(args).output().await.unwrap();
    assert!(
        out.status.success(),
        "scripts/cluster {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `rabbitmqctl -q -n rmqcN@localhost ARGS`: its stdout, or a panic with its stderr.
pub async fn ctl(node: u8, args: &[&str]) -> String {
    let out = Command::new("rabbitmqctl")
        .args(["-q", "-n", &format!("rmqc{node}@localhost")])
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "rabbitmqctl on rmqc{node} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// A quorum queue's leader, and how many of its members there are and how many are online.
#[derive(Clone, Debug)]
pub struct Replicas {
    pub leader: String,
    pub members: usize,
    pub online: usize,
}

/// `list_queues name leader members online` on node `via`: queue → its replicas.
pub async fn quorum_layout(via: u8) -> HashMap<String, Replicas> {
    let out = ctl(via, &["list_queues", "name", "leader", "members", "online"]).await;
    out.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            let [name, leader, members, online] = cols[..] else {
                return None;
            };
            let replicas = Replicas {
                leader: leader.to_string(),
                members: members.matches("rmqc").count(),
                online: online.matches("rmqc").count(),
            };
            Some((name.to_string(), replicas))
        })
        .collect()
}

/// The queues of the app's topology: work, dead letters, retry tiers.
pub fn app_queues(app: &TestApp) -> Vec<String> {
    let t = &app.topology;
    let mut queues = vec![t.queue.clone(), t.dead.clone()];
    queues.extend(t.retry_delays.iter().map(|d| t.retry_queue(*d)));
    queues
}

/// Waits (bounded) until every queue of the app has all three members online, read on `via`.
pub async fn await_replicas(app: &TestApp, via: u8) {
    let queues = app_queues(app);
    eventually_within(
        Duration::from_secs(120),
        "every quorum queue with three members online",
        || async {
            let layout = quorum_layout(via).await;
            queues
                .iter()
                .all(|q| layout.get(q).is_some_and(|r| r.online == 3))
                .then_some(())
        },
    )
    .await;
}

/// The node number of `rmqcN@localhost`.
pub fn node_number(name: &str) -> u8 {
    name.strip_prefix("rmqc")
        .and_then(|s| s.split('@').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("node {name:?}"))
}

/// The URL list with node `first` first (every process connects to it while it is up), each
/// URL with `query` appended (e.g. `heartbeat=5`).
pub fn urls_from(urls: &str, first: u8, query: &str) -> String {
    let mut list: Vec<&str> = urls.split(',').collect();
    list.rotate_left(usize::from(first - 1));
    let sep = |u: &str| if u.contains('?') { '&' } else { '?' };
    list.iter()
        .map(|u| match query {
            "" => u.to_string(),
            q => format!("{u}{}{q}", sep(u)),
        })
        .collect::<Vec<_>>()
        .join(",")
}

pub async fn signal(pid: &str, sig: &str) {
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

/// The longest time after `from` during which the count did not grow while jobs were waiting
/// (the count below `total`): the longest gap between SMTP receipts, to 100 ms, and when it
/// began.
fn longest_stall(samples: &[(Instant, usize)], from: Instant, total: usize) -> (Duration, Instant) {
    let mut longest = (Duration::ZERO, from);
    let mut since: Option<(Instant, usize)> = None;
    for &(at, count) in samples.iter().filter(|(at, _)| *at >= from) {
        match since {
            Some((start, n)) if n == count && count < total => {
                if at - start > longest.0 {
                    longest = (at - start, start);
                }
            }
            _ => since = Some((at, count)),
        }
    }
    longest
}

/// What a fault did to the flow of jobs.
#[derive(Debug)]
pub struct Outage {
    /// Jobs the SMTP server accepted between the fault and the start of recovery.
    pub sent_while_down: usize,
    /// The longest gap between SMTP receipts from the fault until the last job was sent, and
    /// how long after the fault it began.
    pub stall: Duration,
    pub stall_after: Duration,
    /// From the fault to the start of recovery, and to the cluster whole again.
    pub down: Duration,
    pub until_whole: Duration,
    /// Jobs committed over the run.
    pub jobs: usize,
}

/// Starts two workers and a relay on `urls` (pids of the workers to `fault`), commits jobs one
/// every [`EVERY`]; once [`SENT_BEFORE_FAULT`] are sent, runs `fault`, which returns when its
/// recovery started and completes once the cluster is whole. Then checks every job was sent
/// once, nothing is left unpublished, and every queue is empty once the processes stopped.
pub async fn under_load<F, Fut>(app: &Arc<TestApp>, urls: &str, fault: F) -> Outage
where
    F: FnOnce([u32; 2]) -> Fut,
    Fut: Future<Output = Instant>,
{
    let amqp = ["--amqp-url", urls];
    let workers = [
        app.spawn_worker_process(&amqp, &[]),
        app.spawn_worker_process(&amqp, &[]),
    ];
    let relay = app.spawn_relay_process(&amqp, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let fault_over = Arc::new(AtomicBool::new(false));
    let sampler = sample_counts(app.clone(), stop.clone());
    let producer = {
        let (app, fault_over) = (app.clone(), fault_over.clone());
        tokio::spawn(async move {
            let mut n = 0;
            let mut tail = TAIL;
            while n < MIN_JOBS || tail > 0 {
                app.enqueue(&app.email_job(&format!("cluster-{n}")))
                    .await
                    .unwrap();
                n += 1;
                if fault_over.load(Ordering::Relaxed) {
                    tail = tail.saturating_sub(1);
                }
                tokio::time::sleep(EVERY).await;
            }
            n
        })
    };

    app.smtp.wait_for(SENT_BEFORE_FAULT).await;
    let pids = workers.each_ref().map(|w| w.id().expect("worker running"));
    let (at, sent_at_fault) = (Instant::now(), app.smtp.received().len());
    let recovering = fault(pids).await;
    let whole = Instant::now();
    fault_over.store(true, Ordering::Relaxed);

    let jobs = producer.await.unwrap();
    let got = app
        .smtp
        .wait_for_within(jobs, Duration::from_secs(120))
        .await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    let sent_by_recovery = samples
        .iter()
        .take_while(|(t, _)| *t <= recovering)
        .last()
        .map_or(sent_at_fault, |(_, n)| *n);
    for i in 0..jobs {
        let id = app.message_id(&format!("cluster-{i}"), "welcome");
        assert_eq!(app.smtp.count(&id), 1, "cluster-{i} sent once");
    }
    assert_eq!(got.len(), jobs, "nothing unexpected");
    for worker in &workers {
        terminate(worker).await;
    }
    terminate(&relay).await;
    assert_queues_empty(app, urls).await;
    assert_eq!(app.unpublished().await, 0);
    let (stall, stall_at) = longest_stall(&samples, at, jobs);
    Outage {
        sent_while_down: sent_by_recovery - sent_at_fault,
        stall,
        stall_after: stall_at - at,
        down: recovering - at,
        until_whole: whole - at,
        jobs,
    }
}

/// Every queue of the app is empty (read through a new connection: the app's own may have gone
/// down with a node).
async fn assert_queues_empty(app: &TestApp, urls: &str) {
    let conn = mailroom::broker::connect(&urls.parse().unwrap(), "cluster test")
        .await
        .unwrap();
    for queue in app_queues(app) {
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

/// One line for the test's output: what the fault did to the flow.
pub fn report(fault: &str, o: &Outage) {
    eprintln!(
        "cluster: {fault}: {} jobs; down {:?}, whole again after {:?}; {} sent while down; \
         longest gap between SMTP receipts {:?}, {:?} after the fault",
        o.jobs, o.down, o.until_whole, o.sent_while_down, o.stall, o.stall_after
    );
}
