//! [`under_load`]: a relay and two workers kept busy through a fault of the test cluster, then
//! the check that every job was sent once (a second copy only where a worker's log shows an
//! uncertain window, as the chaos soak explains them), nothing is left in any queue, and the
//! fault hit work in flight.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use mailroom_test_kit::smtp::Received;
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::nodes::app_queues;
use crate::helpers::*;
use crate::soak::checker::Key;
use crate::soak::checker::windows::per_job;
use crate::soak::observe::windows;

/// Jobs are committed one every [`EVERY`], at least [`MIN_JOBS`] and until the fault is over,
/// then [`TAIL`] more: the flow after recovery is checked too.
const EVERY: Duration = Duration::from_millis(50);
const MIN_JOBS: usize = 400;
const TAIL: usize = 40;
/// The fault starts once this many jobs were sent.
const SENT_BEFORE_FAULT: usize = 50;
/// The SMTP server of the cluster tests takes 0.2 s over each message, so that deliveries are
/// being sent when the fault begins.
pub const SLOW_SERVER: &[&str] = &["--data-delay", "0.2"];
/// How long the last jobs may take to arrive once the fault is over.
const DRAIN: Duration = Duration::from_secs(120);

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

/// The processes of a run: their pids (for the fault) and AMQP connection names.
pub struct Fleet {
    pub workers: [u32; 2],
}

impl Fleet {
    /// The names the workers give their consuming connections (`rabbitmqctl list_connections
    /// client_properties`).
    pub fn worker_names(&self) -> Vec<String> {
        self.workers
            .iter()
            .map(|pid| format!("mailroom worker (pid {pid})"))
            .collect()
    }
}

/// `mailroom ROLE ARGS` with JSON logs, the uncertain window's markers included, to `log`.
fn spawn_logged(role: &str, args: Vec<String>, log: &Path) -> Child {
    let log = std::fs::File::create(log).unwrap();
    Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .arg(role)
        .args(args)
        .env("MAILROOM_LOG_FORMAT", "json")
        .env("RUST_LOG", "info,mailroom::window=debug")
        .env_remove("DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start mailroom {role}: {e}"))
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
    /// Jobs committed and not yet sent when the fault began: the work it hit.
    pub in_flight_at_fault: usize,
    /// Broker sessions the workers saw end (each reconnected).
    pub sessions_ended: usize,
    /// Jobs the SMTP server accepted between the fault and the start of recovery.
    pub sent_while_down: usize,
    /// The longest gap between SMTP receipts from the fault until the last job was sent, and
    /// how long after the fault it began.
    pub stall: Duration,
    pub stall_after: Duration,
    /// From the fault to the start of recovery, and to the cluster whole again.
    pub down: Duration,
    pub until_whole: Duration,
    /// Jobs committed over the run; second copies, each explained by an uncertain window.
    pub jobs: usize,
    pub duplicates: Vec<String>,
}

/// Starts two workers and a relay on `urls`, commits jobs one every [`EVERY`]; once
/// [`SENT_BEFORE_FAULT`] are sent, runs `fault`, which returns when its recovery started and
/// completes once the cluster is whole. Then checks that every job was sent, a second time only
/// in an uncertain window, nothing is left unpublished, and every queue is empty once the
/// processes stopped.
pub async fn under_load<F, Fut>(app: &Arc<TestApp>, urls: &str, fault: F) -> Outage
where
    F: FnOnce(Fleet) -> Fut,
    Fut: Future<Output = Instant>,
{
    let logs = app.dir.path().join("cluster-logs");
    std::fs::create_dir_all(&logs).unwrap();
    let amqp = ["--amqp-url", urls];
    let mut workers = [1, 2].map(|i| {
        let log = logs.join(format!("worker-{i}.log"));
        spawn_logged("worker", app.worker_args(&amqp), &log)
    });
    let mut relay = spawn_logged("relay", app.relay_args(&amqp), &logs.join("relay.log"));
    let stop = Arc::new(AtomicBool::new(false));
    let fault_over = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicUsize::new(0));
    let sampler = sample_counts(app.clone(), stop.clone());
    let producer = {
        let (app, fault_over, committed) = (app.clone(), fault_over.clone(), committed.clone());
        tokio::spawn(async move {
            let mut tail = TAIL;
            while committed.load(Ordering::Relaxed) < MIN_JOBS || tail > 0 {
                let n = committed.load(Ordering::Relaxed);
                app.enqueue(&app.email_job(&format!("cluster-{n}")))
                    .await
                    .unwrap();
                committed.fetch_add(1, Ordering::Relaxed);
                if fault_over.load(Ordering::Relaxed) {
                    tail = tail.saturating_sub(1);
                }
                tokio::time::sleep(EVERY).await;
            }
        })
    };

    app.smtp.wait_for(SENT_BEFORE_FAULT).await;
    // The fault must hit work in flight: jobs committed and not yet sent.
    eventually("a job committed and not yet sent", || async {
        let in_flight = committed.load(Ordering::Relaxed) - distinct(&app.smtp.received());
        (in_flight > 0).then_some(())
    })
    .await;
    let fleet = Fleet {
        workers: workers.each_ref().map(|w| w.id().expect("worker running")),
    };
    let at = Instant::now();
    let received = app.smtp.received();
    let sent_at_fault = received.len();
    let in_flight_at_fault = committed.load(Ordering::Relaxed) - distinct(&received);
    let recovering = fault(fleet).await;
    let whole = Instant::now();
    fault_over.store(true, Ordering::Relaxed);

    producer.await.unwrap();
    let jobs = committed.load(Ordering::Relaxed);
    let ids: Vec<String> = (0..jobs)
        .map(|i| app.message_id(&format!("cluster-{i}"), "welcome"))
        .collect();
    let copies = all_received(app, &ids).await;
    // A copy of a job that was in flight during the fault may sit in a retry tier (its claim
    // was another delivery's) after every job was sent: the workers, still running, take it
    // back and settle it as a duplicate. Nothing may stay queued for good, dead letters
    // included.
    eventually_within(DRAIN, "every queue of the app empty", || async {
        queues_not_empty(app, urls).await.is_empty().then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.unwrap();
    let sent_by_recovery = samples
        .iter()
        .take_while(|(t, _)| *t <= recovering)
        .last()
        .map_or(sent_at_fault, |(_, n)| *n);
    for child in workers.iter_mut().chain([&mut relay]) {
        stop_process(child).await;
    }
    let duplicates = explain_duplicates(&logs, &ids, &copies);
    if !duplicates.is_empty() || std::env::var_os("MAILROOM_TEST_KEEP_LOGS").is_some() {
        eprintln!("cluster: the processes' logs: {}", keep(&logs).display());
    }
    assert_eq!(
        queues_not_empty(app, urls).await,
        vec![],
        "messages queued once the workers stopped"
    );
    assert_eq!(app.unpublished().await, 0);
    let (stall, stall_at) = longest_stall(&samples, at, jobs);
    Outage {
        in_flight_at_fault,
        sessions_ended: sessions_ended(&logs),
        sent_while_down: sent_by_recovery.saturating_sub(sent_at_fault),
        stall,
        stall_after: stall_at - at,
        down: recovering - at,
        until_whole: whole - at,
        jobs,
        duplicates,
    }
}

/// Distinct Message-IDs among `received`.
fn distinct(received: &[Received]) -> usize {
    let ids: BTreeSet<_> = received
        .iter()
        .filter_map(|r| r.message_id.as_ref())
        .collect();
    ids.len()
}

/// Waits (up to [`DRAIN`]) until every id of `ids` was received; returns the copies of each,
/// after checking that nothing else arrived.
async fn all_received(app: &TestApp, ids: &[String]) -> HashMap<String, usize> {
    let copies = eventually_within(DRAIN, "every job at the SMTP server", || async {
        let mut copies: HashMap<String, usize> = HashMap::new();
        for r in app.smtp.received() {
            *copies.entry(r.message_id.unwrap_or_default()).or_default() += 1;
        }
        ids.iter()
            .all(|id| copies.contains_key(id))
            .then_some(copies)
    })
    .await;
    let expected: BTreeSet<&String> = ids.iter().collect();
    let unexpected: Vec<_> = copies.keys().filter(|id| !expected.contains(id)).collect();
    assert!(unexpected.is_empty(), "unexpected emails: {unexpected:?}");
    copies
}

/// SIGTERM, and waits (bounded) for the process to exit after settling what it holds.
async fn stop_process(child: &mut Child) {
    terminate(child).await;
    tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("a mailroom process exits within 60 s of SIGTERM")
        .unwrap();
}

/// Every second copy of a job must be explained by an uncertain window of the workers' logs
/// (W1/W2, docs/GUARANTEES.md; the chaos soak's rule): one window per extra copy. Returns one
/// line per duplicate with its windows.
fn explain_duplicates(logs: &Path, ids: &[String], copies: &HashMap<String, usize>) -> Vec<String> {
    let windows = per_job(&windows(logs), &BTreeSet::new());
    let mut lines = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let n = copies[id];
        if n < 2 {
            continue;
        }
        let key = Key::new(&format!("cluster-{i}"), "welcome");
        let job = windows.get(&key).cloned().unwrap_or_default();
        let line = format!(
            "{key} ×{n}: explained by {:?}; other windows {:?}",
            job.excuses, job.others
        );
        if job.excuses.len() < n - 1 {
            panic!(
                "a duplicate outside the uncertain window: {line} (the processes' logs: {})",
                keep(logs).display()
            );
        }
        lines.push(line);
    }
    lines
}

/// Copies the processes' logs out of the test's temporary directory, which goes with the test.
fn keep(logs: &Path) -> PathBuf {
    let kept = std::env::temp_dir().join(format!("mailroom-cluster-logs-{}", std::process::id()));
    std::fs::create_dir_all(&kept).unwrap();
    for entry in std::fs::read_dir(logs).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, kept.join(path.file_name().unwrap())).unwrap();
    }
    kept
}

/// How many broker sessions the workers' logs say ended.
fn sessions_ended(logs: &Path) -> usize {
    [1, 2]
        .iter()
        .map(|i| {
            let log: PathBuf = logs.join(format!("worker-{i}.log"));
            let text = std::fs::read_to_string(log).unwrap_or_default();
            text.lines()
                .filter(|l| l.contains("broker session ended"))
                .count()
        })
        .sum()
}

/// The app's queues that hold messages, and how many (read through a new connection: the app's
/// own may have gone down with a node).
async fn queues_not_empty(app: &TestApp, urls: &str) -> Vec<(String, u32)> {
    let conn = mailroom::broker::connect(&urls.parse().unwrap(), "cluster test")
        .await
        .unwrap();
    let mut left = vec![];
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
        if q.message_count() > 0 {
            left.push((queue, q.message_count()));
        }
    }
    let _ = conn.close(0, "checked".into()).await;
    left
}

/// One line for the test's output: what the fault did to the flow.
pub fn report(fault: &str, o: &Outage) {
    eprintln!(
        "cluster: {fault}: {} jobs, {} in flight at the fault; {} worker sessions ended; down \
         {:?}, whole again after {:?}; {} sent while down; longest gap between SMTP receipts \
         {:?}, {:?} after the fault; {} duplicates (each in an uncertain window)",
        o.jobs,
        o.in_flight_at_fault,
        o.sessions_ended,
        o.down,
        o.until_whole,
        o.sent_while_down,
        o.stall,
        o.stall_after,
        o.duplicates.len()
    );
    for d in &o.duplicates {
        eprintln!("cluster:   duplicate {d}");
    }
}
