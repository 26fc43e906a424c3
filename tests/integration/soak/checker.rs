//! The soak's checker, after Jepsen's `total-queue`: a pure function from what was committed
//! and what every party recorded (ledger, SMTP server, dead-letter queue, worker logs) to a
//! [`Report`]. No I/O here, so it is unit-tested on hand-made histories below.
//!
//! A duplicate is *explained* only by windows ([`windows`]) that ended where the README's
//! Guarantees allow a second email: the process was SIGKILLed inside the window, its send ended
//! uncertain, or it could not record `sent`. A live worker's definite failure, retry or
//! taken-over claim explains nothing. Each extra copy needs a window of its own.

pub(crate) mod windows;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use windows::JobWindows;
pub use windows::{Window, WindowEvent};

/// The idempotency key of a job.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub job_id: String,
    pub kind: String,
}

impl Key {
    pub fn new(job_id: &str, kind: &str) -> Key {
        Key {
            job_id: job_id.into(),
            kind: kind.into(),
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.job_id, self.kind)
    }
}

/// How a committed job must end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Exactly one email (more only in an uncertain window).
    Sent,
    /// In the dead-letter queue with a reason and this `x-mailroom-error-class`.
    DeadLetter { class: &'static str },
}

/// A job the producers committed (outbox transaction committed, or raw publish confirmed).
#[derive(Clone, Debug)]
pub struct Committed {
    pub key: Key,
    pub message_id: String,
    pub expect: Expect,
}

/// One message taken from the dead-letter queue.
#[derive(Clone, Debug)]
pub struct DeadLetterSeen {
    pub key: Key,
    pub class: Option<String>,
    pub reason: Option<String>,
}

/// Everything observed after the drain.
#[derive(Clone, Debug, Default)]
pub struct History {
    pub seed: u64,
    pub committed: Vec<Committed>,
    /// `sent_notifications`: key → status.
    pub ledger: Vec<(Key, String)>,
    /// The Message-ID of every email the SMTP server accepted, copies included.
    pub received: Vec<String>,
    pub dead_letters: Vec<DeadLetterSeen>,
    pub windows: Vec<WindowEvent>,
    /// Worker processes the nemesis SIGKILLed (names as in [`WindowEvent::process`]).
    pub killed: BTreeSet<String>,
    /// Outbox rows never published.
    pub unpublished: u64,
    /// Messages left in the work queue and the retry tiers once every process stopped.
    pub messages_left: u64,
    /// Processes that did not exit 0 in time after SIGTERM once drained, and how.
    pub hung: Vec<String>,
}

/// A job received more than once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Duplicate {
    pub key: Key,
    pub copies: usize,
    /// The windows that may explain an extra copy (`W1`/`W2`, process, attempt, ending).
    pub windows: Vec<String>,
    /// The job's other windows, which explain nothing (for the report).
    pub others: Vec<String>,
    pub explained: bool,
}

/// The checker's verdict.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub committed: usize,
    pub expected_sent: usize,
    pub expected_dead: usize,
    /// Distinct committed jobs the SMTP server received.
    pub sent: usize,
    /// Distinct committed jobs in the dead-letter queue.
    pub dead_lettered: usize,
    /// Committed, yet neither received nor dead-lettered.
    pub lost: Vec<Key>,
    pub duplicates: Vec<Duplicate>,
    /// Accepted emails that are no committed good job (unknown Message-ID, or a bad job sent).
    pub unexpected: Vec<String>,
    /// Good jobs dead-lettered, bad jobs dead-lettered without a reason or with another class.
    pub misfiled: Vec<String>,
    /// Ledger rows neither `sent` nor `dead`.
    pub stuck_rows: Vec<Key>,
    pub unpublished: u64,
    pub messages_left: u64,
    /// Processes that did not shut down cleanly (see [`History::hung`]).
    pub hung: Vec<String>,
}

impl Report {
    pub fn unexplained(&self) -> usize {
        self.duplicates.iter().filter(|d| !d.explained).count()
    }

    pub fn stuck(&self) -> u64 {
        self.stuck_rows.len() as u64 + self.unpublished + self.messages_left
    }

    /// The soak's assertion: nothing lost, unexpected, misfiled or stuck; every duplicate
    /// explained by an uncertain window; every process shut down cleanly.
    pub fn holds(&self) -> bool {
        self.lost.is_empty()
            && self.unexpected.is_empty()
            && self.misfiled.is_empty()
            && self.stuck() == 0
            && self.unexplained() == 0
            && self.hung.is_empty()
    }
}

/// Computes the report.
pub fn check(h: &History) -> Report {
    let mut receipts: HashMap<&str, usize> = HashMap::new();
    for id in &h.received {
        *receipts.entry(id.as_str()).or_default() += 1;
    }
    let mut dead: HashMap<&Key, Vec<&DeadLetterSeen>> = HashMap::new();
    for d in &h.dead_letters {
        dead.entry(&d.key).or_default().push(d);
    }
    let windows = windows::per_job(&h.windows, &h.killed);
    let mut r = Report {
        seed: h.seed,
        committed: h.committed.len(),
        unpublished: h.unpublished,
        messages_left: h.messages_left,
        hung: h.hung.clone(),
        ..Report::default()
    };
    let mut wanted = BTreeSet::new();
    for c in &h.committed {
        let copies = receipts.get(c.message_id.as_str()).copied().unwrap_or(0);
        let letters = dead.get(&c.key).map(Vec::as_slice).unwrap_or_default();
        r.sent += usize::from(copies > 0);
        r.dead_lettered += usize::from(!letters.is_empty());
        if copies == 0 && letters.is_empty() {
            r.lost.push(c.key.clone());
        }
        match c.expect {
            Expect::Sent => {
                r.expected_sent += 1;
                wanted.insert(c.message_id.as_str());
                if !letters.is_empty() {
                    let why = letters[0].reason.as_deref().unwrap_or("no reason");
                    r.misfiled
                        .push(format!("{}: good job dead-lettered ({why})", c.key));
                }
                if copies > 1 {
                    r.duplicates.push(duplicate(&c.key, copies, &windows));
                }
            }
            Expect::DeadLetter { class } => {
                r.expected_dead += 1;
                if let Some(bad) = letters.iter().find(|d| !fits(d, class)) {
                    r.misfiled.push(format!(
                        "{}: expected class {class} with a reason, got {:?} {:?}",
                        c.key, bad.class, bad.reason
                    ));
                }
            }
        }
    }
    let mut unexpected: BTreeMap<&str, usize> = BTreeMap::new();
    for id in h.received.iter().filter(|id| !wanted.contains(id.as_str())) {
        *unexpected.entry(id.as_str()).or_default() += 1;
    }
    r.unexpected = unexpected
        .into_iter()
        .map(|(id, n)| format!("{id} ×{n}"))
        .collect();
    r.stuck_rows = h
        .ledger
        .iter()
        .filter(|(_, status)| status != "sent" && status != "dead")
        .map(|(k, _)| k.clone())
        .collect();
    r
}

fn fits(d: &DeadLetterSeen, class: &str) -> bool {
    d.class.as_deref() == Some(class) && d.reason.as_deref().is_some_and(|r| !r.is_empty())
}

fn duplicate(key: &Key, copies: usize, windows: &HashMap<Key, JobWindows>) -> Duplicate {
    let JobWindows { excuses, others } = windows.get(key).cloned().unwrap_or_default();
    Duplicate {
        key: key.clone(),
        copies,
        explained: excuses.len() >= copies - 1,
        windows: excuses,
        others,
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let explained = self.duplicates.len() - self.unexplained();
        let rows: [(&str, String); 12] = [
            ("seed", self.seed.to_string()),
            (
                "committed",
                format!(
                    "{} ({} good, {} bad)",
                    self.committed, self.expected_sent, self.expected_dead
                ),
            ),
            ("sent", self.sent.to_string()),
            ("dead-lettered", self.dead_lettered.to_string()),
            ("lost", self.lost.len().to_string()),
            (
                "duplicates",
                format!("{} ({explained} explained)", self.duplicates.len()),
            ),
            ("unexplained", self.unexplained().to_string()),
            ("unexpected", self.unexpected.len().to_string()),
            ("misfiled", self.misfiled.len().to_string()),
            (
                "stuck",
                format!(
                    "{} (rows {}, unpublished {}, messages {})",
                    self.stuck(),
                    self.stuck_rows.len(),
                    self.unpublished,
                    self.messages_left
                ),
            ),
            ("hung", self.hung.len().to_string()),
            ("verdict", if self.holds() { "ok" } else { "FAILED" }.into()),
        ];
        for (name, value) in rows {
            writeln!(f, "| {name:<13} | {value:<40} |")?;
        }
        for d in &self.duplicates {
            let how = if d.explained { "" } else { "UNEXPLAINED " };
            writeln!(
                f,
                "  {how}duplicate {} ×{}: explained by {:?}; other windows {:?}",
                d.key, d.copies, d.windows, d.others
            )?;
        }
        let details = [
            ("lost", &self.lost.iter().map(Key::to_string).collect()),
            ("unexpected", &self.unexpected),
            ("misfiled", &self.misfiled),
            (
                "stuck",
                &self.stuck_rows.iter().map(Key::to_string).collect(),
            ),
            ("hung", &self.hung),
        ];
        for (what, items) in details {
            let items: &Vec<String> = items;
            for item in items.iter().take(20) {
                writeln!(f, "  {what}: {item}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
