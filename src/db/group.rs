//! Group commit for the claim ledger. A worker has many deliveries in flight; each needs a claim
//! before it sends and a record after. Written one by one, every claim and every record is a
//! statement and a commit of its own, and at full load the commits are what the database spends
//! its time on. The [`Ledger`] queues the writes of concurrent deliveries and writes whatever
//! is waiting as one group: one statement on PostgreSQL (data-modifying CTEs), one transaction
//! on MySQL, and one commit either way. A delivery gets its answer only after that commit, so
//! it never sends on a claim, or acks on a record, that is not durable.
//!
//! Nothing waits for a group to fill: the first write goes at once, and whatever arrives while
//! the groups in flight (two at most) are being written goes in the next one. Under load groups
//! grow by themselves. At moderate load, where they would be single writes, a group of only
//! records waits a few milliseconds for the next claim when arrivals show that one is due and
//! will come on its own ([`company`]), or for the records of the claims granted together with
//! its own ([`cohort`]); a claim never waits.
//!
//! A group holds each `(job_id, kind)` once (a second write of the same key waits for the next
//! group), so no statement touches a row twice. If a group fails on a deadlock between two
//! workers' groups (over a duplicate delivery), a key inserted concurrently (MySQL) or one
//! member's data that the database refuses (a value too long for its column), each of its
//! writes is done again on its own; any other error (no connection, the server down) is
//! every member's at once, so an outage costs a delivery one wait, not two.
//! Replays and records without a claim token are rare and always go alone.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use super::Database;
use super::rows::{Claim, ClaimRequest, Record};

pub mod cohort;
pub mod company;
use cohort::{Cohort, Cohorts};
use company::Company;
pub use company::RECORD_LINGER;

pub use super::rows::{ClaimItem, Group, GroupResult, RecordItem};

/// The error of a write; shared, because a group's connection error is every member's.
pub type LedgerError = Arc<sqlx::Error>;

impl Database {
    /// Writes a group of claims and records with one commit.
    pub async fn write_group(&self, group: &Group) -> Result<GroupResult, sqlx::Error> {
        match self {
            Database::Postgres(pool) => super::postgres::write_group(pool, group).await,
            Database::MySql(pool) => super::mysql::write_group(pool, group).await,
        }
    }
}

/// Counters of the ledger's groups, for `/metrics` and the benchmark.
#[derive(Debug, Default)]
pub struct LedgerStats {
    /// Groups written.
    pub groups: AtomicU64,
    /// Claims and records written in groups.
    pub writes: AtomicU64,
    /// Groups that failed on a statement and were written one by one.
    pub split: AtomicU64,
    /// Groups of only records that waited for company ([`company`]).
    pub waits: AtomicU64,
    /// Of those, the waits that ended without company (the group went alone).
    pub waits_alone: AtomicU64,
}

/// The claim ledger as the worker uses it: claims and records, grouped when `max_group > 1`.
#[derive(Clone, Debug)]
pub struct Ledger {
    db: Database,
    queue: Option<mpsc::Sender<Op>>,
    stats: Arc<LedgerStats>,
}

#[derive(Debug)]
enum Op {
    Claim {
        item: ClaimItem,
        lease: Duration,
        resend_uncertain: bool,
        reply: oneshot::Sender<Result<Claim, LedgerError>>,
    },
    Record {
        item: RecordItem,
        reply: oneshot::Sender<Result<bool, LedgerError>>,
        /// The claims granted with this record's claim ([`cohort`]), known once it arrived.
        cohort: Option<Cohort>,
    },
}

impl Op {
    fn is_record(&self) -> bool {
        matches!(self, Op::Record { .. })
    }

    fn key(&self) -> (&str, &str) {
        match self {
            Op::Claim { item, .. } => (&item.job_id, &item.kind),
            Op::Record { item, .. } => (&item.job_id, &item.kind),
        }
    }
}

impl Ledger {
    /// A ledger writing each claim and record on its own; `stats` counts its groups once it
    /// is [`Ledger::grouped`].
    pub fn direct(db: Database, stats: Arc<LedgerStats>) -> Ledger {
        Ledger {
            db,
            queue: None,
            stats,
        }
    }

    /// This ledger writing groups of at most `max_group` writes (1: each on its own). Spawns
    /// the group writer on the current runtime; it ends when the last clone is dropped.
    pub fn grouped(self, max_group: usize) -> Ledger {
        let Ledger { db, stats, .. } = self;
        let queue = (max_group > 1).then(|| {
            let (tx, rx) = mpsc::channel(max_group * 4);
            tokio::spawn(write_groups(db.clone(), rx, max_group, stats.clone()));
            tx
        });
        Ledger { db, queue, stats }
    }

    pub fn database(&self) -> &Database {
        &self.db
    }

    pub fn stats(&self) -> Arc<LedgerStats> {
        self.stats.clone()
    }

    /// Claims `(job_id, kind)`; the answer comes after the claim is committed.
    pub async fn claim(&self, req: &ClaimRequest<'_>) -> Result<Claim, LedgerError> {
        let Some(queue) = self.queue.as_ref().filter(|_| !req.replay) else {
            return self.claim_alone(req).await;
        };
        let (reply, answer) = oneshot::channel();
        let op = Op::Claim {
            item: ClaimItem {
                job_id: req.job_id.to_owned(),
                kind: req.kind.to_owned(),
                message_id: req.message_id.to_owned(),
                token: req.token,
                recipient: req.recipient.clone(),
                screen: req.screen.to_vec(),
            },
            lease: req.lease,
            resend_uncertain: req.resend_uncertain,
            reply,
        };
        match queue.send(op).await {
            Ok(()) => match answer.await {
                Ok(result) => result,
                Err(_) => Err(Arc::new(writer_gone())),
            },
            // The writer is gone (runtime shutting down): write alone.
            Err(_) => self.claim_alone(req).await,
        }
    }

    /// Records a result (with the template revision of a sent email); false when the claim is
    /// no longer ours. The answer comes after the record is committed.
    pub async fn record(
        &self,
        record: &Record<'_>,
        revision: Option<&str>,
    ) -> Result<bool, LedgerError> {
        // Replies and reasons quote servers and job data: bounded and NUL-free, they always fit.
        let reply = record.smtp_reply.map(ledger_text);
        let error = record.error.map(ledger_text);
        let record = &Record {
            smtp_reply: reply.as_deref(),
            error: error.as_deref(),
            ..record.clone()
        };
        let (Some(queue), Some(token)) = (self.queue.as_ref(), record.token) else {
            return self.record_alone(record, revision).await;
        };
        let (reply, answer) = oneshot::channel();
        let op = Op::Record {
            item: record_item(record, token, revision),
            reply,
            cohort: None,
        };
        match queue.send(op).await {
            Ok(()) => match answer.await {
                Ok(result) => result,
                Err(_) => Err(Arc::new(writer_gone())),
            },
            Err(_) => self.record_alone(record, revision).await,
        }
    }

    /// A claim in its own statements (a replay, or no writer). Boxed, as is
    /// [`Ledger::record_alone`]'s: a statement's future is some 18 KB, and an `async fn` is as
    /// large as its largest path, so inline it would grow every delivery's task, which is
    /// copied whole each time one is spawned, however rarely the path runs.
    async fn claim_alone(&self, req: &ClaimRequest<'_>) -> Result<Claim, LedgerError> {
        Box::pin(self.db.claim(req)).await.map_err(Arc::new)
    }

    /// Records on its own, outside any group.
    async fn record_alone(
        &self,
        record: &Record<'_>,
        revision: Option<&str>,
    ) -> Result<bool, LedgerError> {
        Box::pin(self.db.record_with_revision(record, revision))
            .await
            .map_err(Arc::new)
    }
}

/// A record by the holder of `token`, as a group member.
fn record_item(record: &Record<'_>, token: Uuid, revision: Option<&str>) -> RecordItem {
    RecordItem {
        job_id: record.job_id.to_owned(),
        kind: record.kind.to_owned(),
        token,
        status: record.status,
        smtp_reply: record.smtp_reply.map(str::to_owned),
        error: record.error.map(str::to_owned),
        class: record.class.map(str::to_owned),
        revision: revision.map(str::to_owned),
    }
}

/// Longest reply or reason the ledger keeps, in bytes: enough for any SMTP reply and any
/// reason mailroom writes, and far below the 64 KiB of MySQL's TEXT.
pub const MAX_LEDGER_TEXT_BYTES: usize = 4096;

/// `text` as the ledger stores it: without NUL (PostgreSQL's text cannot hold it) and cut to
/// [`MAX_LEDGER_TEXT_BYTES`] at a character boundary, so a record never fails on its own text.
pub fn ledger_text(text: &str) -> String {
    let without_nul: String = text.chars().filter(|&c| c != '\0').collect();
    crate::job::clip(&without_nul, MAX_LEDGER_TEXT_BYTES)
}

fn writer_gone() -> sqlx::Error {
    sqlx::Error::WorkerCrashed
}

/// Groups written at once. One would serialise every delivery behind the group in flight: while
/// the database cannot give a connection, a delivery would wait out the acquire timeout of the
/// group ahead of it and then its own. Two keep groups large under load (each holds what
/// arrived while the other was written) and halve that wait.
const GROUPS_IN_FLIGHT: usize = 2;

/// The group writer: takes what is waiting (up to `max`), writes it, answers, repeats, with up
/// to [`GROUPS_IN_FLIGHT`] groups being written at once.
async fn write_groups(
    db: Database,
    queue: mpsc::Receiver<Op>,
    max: usize,
    stats: Arc<LedgerStats>,
) {
    let mut arrivals = Arrivals::new(queue);
    // Writes that could not join the last group (same key as a member, another lease).
    let mut waiting: VecDeque<Op> = VecDeque::new();
    let in_flight = Arc::new(Semaphore::new(GROUPS_IN_FLIGHT));
    loop {
        // Collect the next group only once it can be written: what arrives meanwhile joins it.
        let Ok(slot) = in_flight.clone().acquire_owned().await else {
            return;
        };
        let Some(members) = gather(&mut arrivals, &mut waiting, max, &stats).await else {
            return;
        };
        let (db, stats) = (db.clone(), stats.clone());
        let unanswered = arrivals.unanswered.clone();
        let cohorts = arrivals.cohorts.clone();
        tokio::spawn(async move {
            let records = members.iter().filter(|op| op.is_record()).count();
            write(&db, members, &stats, &cohorts).await;
            unanswered.fetch_sub(records, Ordering::Relaxed);
            drop(slot);
        });
    }
}

/// The writes as they arrive, and what their arrival says ([`Company`]).
struct Arrivals {
    queue: mpsc::Receiver<Op>,
    company: Company,
    /// Records received and not yet answered (waiting, gathered or being written).
    unanswered: Arc<AtomicUsize>,
    /// Claims granted together whose records are still to come ([`cohort`]).
    cohorts: Arc<std::sync::Mutex<Cohorts>>,
}

impl Arrivals {
    fn new(queue: mpsc::Receiver<Op>) -> Arrivals {
        Arrivals {
            queue,
            company: Company::default(),
            unanswered: Arc::new(AtomicUsize::new(0)),
            cohorts: Arc::default(),
        }
    }

    /// Counts a write that has just arrived.
    fn note(&mut self, mut op: Op) -> Op {
        let unanswered = self.unanswered.load(Ordering::Relaxed);
        self.company
            .arrived(Instant::now(), !op.is_record(), unanswered);
        if let Op::Record { item, cohort, .. } = &mut op {
            self.unanswered.fetch_add(1, Ordering::Relaxed);
            *cohort = lock(&self.cohorts).recorded(item.token);
        }
        op
    }

    /// Whether a record of `members` has a cohort with sends still out.
    fn cohort_awaited(&self, members: &[Op]) -> bool {
        let cohorts = members.iter().filter_map(|op| match op {
            Op::Record { cohort, .. } => *cohort,
            Op::Claim { .. } => None,
        });
        lock(&self.cohorts).awaited(cohorts)
    }

    async fn recv(&mut self) -> Option<Op> {
        let op = self.queue.recv().await?;
        Some(self.note(op))
    }

    fn try_recv(&mut self) -> Option<Op> {
        let op = self.queue.try_recv().ok()?;
        Some(self.note(op))
    }
}

/// The cohorts, whoever panicked while holding them (they are counts, consistent at every step).
fn lock(cohorts: &std::sync::Mutex<Cohorts>) -> std::sync::MutexGuard<'_, Cohorts> {
    cohorts.lock().unwrap_or_else(|e| e.into_inner())
}

/// The members of the next group: the writes left `waiting` by the last group, else the next
/// one to arrive (waiting for it), then whatever else has arrived, up to `max`. A group of only
/// records then waits for company while [`Company`] says a claim is due (until one write
/// arrives), or while one of its records' cohorts has sends out (until their records are all
/// in, or a claim arrives), at most [`RECORD_LINGER`] either way. Writes that do not fit are
/// left `waiting` for the group after. `None` when the queue is closed.
async fn gather(
    arrivals: &mut Arrivals,
    waiting: &mut VecDeque<Op>,
    max: usize,
    stats: &LedgerStats,
) -> Option<Vec<Op>> {
    let mut group = Gathering::new(max);
    for op in waiting.drain(..) {
        group.admit(op);
    }
    if group.members.is_empty() {
        group.admit(arrivals.recv().await?);
    }
    group.admit_arrived(arrivals);
    if !group.only_records() {
        *waiting = group.next;
        return Some(group.members);
    }
    let now = Instant::now();
    let company = arrivals.company.wait_until(now).is_some();
    if company || arrivals.cohort_awaited(&group.members) {
        stats.waits.fetch_add(1, Ordering::Relaxed);
        let until = now + RECORD_LINGER;
        let mut joined = false;
        loop {
            match tokio::time::timeout_at(until, arrivals.recv()).await {
                Ok(Some(op)) => {
                    joined = true;
                    group.admit(op);
                    group.admit_arrived(arrivals);
                    if !group.only_records() || !arrivals.cohort_awaited(&group.members) {
                        break;
                    }
                }
                // Closed: the group goes as it is, and the next gather sees the end.
                Ok(None) => break,
                Err(_) => {
                    if !joined {
                        if company {
                            arrivals.company.waited_alone();
                        }
                        stats.waits_alone.fetch_add(1, Ordering::Relaxed);
                    }
                    break;
                }
            }
        }
    }
    *waiting = group.next;
    Some(group.members)
}

/// A group being gathered.
struct Gathering {
    max: usize,
    members: Vec<Op>,
    keys: HashSet<(String, String)>,
    /// The lease and policy of the group's claims, fixed by the first claim admitted.
    policy: Option<(Duration, bool)>,
    /// Writes that could not join (same key as a member, another lease, the group full).
    next: VecDeque<Op>,
}

impl Gathering {
    fn new(max: usize) -> Gathering {
        Gathering {
            max,
            members: Vec::new(),
            keys: HashSet::new(),
            policy: None,
            next: VecDeque::new(),
        }
    }

    /// Admits whatever has arrived, up to the group's size.
    fn admit_arrived(&mut self, arrivals: &mut Arrivals) {
        while self.members.len() < self.max {
            match arrivals.try_recv() {
                Some(op) => self.admit(op),
                None => break,
            }
        }
    }

    /// Whether the group holds only records, with nothing left over for the next (a write
    /// that could not join would wait behind a group waiting for company).
    fn only_records(&self) -> bool {
        self.next.is_empty() && self.members.iter().all(Op::is_record)
    }

    /// Admits `op` to the group if it fits, or keeps it for the next.
    fn admit(&mut self, op: Op) {
        let (job_id, kind) = op.key();
        let key = (job_id.to_owned(), kind.to_owned());
        // A claim fixes the group's lease and policy only once it is admitted.
        let claim_policy = match &op {
            Op::Claim {
                lease,
                resend_uncertain,
                ..
            } => Some((*lease, *resend_uncertain)),
            Op::Record { .. } => None,
        };
        let fits = claim_policy.is_none() || self.policy.is_none() || self.policy == claim_policy;
        if self.members.len() < self.max && fits && !self.keys.contains(&key) {
            self.policy = self.policy.or(claim_policy);
            self.keys.insert(key);
            self.members.push(op);
        } else {
            self.next.push_back(op);
        }
    }
}

/// Writes one group and answers its members; the claims it grants together are a cohort.
async fn write(
    db: &Database,
    members: Vec<Op>,
    stats: &LedgerStats,
    cohorts: &std::sync::Mutex<Cohorts>,
) {
    let group = group_of(&members);
    stats.groups.fetch_add(1, Ordering::Relaxed);
    stats
        .writes
        .fetch_add(members.len() as u64, Ordering::Relaxed);
    match db.write_group(&group).await {
        Ok(result) => {
            let granted = result
                .claims
                .iter()
                .filter_map(|claim| match claim {
                    Claim::Claimed { token, .. } => Some(*token),
                    Claim::Refused(_) => None,
                })
                .collect();
            // Before any answer: a record can only follow its claim's answer.
            lock(cohorts).granted(granted, Instant::now());
            answer(&group, result, members)
        }
        Err(e) if members.len() > 1 && worth_splitting(&e) => {
            // A statement failed (a deadlock with another worker's group, a key inserted
            // meanwhile): each write on its own, at once, so none waits behind another.
            stats.split.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, size = members.len(), "group write failed; writing its members one by one");
            let alone = members.into_iter().map(|op| write_alone(db, op));
            futures_util::future::join_all(alone).await;
        }
        Err(e) => fail_all(members, Arc::new(e)),
    }
}

/// The group the members write, in key order.
fn group_of(members: &[Op]) -> Group {
    let mut group = Group::default();
    for op in members {
        match op {
            Op::Claim {
                item,
                lease,
                resend_uncertain,
                ..
            } => {
                group.lease = *lease;
                group.resend_uncertain = *resend_uncertain;
                group.claims.push(item.clone());
            }
            Op::Record { item, .. } => group.records.push(item.clone()),
        }
    }
    group.sort();
    group
}

/// Answers every member with the group's error.
fn fail_all(members: Vec<Op>, e: LedgerError) {
    for op in members {
        match op {
            Op::Claim { reply, .. } => {
                let _ = reply.send(Err(e.clone()));
            }
            Op::Record { reply, .. } => {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// Whether a group's error belongs to the group rather than to the database: a deadlock with
/// another worker's group or a key inserted meanwhile, which its members written one by one
/// will not meet, or one member's data that the database refuses (that member alone gets the
/// error; the others must not be failed with it). Anything else (no connection, a timeout, the server down) each member would
/// meet again alone, after as long a wait.
fn worth_splitting(e: &sqlx::Error) -> bool {
    match e {
        // 40P01 deadlock_detected (PostgreSQL); 40001 serialization failure, which MySQL
        // reports for a deadlock (1213).
        sqlx::Error::Database(db) => {
            db.is_unique_violation()
                || matches!(db.code().as_deref(), Some("40P01" | "40001"))
                || super::is_data_error(e)
        }
        _ => false,
    }
}

fn answer(group: &Group, result: GroupResult, members: Vec<Op>) {
    let claims: HashMap<(&str, &str), &Claim> = group
        .claims
        .iter()
        .zip(&result.claims)
        .map(|(c, r)| ((c.job_id.as_str(), c.kind.as_str()), r))
        .collect();
    let records: HashMap<(&str, &str), bool> = group
        .records
        .iter()
        .zip(&result.records)
        .map(|(c, r)| ((c.job_id.as_str(), c.kind.as_str()), *r))
        .collect();
    for op in members {
        match op {
            Op::Claim { item, reply, .. } => {
                let key = (item.job_id.as_str(), item.kind.as_str());
                let claim = claims.get(&key).map(|c| (*c).clone());
                let _ = reply.send(claim.ok_or_else(|| Arc::new(missing_answer())));
            }
            Op::Record { item, reply, .. } => {
                let key = (item.job_id.as_str(), item.kind.as_str());
                let recorded = records.get(&key).copied();
                let _ = reply.send(recorded.ok_or_else(|| Arc::new(missing_answer())));
            }
        }
    }
}

fn missing_answer() -> sqlx::Error {
    sqlx::Error::Protocol("the group write returned no answer for a member".into())
}

async fn write_alone(db: &Database, op: Op) {
    match op {
        Op::Claim {
            item,
            lease,
            resend_uncertain,
            reply,
        } => {
            let req = ClaimRequest {
                job_id: &item.job_id,
                kind: &item.kind,
                message_id: &item.message_id,
                token: item.token,
                lease,
                resend_uncertain,
                replay: false,
                recipient: item.recipient.clone(),
                screen: &item.screen,
            };
            let _ = reply.send(db.claim(&req).await.map_err(Arc::new));
        }
        Op::Record { item, reply, .. } => {
            let record = Record {
                job_id: &item.job_id,
                kind: &item.kind,
                token: Some(item.token),
                status: item.status,
                smtp_reply: item.smtp_reply.as_deref(),
                error: item.error.as_deref(),
                class: item.class.as_deref(),
            };
            let result = db
                .record_with_revision(&record, item.revision.as_deref())
                .await;
            let _ = reply.send(result.map_err(Arc::new));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::rows::LedgerStatus;

    fn claim(job_id: &str) -> Op {
        Op::Claim {
            item: ClaimItem {
                job_id: job_id.into(),
                kind: "welcome".into(),
                message_id: format!("<{job_id}@mailroom.test>"),
                token: Uuid::new_v4(),
                recipient: None,
                screen: vec![],
            },
            lease: Duration::from_secs(60),
            resend_uncertain: false,
            reply: oneshot::channel().0,
        }
    }

    fn record(job_id: &str) -> Op {
        Op::Record {
            item: RecordItem {
                job_id: job_id.into(),
                kind: "welcome".into(),
                token: Uuid::new_v4(),
                status: LedgerStatus::Sent,
                smtp_reply: None,
                error: None,
                class: None,
                revision: None,
            },
            reply: oneshot::channel().0,
            cohort: None,
        }
    }

    /// The record of a claim granted with `token`.
    fn record_of(job_id: &str, token: Uuid) -> Op {
        let mut op = record(job_id);
        if let Op::Record { item, .. } = &mut op {
            item.token = token;
        }
        op
    }

    /// Arrivals with no evidence of independent arrivals, and a cohort of `n` claims granted
    /// together (their tokens).
    fn arrivals_with_a_cohort(n: usize) -> (mpsc::Sender<Op>, Arrivals, Vec<Uuid>) {
        let (tx, queue) = mpsc::channel(16);
        let arrivals = Arrivals::new(queue);
        let tokens: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
        lock(&arrivals.cohorts).granted(tokens.clone(), Instant::now());
        (tx, arrivals, tokens)
    }

    #[tokio::test(start_paused = true)]
    async fn records_of_claims_granted_together_wait_for_each_other_and_go_in_one_group() {
        let (tx, mut arrivals, tokens) = arrivals_with_a_cohort(3);
        let stats = LedgerStats::default();
        tx.send(record_of("a", tokens[0])).await.unwrap();
        let started = Instant::now();
        let gathering = tokio::spawn(async move {
            let group = gather(&mut arrivals, &mut VecDeque::new(), 16, &stats).await;
            (group, Instant::now(), stats, arrivals)
        });
        for (ms, (id, token)) in [(1, ("b", tokens[1])), (2, ("c", tokens[2]))] {
            tokio::time::sleep_until(started + Duration::from_millis(ms)).await;
            tx.send(record_of(id, token)).await.unwrap();
        }
        let (group, done, stats, arrivals) = gathering.await.unwrap();
        let group = group.unwrap();
        assert_eq!(
            keys(&group),
            [("record", "a"), ("record", "b"), ("record", "c")]
        );
        // It went with the cohort's last record, not at the end of the linger.
        assert_eq!(done - started, Duration::from_millis(2));
        assert_eq!(stats.waits.load(Ordering::Relaxed), 1);
        assert_eq!(stats.waits_alone.load(Ordering::Relaxed), 0);
        assert_eq!(lock(&arrivals.cohorts).remembered(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_waits_for_its_cohort_at_most_the_linger_and_a_claim_ends_the_wait() {
        let (tx, mut arrivals, tokens) = arrivals_with_a_cohort(3);
        let stats = LedgerStats::default();
        // The other two deliveries never record: the wait ends at the linger.
        tx.send(record_of("a", tokens[0])).await.unwrap();
        let started = Instant::now();
        let group = gather(&mut arrivals, &mut VecDeque::new(), 16, &stats)
            .await
            .unwrap();
        assert_eq!(keys(&group), [("record", "a")]);
        assert_eq!(Instant::now() - started, RECORD_LINGER);
        assert_eq!(stats.waits_alone.load(Ordering::Relaxed), 1);
        // The next record of the cohort waits too, until a claim arrives: the claim goes at
        // once, and the record with it.
        tx.send(record_of("b", tokens[1])).await.unwrap();
        let started = Instant::now();
        let gathering = tokio::spawn(async move {
            let group = gather(&mut arrivals, &mut VecDeque::new(), 16, &stats).await;
            (group, Instant::now())
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        tx.send(claim("d")).await.unwrap();
        let (group, done) = gathering.await.unwrap();
        assert_eq!(keys(&group.unwrap()), [("record", "b"), ("claim", "d")]);
        assert_eq!(done - started, Duration::from_millis(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_whose_claim_was_granted_alone_goes_at_once() {
        let (tx, mut arrivals, _) = arrivals_with_a_cohort(2);
        let stats = LedgerStats::default();
        let alone = Uuid::new_v4();
        // Granted after the cohort's span: a cohort of its own.
        tokio::time::sleep(cohort::COHORT_SPAN + Duration::from_millis(1)).await;
        lock(&arrivals.cohorts).granted(vec![alone], Instant::now());
        tx.send(record_of("a", alone)).await.unwrap();
        let started = Instant::now();
        let group = gather(&mut arrivals, &mut VecDeque::new(), 16, &stats)
            .await
            .unwrap();
        assert_eq!(keys(&group), [("record", "a")]);
        assert_eq!(Instant::now(), started);
        assert_eq!(stats.waits.load(Ordering::Relaxed), 0);
    }

    fn keys(group: &[Op]) -> Vec<(&'static str, &str)> {
        group
            .iter()
            .map(|op| (if op.is_record() { "record" } else { "claim" }, op.key().0))
            .collect()
    }

    /// Arrivals whose claims came every 5 ms, the last one while a record was unanswered:
    /// the next claim is due 5 ms after the last.
    fn arrivals_of_independent_claims() -> (mpsc::Sender<Op>, Arrivals) {
        let (tx, queue) = mpsc::channel(16);
        let mut arrivals = Arrivals::new(queue);
        let now = Instant::now();
        for i in 0..4u32 {
            let at = now - Duration::from_millis(5) * (4 - i);
            arrivals.company.arrived(at, true, usize::from(i == 3));
        }
        (tx, arrivals)
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_record_waits_for_the_claim_that_is_due_and_goes_with_it() {
        let (tx, mut arrivals) = arrivals_of_independent_claims();
        let stats = LedgerStats::default();
        tx.send(record("a")).await.unwrap();
        let started = Instant::now();
        let gathering = tokio::spawn(async move {
            let group = gather(&mut arrivals, &mut VecDeque::new(), 16, &stats).await;
            (group, Instant::now(), stats)
        });
        tokio::time::sleep(Duration::from_millis(3)).await;
        tx.send(claim("b")).await.unwrap();
        let (group, done, stats) = gathering.await.unwrap();
        let group = group.unwrap();
        assert_eq!(keys(&group), [("record", "a"), ("claim", "b")]);
        // It went when the claim arrived, not at the end of the linger.
        assert_eq!(done - started, Duration::from_millis(3));
        assert_eq!(stats.waits.load(Ordering::Relaxed), 1);
        assert_eq!(stats.waits_alone.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lone_record_waits_at_most_the_linger() {
        let (tx, mut arrivals) = arrivals_of_independent_claims();
        let stats = LedgerStats::default();
        tx.send(record("a")).await.unwrap();
        let started = Instant::now();
        let group = gather(&mut arrivals, &mut VecDeque::new(), 16, &stats)
            .await
            .unwrap();
        assert_eq!(keys(&group), [("record", "a")]);
        assert_eq!(Instant::now() - started, RECORD_LINGER);
        assert_eq!(stats.waits_alone.load(Ordering::Relaxed), 1);
        // The lone wait halved the one piece of evidence: the next lone record goes at once.
        assert_eq!(arrivals.company.wait_until(Instant::now()), None);
        // The record counts as unanswered until its group is written.
        assert_eq!(arrivals.unanswered.load(Ordering::Relaxed), 1);
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn claims_and_records_without_evidence_go_at_once() {
        let (tx, queue) = mpsc::channel(16);
        let mut arrivals = Arrivals::new(queue);
        let stats = LedgerStats::default();
        let started = Instant::now();
        // One job at a time: claim, then record, each with nothing else unanswered.
        for (op, key) in [(claim("a"), "claim"), (record("a"), "record")] {
            tx.send(op).await.unwrap();
            let group = gather(&mut arrivals, &mut VecDeque::new(), 16, &stats)
                .await
                .unwrap();
            assert_eq!(keys(&group), [(key, "a")]);
            arrivals.unanswered.store(0, Ordering::Relaxed);
        }
        assert_eq!(Instant::now(), started);
        assert_eq!(stats.waits.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_never_waits_even_when_company_is_due() {
        let (tx, mut arrivals) = arrivals_of_independent_claims();
        let stats = LedgerStats::default();
        tx.send(claim("a")).await.unwrap();
        let started = Instant::now();
        let group = gather(&mut arrivals, &mut VecDeque::new(), 16, &stats)
            .await
            .unwrap();
        assert_eq!(keys(&group), [("claim", "a")]);
        assert_eq!(Instant::now(), started);
        assert_eq!(stats.waits.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn ledger_text_drops_nul_and_cuts_long_text_at_a_character_boundary() {
        assert_eq!(ledger_text("250 ok\0 queued"), "250 ok queued");
        let long = "é".repeat(MAX_LEDGER_TEXT_BYTES);
        let cut = ledger_text(&long);
        assert!(cut.len() <= MAX_LEDGER_TEXT_BYTES, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert_eq!(ledger_text("short"), "short");
    }
}
