//! Crash points for the fault tests, and for nothing else: the integration tests (`crash`,
//! `poison`, `once`, the relay's `outbox` tests) arm them through the environment of a real
//! worker or relay process, and SIGKILL it or watch it abort at exactly one step of a delivery.
//! Nothing in mailroom reads their effects or branches on them; unarmed, which is every
//! production run, a point costs one lookup in an empty map, and a build without the
//! `failpoints` cargo feature has none at all (see below). A leaf: it imports nothing of
//! ours, and the worker ([`crate::worker`]) and relay ([`crate::relay`]) call [`hit`] and
//! [`hit_job`] at the points below.
//!
//! `MAILROOM_FAILPOINTS="worker.after_claim=abort;relay.after_confirm=pause"`.
//! `abort` kills the process on the spot (a real crash: no destructors, no acks, no commits);
//! `pause` parks the task forever so a test can SIGKILL the process at exactly that point;
//! `delay:2s` holds the task that long at every hit, `delay-once:2s` at the first hit only (a
//! slow step: a claim that takes most of its lease); `until:PATH` holds it until the file PATH
//! exists, which the test creates once the fault it needs at that step has landed (no race
//! between the fault and a fixed delay).
//! They exist only in builds with the `failpoints` cargo feature, which `cargo test` turns on
//! (mailroom is its own dev-dependency with that feature) and `cargo build` does not: a release
//! binary carries no failpoint, and says so once if `MAILROOM_FAILPOINTS` is set anyway.
//! `name@JOB_ID=action` arms a point for one job only (a poison job), e.g.
//! `worker.after_claim@order-7=abort`; the worker's points take the job id.
//!
//! Points: `worker.before_claim` (decoded, nothing claimed yet), `worker.after_claim`,
//! `worker.after_smtp_ok`, `worker.after_record`, `worker.before_dead_letter` (the job's
//! dead letter not yet published), `worker.before_ack` (every ack: the outcome is recorded or
//! published, the ack not sent), `worker.stopping` (a stopping worker's deliveries drained,
//! its last heartbeat not written), `relay.after_confirm`, `dlq.after_insert` (a dead
//! letter's row committed, its ack not sent: [`crate::dlq::ingest`]), `dlq.in_ack` (the same
//! inside the ack's time bound: held, it is an ack lapin never resolves),
//! `broker.migrate_mid_drain` (a moved letter's copy confirmed, the original not acked:
//! [`crate::broker::migrate`]; armed per letter by message id), `templates.check` (a check of
//! the template directory for edits, on its blocking thread: [`hit_blocking`]).

/// The environment variable that arms failpoints.
pub const ENV: &str = "MAILROOM_FAILPOINTS";

#[cfg(feature = "failpoints")]
pub use armed::{hit, hit_blocking, hit_job};

/// Runs nothing: this build has no failpoints.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn hit(_name: &str) {}

/// Runs nothing: this build has no failpoints.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub async fn hit_job(_name: &str, _job_id: &str) {}

/// Runs nothing: this build has no failpoints.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit_blocking(_name: &str) {}

/// Says once, at startup, that `MAILROOM_FAILPOINTS` is set in a build that ignores it.
pub fn warn_if_ignored() {
    if !cfg!(feature = "failpoints") && std::env::var_os(ENV).is_some() {
        tracing::warn!(
            "{ENV} is set, but this build has no failpoints (cargo feature `failpoints`); ignoring it"
        );
    }
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::collections::HashMap;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use super::ENV;

    #[derive(Debug)]
    enum Action {
        Abort,
        Pause,
        /// Waits this long; with `once`, only at the first hit.
        Delay {
            wait: Duration,
            once: bool,
            spent: AtomicBool,
        },
        /// Waits until this file exists.
        Until(std::path::PathBuf),
    }

    impl PartialEq for Action {
        fn eq(&self, other: &Action) -> bool {
            match (self, other) {
                (Action::Abort, Action::Abort) | (Action::Pause, Action::Pause) => true,
                (Action::Until(a), Action::Until(b)) => a == b,
                (
                    Action::Delay { wait, once, .. },
                    Action::Delay {
                        wait: w, once: o, ..
                    },
                ) => wait == w && once == o,
                _ => false,
            }
        }
    }

    fn delay(spec: &str, once: bool) -> Option<Action> {
        let wait = humantime::parse_duration(spec).ok()?;
        Some(Action::Delay {
            wait,
            once,
            spent: AtomicBool::new(false),
        })
    }

    fn armed() -> &'static HashMap<String, Action> {
        static ARMED: OnceLock<HashMap<String, Action>> = OnceLock::new();
        ARMED.get_or_init(|| parse(&std::env::var(ENV).unwrap_or_default()))
    }

    fn parse(spec: &str) -> HashMap<String, Action> {
        spec.split(';')
            .filter_map(|entry| {
                let (name, action) = entry.trim().split_once('=')?;
                let action = match action.trim() {
                    "abort" => Action::Abort,
                    "pause" => Action::Pause,
                    other if let Some(a) = other.strip_prefix("delay:").and_then(|d| delay(d, false)) => a,
                    other if let Some(a) = other.strip_prefix("delay-once:").and_then(|d| delay(d, true)) => a,
                    other if let Some(path) = other.strip_prefix("until:").filter(|p| !p.is_empty()) => Action::Until(path.into()),
                    other => {
                        eprintln!("mailroom: ignoring failpoint {name}={other}: use abort, pause, delay:DURATION, delay-once:DURATION or until:PATH");
                        return None;
                    }
                };
                Some((name.trim().to_string(), action))
            })
            .collect()
    }

    /// What a hit leaves to wait for, once it is logged (an abort never returns).
    enum Wait {
        Nothing,
        Forever,
        For(Duration),
        Until(&'static std::path::Path),
    }

    fn begin(name: &str) -> Wait {
        match armed().get(name) {
            None => Wait::Nothing,
            Some(Action::Abort) => {
                tracing::error!(failpoint = name, "failpoint: aborting the process");
                std::process::abort();
            }
            Some(Action::Pause) => {
                tracing::warn!(failpoint = name, "failpoint: pausing this delivery forever");
                Wait::Forever
            }
            Some(Action::Delay { wait, once, spent }) => {
                if *once && spent.swap(true, Ordering::SeqCst) {
                    return Wait::Nothing;
                }
                tracing::warn!(failpoint = name, ?wait, "failpoint: delaying this delivery");
                Wait::For(*wait)
            }
            Some(Action::Until(path)) => {
                tracing::warn!(failpoint = name, path = %path.display(), "failpoint: holding this delivery until the file exists");
                Wait::Until(path)
            }
        }
    }

    /// Runs the action armed for `name`, if any.
    pub async fn hit(name: &str) {
        match begin(name) {
            Wait::Nothing => {}
            Wait::Forever => std::future::pending::<()>().await,
            Wait::For(wait) => tokio::time::sleep(wait).await,
            Wait::Until(path) => {
                while !path.exists() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }

    /// [`hit`] on a thread of blocking work (`spawn_blocking`): `pause` parks the thread.
    pub fn hit_blocking(name: &str) {
        match begin(name) {
            Wait::Nothing => {}
            Wait::Forever => loop {
                std::thread::park();
            },
            Wait::For(wait) => std::thread::sleep(wait),
            Wait::Until(path) => {
                while !path.exists() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// Runs the action armed for `name`, or for `name@job_id`.
    pub async fn hit_job(name: &str, job_id: &str) {
        let armed = armed();
        if armed.is_empty() {
            return;
        }
        let keyed = format!("{name}@{job_id}");
        if armed.contains_key(&keyed) {
            hit(&keyed).await;
        } else {
            hit(name).await;
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_points_and_skips_unknown_actions() {
            let armed =
                parse("worker.after_claim=abort; worker.after_record = pause;x=explode;junk");
            assert_eq!(armed.get("worker.after_claim"), Some(&Action::Abort));
            assert_eq!(armed.get("worker.after_record"), Some(&Action::Pause));
            assert_eq!(armed.len(), 2);
        }

        #[test]
        fn parses_delays_every_time_or_once() {
            let armed = parse("a=delay:2s;b=delay-once:150ms;c=delay:soon");
            assert_eq!(armed.get("a"), delay("2s", false).as_ref());
            assert_eq!(armed.get("b"), delay("150ms", true).as_ref());
            assert_eq!(armed.get("c"), None);
        }

        #[test]
        fn parses_a_hold_until_a_file_exists() {
            let armed = parse("a=until:/tmp/go;b=until:");
            assert_eq!(armed.get("a"), Some(&Action::Until("/tmp/go".into())));
            assert_eq!(armed.get("b"), None);
        }

        #[test]
        fn parses_points_keyed_on_a_job() {
            let armed = parse("worker.after_claim@order-7=abort");
            assert_eq!(
                armed.get("worker.after_claim@order-7"),
                Some(&Action::Abort)
            );
            assert_eq!(armed.get("worker.after_claim"), None);
        }
    }
}
