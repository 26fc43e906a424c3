//! Workers and relays of a test: in this process (stopped by a token, with their counters at
//! hand) or as real `mailroom` processes that a test can signal or kill.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use mailroom::cli::{Cli, Command};
use mailroom::render::LiveTemplates;
use mailroom::worker::Stats;
use mailroom_test_kit::waits::{PATIENCE, eventually};
use tokio::process::{Child, Command as Process};
use tokio_util::sync::CancellationToken;

use super::app::{TEST_RETRY_DELAYS, TestApp};
use super::fault_proxy::{Fault, FaultProxy};

impl TestApp {
    /// The worker's command line (after `mailroom worker`): test-sized defaults, with the flags
    /// named in `extra` replacing the defaults of the same name.
    pub fn worker_args(&self, extra: &[&str]) -> Vec<String> {
        with_overrides(self.default_worker_args(), extra)
    }

    fn default_worker_args(&self) -> Vec<String> {
        let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("templates");
        [
            "--database-url",
            &self.db_url,
            "--amqp-url",
            &self.amqp_url,
            "--namespace",
            &self.namespace,
            "--retry-delays",
            TEST_RETRY_DELAYS,
            "--smtp-url",
            &self.smtp.url(),
            "--from",
            "Mailroom Tests <noreply@mailroom.test>",
            "--templates",
            templates.to_str().unwrap(),
            // The shortest lease that lets claims go ahead of busy SMTP connections, as the
            // defaults do (worker::lease::reserved_ahead: a 2 s send twice plus 2 s), plus 1 s
            // for claims slowed by a loaded machine.
            "--lease",
            "7s",
            "--smtp-timeout",
            "2s",
            "--concurrency",
            "8",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Starts a worker in this process; `extra` args override the defaults.
    pub fn start_worker(&self, extra: &[&str]) -> RunningWorker {
        let mut argv = vec!["mailroom".to_string(), "worker".to_string()];
        argv.extend(self.worker_args(extra));
        let Command::Worker(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        let worker = args.build().unwrap();
        Running::spawn(worker.stats(), |stop| tokio::spawn(worker.run(stop)))
    }

    /// Starts a worker in this process that follows its template directory like `mailroom
    /// worker` (polling every `--template-reload-interval`); returns its live template set too.
    pub fn start_live_worker(&self, extra: &[&str]) -> (RunningWorker, Arc<LiveTemplates>) {
        let mut argv = vec!["mailroom".to_string(), "worker".to_string()];
        argv.extend(self.worker_args(extra));
        let Command::Worker(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        let worker = args.build().unwrap();
        let live = worker.templates();
        let (watched, every) = (live.clone(), args.template_reload_interval);
        let running = Running::spawn(worker.stats(), |stop| {
            tokio::spawn(watched.watch(every, stop.clone()));
            tokio::spawn(worker.run(stop))
        });
        (running, live)
    }

    /// Starts the dead-letter ingester of a worker process in this process: a consumer of this
    /// app's `<ns>.dead` that stores each letter in the table.
    pub fn start_ingester(&self) -> RunningIngester {
        let ingester = mailroom::dlq::ingest::Ingester::new(
            self.amqp_url.parse().unwrap(),
            self.topology.clone(),
            self.db.clone(),
            Duration::from_secs(3600),
        );
        Running::spawn(Arc::new(()), |stop| tokio::spawn(ingester.run(stop)))
    }

    /// Starts `mailroom worker` as a real process, with `env` added (e.g. failpoints).
    pub fn spawn_worker_process(&self, extra: &[&str], env: &[(&str, &str)]) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("worker.log"))
            .unwrap();
        let stderr = test_log_or(Stdio::from(log));
        Process::new(env!("CARGO_BIN_EXE_mailroom"))
            .arg("worker")
            .args(self.worker_args(extra))
            .envs(env.iter().copied())
            .env_remove("DATABASE_URL")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("start mailroom worker")
    }

    /// Starts `mailroom run` (relay, worker and HTTP API in one process) as a real process, with
    /// the worker's arguments, `--relay-poll 1s` and `extra`.
    pub fn spawn_run_process(&self, extra: &[&str]) -> Child {
        let mut extra = extra.to_vec();
        extra.extend(["--relay-poll", "1s"]);
        Process::new(env!("CARGO_BIN_EXE_mailroom"))
            .arg("run")
            .args(self.worker_args(&extra))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(test_log_or(Stdio::null()))
            .kill_on_drop(true)
            .spawn()
            .expect("start mailroom run")
    }

    /// Starts `mailroom serve` as a real process on `http_addr`, with the test's database,
    /// broker and namespace, and `extra`.
    pub fn spawn_serve_process(&self, http_addr: &str, extra: &[&str]) -> Child {
        self.spawn_serve_process_on(&self.amqp_url, http_addr, extra)
    }

    /// [`TestApp::spawn_serve_process`] with the broker at `amqp_url` (one that is down, say).
    /// A `--database-url` in `extra` replaces the test's database.
    pub fn spawn_serve_process_on(&self, amqp_url: &str, http_addr: &str, extra: &[&str]) -> Child {
        let mut extra = extra.to_vec();
        let db_url = match extra.iter().position(|a| *a == "--database-url") {
            Some(at) => extra.drain(at..at + 2).nth(1).unwrap(),
            None => &self.db_url,
        };
        Process::new(env!("CARGO_BIN_EXE_mailroom"))
            .args(["serve", "--http-addr", http_addr, "--database-url", db_url])
            .args(["--amqp-url", amqp_url, "--namespace", &self.namespace])
            .args(["--retry-delays", TEST_RETRY_DELAYS])
            .args(extra)
            .env_remove("DATABASE_URL")
            .env_remove("MAILROOM_API_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(test_log_or(Stdio::null()))
            .kill_on_drop(true)
            .spawn()
            .expect("start mailroom serve")
    }

    /// The relay's command line (after `mailroom relay`).
    pub fn relay_args(&self, extra: &[&str]) -> Vec<String> {
        let args: Vec<String> = [
            "--database-url",
            &self.db_url,
            "--amqp-url",
            &self.amqp_url,
            "--namespace",
            &self.namespace,
            "--retry-delays",
            TEST_RETRY_DELAYS,
            "--relay-poll",
            "1s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        with_overrides(args, extra)
    }

    /// Starts a relay in this process.
    pub fn start_relay(&self, extra: &[&str]) -> RunningRelay {
        let mut argv = vec!["mailroom".to_string(), "relay".to_string()];
        argv.extend(self.relay_args(extra));
        let Command::Relay(args) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!()
        };
        let relay = args.build().unwrap();
        Running::spawn(relay.stats(), |stop| tokio::spawn(relay.run(stop)))
    }

    /// Starts `mailroom relay` as a real process, logging to `relay.log` in the test's
    /// directory.
    pub fn spawn_relay_process(&self, extra: &[&str], env: &[(&str, &str)]) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("relay.log"))
            .unwrap();
        Process::new(env!("CARGO_BIN_EXE_mailroom"))
            .arg("relay")
            .args(self.relay_args(extra))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(test_log_or(Stdio::from(log)))
            .kill_on_drop(true)
            .spawn()
            .expect("start mailroom relay")
    }

    /// Runs a worker and a relay until `(job_id, kind)` is recorded `sent`, then stops both:
    /// the outbox path end to end, for tests that check what the SMTP server got afterwards.
    pub async fn deliver_through_outbox(&self, job_id: &str, kind: &str) {
        let worker = self.start_worker(&[]);
        let relay = self.start_relay(&[]);
        self.wait_for_row(job_id, kind, "row sent", |n| n.status.as_str() == "sent")
            .await;
        relay.stop().await;
        worker.stop().await;
    }

    /// After the workers of a test stopped: whatever is still ready in the work queue must be a
    /// copy of a job already settled (a redelivery after a crash, or a retry copy still on its
    /// way back from a tier). A fresh worker drains the queue until it is empty, and may not
    /// send anything new.
    pub async fn drain_duplicates(&self) {
        if self.ready_messages().await == 0 {
            return;
        }
        let before = self.smtp.received().len();
        let worker = self.start_worker(&[]);
        eventually("leftover copies drained", || async {
            // Empty twice in a row, a tier's delay apart: nothing is still coming back.
            if self.ready_messages().await > 0 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1500)).await;
            (self.ready_messages().await == 0).then_some(())
        })
        .await;
        let snap = worker.stats.snapshot();
        worker.stop().await;
        eprintln!(
            "drained {} leftover copies ({} duplicates)",
            snap.received, snap.duplicates
        );
        assert_eq!(
            self.smtp.received().len(),
            before,
            "a leftover copy was sent again"
        );
    }
}

/// A worker or relay running inside the test process, stopped when dropped.
pub struct Running<S> {
    pub stats: Arc<S>,
    pub shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub type RunningWorker = Running<Stats>;
pub type RunningRelay = Running<mailroom::relay::RelayStats>;
pub type RunningIngester = Running<()>;

impl<S> Running<S> {
    fn spawn(
        stats: Arc<S>,
        run: impl FnOnce(CancellationToken) -> tokio::task::JoinHandle<anyhow::Result<()>>,
    ) -> Running<S> {
        let shutdown = CancellationToken::new();
        let task = Some(run(shutdown.clone()));
        Running {
            stats,
            shutdown,
            task,
        }
    }

    /// Stops it gracefully and waits.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

impl<S> Drop for Running<S> {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// `defaults` with each `--flag value` pair of `extra` replacing the pair of the same flag.
fn with_overrides(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    for pair in extra.chunks(2) {
        if let Some(at) = args.iter().position(|a| a == pair[0]) {
            args.drain(at..at + 2);
        }
        args.extend(pair.iter().map(|s| s.to_string()));
    }
    args
}

/// Sends SIGTERM to `child` and waits up to [`PATIENCE`] for it to exit 0; `expected` says
/// why it must, and a test that waits in vain shows the process's `log` (a file in the test's
/// directory). Returns that log, as the process left it.
pub async fn terminate_expecting_exit_0(
    app: &TestApp,
    child: &mut Child,
    log: &str,
    expected: &str,
) -> String {
    terminate(child).await;
    let Ok(status) = tokio::time::timeout(PATIENCE, child.wait()).await else {
        let log = app.process_log(log);
        panic!("still running {PATIENCE:?} after SIGTERM; expected: {expected}\n{log}");
    };
    let status = status.unwrap();
    assert_eq!(status.code(), Some(0), "{expected}");
    app.process_log(log)
}

impl TestApp {
    /// The log a process spawned by this test wrote to `name` in the test's directory
    /// (`worker.log`, `relay.log`), empty if none.
    pub fn process_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default()
    }

    /// Whether the process logging to `name` is parked at a failpoint armed `pause`.
    pub fn paused_at_failpoint(&self, name: &str) -> bool {
        self.process_log(name).contains("failpoint: pausing")
    }
}

/// Sends SIGTERM to a child process.
pub async fn terminate(child: &Child) {
    let pid = child.id().expect("process still running").to_string();
    let status = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(status.success());
}

/// Relay options that an idle outbox does not move: probes from 200 ms after activity,
/// doubling, up to an hour once idle. A relay started with them must be woken by its source.
pub const RELAY_NO_PROBES: [&str; 6] = [
    "--relay-poll-min",
    "200ms",
    "--relay-poll",
    "1h",
    "--relay-poll-max",
    "1h",
];

/// A relay that pauses its stream from 100 outbox commits a second (well below what 16
/// producers commit on any machine the suite runs on) and probes every 10 ms meanwhile; it
/// does not probe an idle outbox, so its stream must wake it.
pub const RELAY_PAUSES_AT_100: [&str; 8] = [
    "--relay-poll-min",
    "10ms",
    "--relay-poll",
    "1h",
    "--relay-poll-max",
    "1h",
    "--relay-stream-pause-above",
    "100",
];

impl TestApp {
    /// A relay started with [`RELAY_PAUSES_AT_100`], its broker connection through the proxy
    /// it is returned with (for [`RunningRelay::pauses_under_a_burst_and_reopens`]).
    pub async fn start_relay_pausing_at_100(&self) -> (RunningRelay, FaultProxy) {
        let broker = FaultProxy::in_front_of(&self.amqp_url).await;
        let url = broker.url_through(&self.amqp_url);
        let mut args = RELAY_PAUSES_AT_100.to_vec();
        args.extend(["--amqp-url", &url]);
        (self.start_relay(&args), broker)
    }
}

impl RunningRelay {
    pub fn published(&self) -> u64 {
        self.count(|s| &s.published)
    }

    /// One of the relay's counters.
    pub fn count(
        &self,
        pick: fn(&mailroom::relay::RelayStats) -> &std::sync::atomic::AtomicU64,
    ) -> u64 {
        pick(&self.stats).load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Waits for the relay's first scan (its wake-up source is open by then).
    pub async fn wait_started(&self) {
        eventually("the relay's first scan", || async {
            (self.count(|s| &s.scans) >= 1).then_some(())
        })
        .await;
    }

    /// Waits for `n` wake-ups by the relay's source (`source` names it in a timeout).
    pub async fn wait_woken(&self, n: u64, source: &str) {
        eventually(&format!("{n} {source} wake-ups"), || async {
            (self.count(|s| &s.woken) >= n).then_some(())
        })
        .await;
    }

    pub async fn wait_published(&self, n: u64) {
        eventually(&format!("{n} rows published"), || async {
            (self.published() >= n).then_some(())
        })
        .await;
    }

    /// Whether the relay's stream is paused (the gauge `mailroom_relay_wakeup_paused`).
    pub fn paused(&self) -> bool {
        self.stats
            .wakeup_paused
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The stream's pause, end to end, for a relay started with [`RELAY_PAUSES_AT_100`] and its
    /// broker connection through `broker`: 16 producers commit single outbox rows as fast as
    /// they can until the relay has paused its stream and `streams` (the server's count of
    /// this test's streams: slots, dump threads) says the server no longer serves it. The
    /// broker is cut off meanwhile, so the relay sits in its first batch, waiting for
    /// confirms, the whole time: the gauge must say paused without the relay's loop coming
    /// round (a relay draining a backlog never does). Every row is then published; the quiet
    /// outbox makes the relay open one stream again; of two rows committed after that, the
    /// second can only have been seen through the new stream (the first may be the rescan's).
    /// `source` names the stream in a failure.
    pub async fn pauses_under_a_burst_and_reopens<F, Fut>(
        &self,
        app: &TestApp,
        broker: &FaultProxy,
        source: &str,
        streams: F,
    ) where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = i64>,
    {
        assert!(!self.paused(), "paused before the burst");
        assert_eq!(
            streams().await,
            1,
            "the relay's {source} stream before the burst"
        );
        let published = self.published();
        broker.set(Fault::Blackhole);
        let stop = CancellationToken::new();
        let producers: Vec<_> = (0..16)
            .map(|p| {
                let (db, stop) = (app.db.clone(), stop.clone());
                let job = |i: u32| app.email_job(&format!("burst-{p}-{i}"));
                let jobs: Vec<_> = (0..5_000).map(job).collect();
                tokio::spawn(async move {
                    let mut committed = 0u64;
                    for job in jobs {
                        if stop.is_cancelled() {
                            break;
                        }
                        db.enqueue(&job).await.unwrap();
                        committed += 1;
                    }
                    committed
                })
            })
            .collect();
        eventually(
            &format!("the relay paused its {source} stream and the server dropped it"),
            || async { (self.paused() && streams().await == 0).then_some(()) },
        )
        .await;
        assert_eq!(
            self.published(),
            published,
            "the relay was held in its batch by the broker the whole time"
        );
        broker.set(Fault::Pass);
        stop.cancel();
        let mut committed = 0;
        for producer in producers {
            committed += producer.await.unwrap();
        }
        assert!(committed >= 100, "{committed} rows committed in the burst");
        self.wait_published(committed).await;

        eventually(
            &format!("the quiet outbox made the relay open its {source} stream again"),
            || async { (!self.paused() && streams().await == 1).then_some(()) },
        )
        .await;
        for (i, name) in ["after-the-reopen", "woken-by-the-new-stream"]
            .iter()
            .enumerate()
        {
            let woken = self.count(|s| &s.woken);
            app.enqueue(&app.email_job(name)).await.unwrap();
            self.wait_woken(woken + 1, source).await;
            self.wait_published(committed + i as u64 + 1).await;
        }
    }
}

/// A spawned process's stderr: this test's own with `TEST_LOG` set, else `otherwise`.
pub(super) fn test_log_or(otherwise: Stdio) -> Stdio {
    if std::env::var_os("TEST_LOG").is_some() {
        Stdio::inherit()
    } else {
        otherwise
    }
}
