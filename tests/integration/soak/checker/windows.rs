//! The uncertain windows of the worker logs, each closed with its outcome.
//!
//! A window is one send on one claim: it opens when a worker process logs `window="sending"`
//! for a claim (job, attempt) and ends with the first outcome that process logs for it. Only
//! three endings may explain an extra email (README, Guarantees: W1/W2):
//! - the process was SIGKILLed while the window was open (sending, or accepted and not yet
//!   recorded);
//! - the send ended uncertain (timeout or broken connection after the final dot);
//! - SMTP accepted, and the process could not record `sent` (database unavailable).
//!
//! Every other ending explains nothing: `sent` recorded, a definite refusal (4xx, 5xx, refused
//! connection, a break before the dot), a record refused because another worker had taken the
//! claim over (a lease violation between two live workers: the very bug a duplicate may
//! reveal), or no outcome at all from a process that was not killed.

use std::collections::{BTreeSet, HashMap};

use super::Key;

/// A window event from the log of one worker process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// `window="sending"`: the send starts.
    Sending,
    /// `window="accepted"`: SMTP said 250; `sent` not recorded yet.
    Accepted,
    /// `window="closed"`: `sent` recorded.
    Closed,
    /// `window="failed"`: definitely not delivered (4xx, 5xx, refused, break before the dot).
    Failed,
    /// `window="uncertain"`: timeout or break after the final dot; maybe delivered.
    Uncertain,
    /// Accepted, but the claim had been taken over: the record was refused.
    TakenOver,
    /// Accepted, but `sent` could not be recorded within the lease.
    Unrecorded,
}

impl Window {
    /// The log's spelling (`window` field), or `None` for a field value the checker ignores.
    pub fn parse(field: &str) -> Option<Window> {
        Some(match field {
            "sending" => Window::Sending,
            "accepted" => Window::Accepted,
            "closed" => Window::Closed,
            "failed" => Window::Failed,
            "uncertain" => Window::Uncertain,
            "taken-over" => Window::TakenOver,
            "unrecorded" => Window::Unrecorded,
            _ => return None,
        })
    }
}

/// One window event from the log of one worker process, in that log's order.
#[derive(Clone, Debug)]
pub struct WindowEvent {
    pub process: String,
    pub key: Key,
    /// The claim's attempt number (the delivery span's `attempt`): it tells two claims of one
    /// job in one process apart.
    pub attempt: i64,
    pub window: Window,
}

/// How a window ended, as far as the logs and the nemesis tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Recorded,
    Failed,
    Uncertain,
    TakenOver,
    Unrecorded,
    /// Still open at the end of the log of a process the nemesis SIGKILLed.
    Killed(Window),
    /// Still open at the end of the log of a process that was never SIGKILLed, or left open
    /// by a later send on the same claim.
    Unknown(Window),
}

impl End {
    /// `Some(window)` where this ending may explain one extra email.
    fn excuse(self) -> Option<&'static str> {
        match self {
            End::Killed(Window::Accepted) => Some("W1: killed after SMTP accepted"),
            End::Killed(_) => Some("W1: killed while sending"),
            End::Uncertain => Some("W1: uncertain send (reply lost)"),
            End::Unrecorded => Some("W2: sent, could not record it"),
            _ => None,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            End::Recorded => "sent recorded",
            End::Failed => "refused (definite)",
            End::TakenOver => "record refused: claim taken over",
            End::Unknown(Window::Accepted) => "accepted, no outcome logged (process alive)",
            End::Unknown(_) => "sending, no outcome logged (process alive)",
            other => other.excuse().unwrap_or("?"),
        }
    }
}

/// The windows of one job: those that may explain an extra email, and the others.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobWindows {
    pub excuses: Vec<String>,
    pub others: Vec<String>,
}

/// Per job, every window with its ending.
pub fn per_job(events: &[WindowEvent], killed: &BTreeSet<String>) -> HashMap<Key, JobWindows> {
    let mut open: HashMap<(&str, &Key, i64), Window> = HashMap::new();
    let mut ended: Vec<(&str, &Key, i64, End)> = Vec::new();
    for e in events {
        let slot = (e.process.as_str(), &e.key, e.attempt);
        let end = match e.window {
            Window::Sending | Window::Accepted => {
                if let Some(was) = open.insert(slot, e.window)
                    && e.window == Window::Sending
                {
                    ended.push((slot.0, slot.1, slot.2, End::Unknown(was)));
                }
                continue;
            }
            Window::Closed => End::Recorded,
            Window::Failed => End::Failed,
            Window::Uncertain => End::Uncertain,
            Window::TakenOver => End::TakenOver,
            Window::Unrecorded => End::Unrecorded,
        };
        // An outcome without an open window (its opening line was cut off) explains nothing.
        if open.remove(&slot).is_some() {
            ended.push((slot.0, slot.1, slot.2, end));
        }
    }
    for ((process, key, attempt), w) in open {
        let end = if killed.contains(process) {
            End::Killed(w)
        } else {
            End::Unknown(w)
        };
        ended.push((process, key, attempt, end));
    }
    ended.sort_by(|a, b| (a.0, a.2).cmp(&(b.0, b.2)));
    let mut jobs: HashMap<Key, JobWindows> = HashMap::new();
    for (process, key, attempt, end) in ended {
        let job = jobs.entry(key.clone()).or_default();
        let line = format!("{process} attempt {attempt}: {}", end.describe());
        match end.excuse() {
            Some(_) => job.excuses.push(line),
            None => job.others.push(line),
        }
    }
    jobs
}
