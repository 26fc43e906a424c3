//! The soak's processes and its nemesis: 3 `mailroom worker` and 2 `mailroom relay` processes,
//! each incarnation logging JSON to a file of its own, and a seeded schedule of faults.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use mailroom_test_kit::vhost::rabbitmqctl;

use crate::helpers::{TestApp, Vhost};

/// Worker flags of the soak: a lease well above the SMTP timeout on a loaded machine, and
/// enough attempts that nemesis-made transient failures never exhaust a good job.
pub const WORKER_ARGS: &[&str] = &[
    "--lease",
    "6s",
    "--smtp-timeout",
    "2s",
    "--max-attempts",
    "30",
    "--concurrency",
    "8",
    "--prefetch",
    "16",
];

/// Worker slot 2 when the nemesis may starve SMTP (`starve-smtp`): one SMTP session for 16
/// deliveries at once, and a lease a wait for that session easily outlives (a stalled server
/// takes 1.5 s per message, so the 16th delivery waits about 22 s). The other two workers keep
/// [`WORKER_ARGS`], so the soak's throughput does not hang on one session. A claim taken
/// before that wait (issue 12, finding 1) expires; a copy of the job then takes it over in
/// another worker, and both send: an unexplained duplicate.
pub const STARVED_WORKER_ARGS: &[&str] = &[
    "--lease",
    "5s",
    "--smtp-timeout",
    "3s",
    "--smtp-connections",
    "1",
    "--max-attempts",
    "30",
    "--concurrency",
    "16",
    "--prefetch",
    "32",
];

/// The SMTP server's wait per message while `starve-smtp` holds (issue 12's reproduction):
/// within every worker's SMTP timeout, so waiting is what it tests, not timeouts. (On a loaded
/// machine a few sends of the 2 s workers still time out: uncertain sends, which the checker
/// explains as W1 by their own log line, never by the wait.)
const STARVE_STALL: Duration = Duration::from_millis(1500);
/// Copies published at each nemesis tick while SMTP is starved: of up to this many jobs whose
/// claim is held (a worker may be waiting for a session on it), and of this many newest rows.
const STARVE_COPIES: u32 = 30;

/// The soak's workers' shutdown grace (mailroom's default).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// How long a process may take to exit after SIGTERM: what mailroom bounds a worker's stop by
/// (its grace, then its bounded goodbyes; a relay's bound is shorter), and a few seconds for the
/// process's own exit on this loaded machine. Derived, so a bound that grows in mailroom cannot
/// make the soak call a process hung that kept its promise.
const STOP_PATIENCE: Duration = SHUTDOWN_GRACE
    .saturating_add(mailroom::worker::STOP_BEYOND_GRACE)
    .saturating_add(Duration::from_secs(5));
const _: () = assert!(mailroom::relay::STOP_PATIENCE.as_millis() < STOP_PATIENCE.as_millis());

/// splitmix64: tiny, seedable, good enough to pick faults.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform between `lo` and `hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// A fault the nemesis can inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    KillWorker,
    KillRelay,
    CloseConnections,
    StallSmtp,
    /// Slow SMTP (seconds per message) while copies of recent jobs are published: the starved
    /// worker ([`STARVED_WORKER_ARGS`]) queues for its one session.
    StarveSmtp,
    RestartBroker,
}

impl Op {
    /// Every op but the broker restart, which disturbs every other test on the node.
    pub const DEFAULT: [Op; 5] = [
        Op::KillWorker,
        Op::KillRelay,
        Op::CloseConnections,
        Op::StallSmtp,
        Op::StarveSmtp,
    ];

    /// `MAILROOM_SOAK_OPS` spelling, e.g. `kill-worker,stall-smtp`.
    pub fn parse(name: &str) -> Op {
        match name.trim() {
            "kill-worker" => Op::KillWorker,
            "kill-relay" => Op::KillRelay,
            "close-connections" => Op::CloseConnections,
            "stall-smtp" => Op::StallSmtp,
            "starve-smtp" => Op::StarveSmtp,
            "restart-broker" => Op::RestartBroker,
            other => panic!(
                "MAILROOM_SOAK_OPS: unknown op {other:?} (kill-worker, kill-relay, close-connections, stall-smtp, starve-smtp, restart-broker)"
            ),
        }
    }

    /// Relative frequency: kills most often, a broker restart rarely.
    fn weight(self) -> u64 {
        match self {
            Op::KillWorker => 4,
            Op::KillRelay | Op::CloseConnections | Op::StallSmtp | Op::StarveSmtp => 2,
            Op::RestartBroker => 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Worker,
    Relay,
}

/// One process slot: restarted with a new incarnation after each kill.
struct Slot {
    role: Role,
    index: usize,
    generation: u32,
    /// Runs with [`STARVED_WORKER_ARGS`].
    starved: bool,
    child: Option<Child>,
    back_at: Option<Instant>,
}

impl Slot {
    fn name(&self) -> String {
        let role = match self.role {
            Role::Worker => "worker",
            Role::Relay => "relay",
        };
        format!("{role}-{}.{}", self.index, self.generation)
    }
}

/// The running processes, the nemesis' history and the names of the processes it killed.
pub struct Cluster<'a> {
    app: &'a TestApp,
    pub logs: PathBuf,
    pub stall_file: PathBuf,
    slots: Vec<Slot>,
    started: Instant,
    pub history: Vec<String>,
    pub killed: BTreeSet<String>,
    stall_until: Option<Instant>,
    /// While SMTP is starved: copies of new jobs are published at each tick.
    copying: bool,
}

impl<'a> Cluster<'a> {
    /// Starts every process; worker slot 2 starved when `ops` may starve SMTP.
    pub fn start(app: &'a TestApp, logs: &Path, stall_file: &Path, ops: &[Op]) -> Cluster<'a> {
        let starve = ops.contains(&Op::StarveSmtp);
        let mut slots = Vec::new();
        for index in 0..3 {
            slots.push((Role::Worker, index));
        }
        for index in 0..2 {
            slots.push((Role::Relay, index));
        }
        let mut cluster = Cluster {
            app,
            logs: logs.to_path_buf(),
            stall_file: stall_file.to_path_buf(),
            slots: slots
                .into_iter()
                .map(|(role, index)| Slot {
                    role,
                    index,
                    generation: 0,
                    starved: starve && role == Role::Worker && index == 2,
                    child: None,
                    back_at: None,
                })
                .collect(),
            started: Instant::now(),
            history: Vec::new(),
            killed: BTreeSet::new(),
            stall_until: None,
            copying: false,
        };
        for i in 0..cluster.slots.len() {
            cluster.spawn(i);
        }
        cluster
    }

    fn note(&mut self, what: String) {
        let line = format!("{:>8.3}s  {what}", self.started.elapsed().as_secs_f64());
        println!("soak nemesis: {line}");
        self.history.push(line);
    }

    fn spawn(&mut self, i: usize) {
        let slot = &mut self.slots[i];
        slot.generation += 1;
        slot.back_at = None;
        let name = slot.name();
        let log = std::fs::File::create(self.logs.join(format!("{name}.log"))).unwrap();
        let grace = format!("{}s", SHUTDOWN_GRACE.as_secs());
        let worker = |flags: &[&str]| {
            let flags = [flags, &["--shutdown-grace", &grace]].concat();
            ("worker", self.app.worker_args(&flags))
        };
        let (command, args) = match slot.role {
            Role::Worker if slot.starved => worker(STARVED_WORKER_ARGS),
            Role::Worker => worker(WORKER_ARGS),
            Role::Relay => ("relay", self.app.relay_args(&[])),
        };
        let child = Command::new(env!("CARGO_BIN_EXE_mailroom"))
            .arg(command)
            .args(args)
            .env("MAILROOM_LOG_FORMAT", "json")
            // The uncertain window's markers are DEBUG lines of their own target.
            .env("RUST_LOG", "info,mailroom::window=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("start a mailroom process");
        slot.child = Some(child);
    }

    /// SIGKILLs slot `i`; it comes back after `down`.
    async fn kill(&mut self, i: usize, down: Duration) {
        let Some(mut child) = self.slots[i].child.take() else {
            return;
        };
        child.kill().await.unwrap();
        let name = self.slots[i].name();
        self.slots[i].back_at = Some(Instant::now() + down);
        self.killed.insert(name.clone());
        self.note(format!("SIGKILL {name}, back in {down:?}"));
    }

    /// Brings back every slot whose downtime is over (all of them if `all`).
    fn revive(&mut self, all: bool) {
        for i in 0..self.slots.len() {
            let due = self.slots[i]
                .back_at
                .is_some_and(|t| all || Instant::now() >= t);
            if due {
                self.spawn(i);
                let name = self.slots[i].name();
                self.note(format!("start {name}"));
            }
        }
    }

    fn set_stall(&mut self, stall: Option<(Duration, Duration)>) {
        match stall {
            Some((delay, period)) => {
                std::fs::write(&self.stall_file, format!("{}", delay.as_secs_f64())).unwrap();
                self.stall_until = Some(Instant::now() + period);
                self.note(format!("SMTP stalls {delay:?} per message for {period:?}"));
            }
            None => {
                let _ = std::fs::remove_file(&self.stall_file);
                self.stall_until = None;
                self.copying = false;
                self.note("SMTP stall ends".into());
            }
        }
    }

    /// Runs the nemesis until `until`: every 0.5–2.5 s one of `ops`, chosen by `rng`.
    pub async fn nemesis(&mut self, rng: &mut Rng, vhost: &Vhost, until: Instant, ops: &[Op]) {
        while Instant::now() < until {
            tokio::time::sleep(rng.millis(500, 2500)).await;
            self.revive(false);
            if self.stall_until.is_some_and(|t| Instant::now() >= t) {
                self.set_stall(None);
            }
            if self.copying {
                self.publish_copies().await;
            }
            let weights: u64 = ops.iter().map(|op| op.weight()).sum();
            let mut pick = rng.below(weights.max(1));
            let Some(op) = ops.iter().find(|op| {
                let hit = pick < op.weight();
                pick = pick.saturating_sub(op.weight());
                hit
            }) else {
                continue;
            };
            match op {
                Op::KillWorker => self.kill(rng.below(3) as usize, rng.millis(0, 2000)).await,
                Op::KillRelay => {
                    self.kill(3 + rng.below(2) as usize, rng.millis(0, 2000))
                        .await
                }
                Op::CloseConnections => {
                    self.note("close_all_connections".into());
                    vhost.close_all_connections().await;
                }
                Op::StallSmtp if self.stall_until.is_none() => {
                    let delay = rng.millis(500, 4000);
                    self.set_stall(Some((delay, rng.millis(2000, 8000))));
                }
                Op::StarveSmtp if self.stall_until.is_none() => {
                    // Long enough for the starved worker's queue to outlive its lease,
                    // short enough that the backlog drains within the soak's time.
                    self.set_stall(Some((STARVE_STALL, rng.millis(5000, 9000))));
                    self.copying = true;
                    self.publish_copies().await;
                }
                Op::StallSmtp | Op::StarveSmtp => {}
                Op::RestartBroker => self.restart_broker(rng.millis(1000, 5000)).await,
            }
        }
    }

    /// Publishes a copy of each of the newest outbox rows.
    async fn publish_copies(&mut self) {
        let n = super::copies::publish(self.app, STARVE_COPIES).await;
        self.note(format!("published {n} copies of claimed and new jobs"));
    }

    /// `rabbitmqctl stop_app`, a pause, `start_app`: restarts the whole broker node (every
    /// vhost), which is why only the serial CI step switches it on.
    async fn restart_broker(&mut self, down: Duration) {
        self.note(format!("broker stop_app for {down:?}"));
        rabbitmqctl(&["stop_app"]).await;
        tokio::time::sleep(down).await;
        rabbitmqctl(&["start_app"]).await;
        rabbitmqctl(&["await_startup"]).await;
        self.note("broker start_app done".into());
    }

    /// Ends every fault and brings every process back.
    pub fn heal(&mut self) {
        if self.stall_until.is_some() {
            self.set_stall(None);
        }
        self.revive(true);
        self.note("healed: nemesis off, every process running".into());
    }

    /// SIGTERMs every process and waits for it (SIGKILL after [`STOP_PATIENCE`]); returns
    /// those that did not exit 0 in time: mailroom promises to finish within its shutdown
    /// grace and exit 0, and the drain left nothing in flight.
    pub async fn stop(&mut self) -> Vec<String> {
        let mut hung = Vec::new();
        for i in 0..self.slots.len() {
            let name = self.slots[i].name();
            let Some(mut child) = self.slots[i].child.take() else {
                continue;
            };
            if let Some(pid) = child.id() {
                let _ = Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
            match tokio::time::timeout(STOP_PATIENCE, child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(status) => hung.push(format!("{name}: {status:?} after SIGTERM")),
                Err(_) => {
                    let _ = child.kill().await;
                    hung.push(format!(
                        "{name}: still running {STOP_PATIENCE:?} after SIGTERM (SIGKILLed)"
                    ));
                }
            }
        }
        self.note("stopped every process".into());
        hung
    }
}
