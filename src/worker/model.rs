//! The delivery protocol as a model, checked exhaustively with [stateright] for a small world:
//! two workers, two copies of one job in the broker, one row of the claim ledger, the SMTP
//! server's count of acceptances, and a discrete clock that may tick between any two steps, so
//! a lease can expire anywhere. Faults (a crash of either worker at any step, a group commit
//! that fails or whose outcome is unknown, a reply lost after the dot) happen at most
//! [`Mailroom::faults`] times, which keeps the world finite; 4xx and 5xx answers are the
//! server's choice and cost nothing. The protocol is the one written down for issue 12, whose
//! steps the numbers below name: 1 decode, 2 SMTP session, 3 claim, 4 render, 5 fence, 6 send,
//! 7 record, 8 ack.
//!
//! Each action, the protocol step it stands for, and the code it describes:
//! - `Claim`: an idle worker takes a copy, decodes it (1), gets an SMTP session (2: waiting
//!   holds no claim, the copy may wait in the broker as long) and issues the claim (3); its
//!   deadline starts now. `process`: `Mailer::session`, `Ledger::claim`.
//! - `Commit`, and the faults `CommitFails` (nothing written, error) and `CommitUnknown`
//!   (written, error): the group commit holding a worker's pending write answers.
//!   `db/group.rs` `write_group`; `claim`, `record`, `release` in `db/{postgres,mysql}.rs`.
//! - The claim's answer (3): claimed, with the poison check; refused, judged by the product's
//!   own [`judge_refusal`]; an error, and the claim is given back by its token in case it
//!   committed. `process`, `refused`, `release_unknown_claim`.
//! - `Fence` (4, 5): render, then send only if the send and its record fit before the
//!   deadline, else give the claim back. `send_claimed`: `Deadline::covers_send`, `give_back`.
//! - `Dot` (6): the server accepts the final dot, and counts it. `Mailer::send_in`.
//! - `Refused` (6): 4xx, refused, a break or timeout before the dot. `SendError::Transient`,
//!   `Unreachable` → `retry_or_give_up`. `Rejected` (6): 5xx. `SendError::Permanent` →
//!   `give_up`.
//! - `Reply` (6, 7): the 250 arrives; record `sent`, retried until the deadline, then a retry
//!   tier. `record_sent`. The fault `ReplyLost`: a break or timeout after the dot
//!   (`SendError::Uncertain`), handled by policy.
//! - `Settle` (8): ack, retry tier (publish then ack), or dead letter. `worker/settle.rs`.
//! - `Crash`: the worker dies at any step; the broker redelivers its copy.
//! - `Tick`: time passes for leases, deadlines, send timeouts and retry delays, except past a
//!   send's whole-send timeout (the send ends first).
//!
//! Simplifications, each of which only adds behaviours or cannot matter for one job: one group
//! holds each `(job_id, kind)` at most once, so for one row a group commit is a single write
//! that may fail or be unknown on its own; the clocks of workers and database advance together
//! (only the database's clock sets leases); a claim and the read of the refusing row are one
//! step; a retry's publish and the ack are one step; a claim token is a small number, renamed
//! after each step (tokens are only ever compared for equality); replays, invalid jobs and
//! template errors are left out (they dead-letter without sending).
//!
//! A pending write that a crash leaves behind is dropped: one that lands later ("ghost")
//! could only take over a claim without sending on it, or write through its own token guard,
//! which the crash-then-redelivery paths already cover.
//!
//! What the check shows (`tests.rs`; `cargo test --lib worker::model -- --nocapture` prints
//! the counts and the counterexamples), under both policies and with up to two faults:
//! - a second acceptance only ever follows the takeover of a claim whose email was accepted and
//!   not recorded ([`Windows`]), and a dot only goes out under its sender's own live lease;
//! - under `dead-letter` no job is accepted twice at all;
//! - every world can still end the job (`sent`, or dead-lettered with a class) once faults
//!   stop, no world is stuck, and the only loops go through give-backs at the fence: a claim
//!   that is always too slow (its commit or its render eats the claim budget every time) is
//!   given back forever, uncounted, as a database outage retries forever;
//! - without the fence, two live workers send one job twice with no fault at all;
//! - a reply lost to a live worker under `resend` is a window of its own: the worker records
//!   `uncertain` and its retry takes the row over and sends again, no crash, nothing
//!   unrecorded (docs/GUARANTEES.md's W2; the protocol as first written named a lost reply
//!   only together with a crash).

mod step;
mod tests;
mod world;

use std::time::Duration;

use stateright::{Model, Property};

use super::outcome::ErrorClass;
use crate::config::OnUncertain;
use crate::db::{ExistingClaim, LedgerStatus, judge_refusal};

/// The lease, in ticks of the model's clock (`MAILROOM_LEASE`). The smallest that covers a send.
const LEASE: u8 = 3;
/// Kept free at the end of a lease: the deadline is `asked + LEASE - SAFETY` (`LEASE_SAFETY`).
const SAFETY: u8 = 1;
/// The whole-send timeout (`MAILROOM_SMTP_TIMEOUT`).
const SMTP_TIMEOUT: u8 = 1;
/// Time for the record after a send (`RECORD_BUDGET`).
const RECORD_BUDGET: u8 = 1;
/// A copy refused by a live lease retries this long after it (`LEASE_MARGIN`).
const LEASE_MARGIN: u8 = 1;
/// The retry tiers (`MAILROOM_RETRY_DELAYS`), shortest first.
const TIERS: [u8; 2] = [1, LEASE + LEASE_MARGIN];
const WORKERS: usize = 2;
const COPIES: usize = 2;

/// The world's rules: the configuration under check and its fault budget.
#[derive(Clone, Debug)]
pub(super) struct Mailroom {
    /// `MAILROOM_ON_UNCERTAIN`.
    pub on_uncertain: OnUncertain,
    /// Whether step 5 exists. Without it, this is the design issue 12's finding 1 broke.
    pub fence: bool,
    /// Whether records and give-backs only land on the writer's own claim (the token guard of
    /// `record` and `release`). Without it, a late write lands on a claim taken over since.
    pub token_guard: bool,
    /// How many faults may happen in one run.
    pub faults: u8,
    /// `MAILROOM_MAX_ATTEMPTS`.
    pub max_attempts: u8,
}

/// One state of the world.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct World {
    pub workers: [Option<Delivery>; WORKERS],
    pub copies: [Copy; COPIES],
    pub row: Option<Row>,
    /// Emails the SMTP server accepted for the job.
    pub accepted: u8,
    pub windows: Windows,
    pub faults: u8,
    pub seen: Seen,
}

/// A copy of the job in the broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Copy {
    Ready,
    /// In a retry tier for this many more ticks.
    Delayed(u8),
    /// Delivered to a worker, unacked.
    Held,
    Acked,
    DeadLettered(Class),
}

/// The row of `sent_notifications`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Row {
    pub status: RowStatus,
    pub attempts: u8,
    /// Ticks left on the lease; 0 when there is none or it expired.
    pub lease: u8,
    pub token: Option<u8>,
    pub class: Option<Class>,
    /// The server accepted this claim's email and `sent` is not written; why, if its holder
    /// stopped trying.
    pub unrecorded: Option<Unrecorded>,
}

/// The state of an accepted email whose `sent` is not written: this is what a takeover finds
/// when it resends, and what explains the duplicate (the windows of docs/GUARANTEES.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Unrecorded {
    /// Its holder is still at it (waiting for the reply, or recording `sent`).
    Live,
    /// Its holder crashed (W1).
    Crashed,
    /// Its holder could not record `sent` before the deadline and gave up (W2).
    GaveUp,
    /// Its holder lost the server's reply and recorded `uncertain`.
    ReplyLost,
}

/// [`LedgerStatus`], hashable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum RowStatus {
    Sending,
    Sent,
    Failed,
    Uncertain,
    Dead,
}

/// The [`ErrorClass`]es a sendable job can end with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Class {
    Rejected,
    Exhausted,
    Uncertain,
}

/// A worker's delivery in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Delivery {
    pub copy: u8,
    pub step: Step,
    /// The claim token this delivery asked for (step 3 on), while it still matters.
    pub token: Option<u8>,
}

/// Where a delivery is. `deadline` counts ticks to the claim's deadline (0: passed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Step {
    /// 3: the claim is written, its commit pending.
    Claiming { deadline: u8 },
    /// 4–5: claimed, rendering; the fence is next.
    Claimed { deadline: u8, attempt: u8 },
    /// 6: in the SMTP dialogue, `left` ticks before the whole-send timeout.
    Sending { deadline: u8, left: u8, attempt: u8 },
    /// 6: the server accepted the dot; its reply is on the way.
    Replying { deadline: u8, left: u8, attempt: u8 },
    /// 7, and every other ledger write: its commit pending.
    Writing { write: Write, deadline: u8 },
    /// 8: the outcome is decided.
    Settling(Outcome),
}

/// A ledger write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Write {
    /// 7: `sent`, token-guarded, retried until the deadline.
    Sent,
    /// A failure recorded once (token-guarded), then `then`.
    Result {
        status: RowStatus,
        class: Option<Class>,
        then: Outcome,
    },
    /// `uncertain` over an expired `sending` row (no token), then a dead letter.
    UncertainExpired,
    /// Gives the claim back by its token (the fence, or a claim whose outcome is unknown).
    Release,
}

/// What a delivery ends with (`Outcome` in `process.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Outcome {
    Ack,
    /// Through the tier covering `delay` ticks.
    Retry {
        delay: u8,
    },
    DeadLetter(Class),
}

/// How many times a claim whose email was accepted, `sent` unwritten, was taken over (the only
/// way to a second send), by what its holder had become. GUARANTEES.md's W1 is `crashed` (the
/// holder died) and `unrecorded` (alive, it could not commit `sent` within its lease: still
/// recording, or given up); its W2 is `reply_lost` (alive, the reply to the dot never came). A
/// takeover while the holder still waits for its reply counts as no window: the fence must
/// make that impossible.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Windows {
    pub crashed: u8,
    pub unrecorded: u8,
    pub reply_lost: u8,
}

/// Evidence for the `sometimes` properties and the fence's own property.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Seen {
    pub takeover: bool,
    pub give_back: bool,
    /// An expired `sending` row was marked `uncertain` (policy `dead-letter`).
    pub expired_uncertain: bool,
    /// A dot went out while the sender did not hold a live lease.
    pub dot_outside_lease: bool,
}

/// One step of the world.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Action {
    Tick,
    Claim { worker: usize, copy: usize },
    Commit(usize),
    CommitFails(usize),
    CommitUnknown(usize),
    Fence(usize),
    Dot(usize),
    Refused(usize),
    Rejected(usize),
    Reply(usize),
    ReplyLost(usize),
    Settle(usize),
    Crash(usize),
}

impl Action {
    /// A step the fault budget pays for.
    pub fn is_fault(self) -> bool {
        matches!(
            self,
            Action::CommitFails(_)
                | Action::CommitUnknown(_)
                | Action::ReplyLost(_)
                | Action::Crash(_)
        )
    }
}

impl Windows {
    pub fn total(self) -> u8 {
        self.crashed + self.unrecorded + self.reply_lost
    }
}

impl RowStatus {
    fn status(self) -> LedgerStatus {
        match self {
            RowStatus::Sending => LedgerStatus::Sending,
            RowStatus::Sent => LedgerStatus::Sent,
            RowStatus::Failed => LedgerStatus::Failed,
            RowStatus::Uncertain => LedgerStatus::Uncertain,
            RowStatus::Dead => LedgerStatus::Dead,
        }
    }
}

impl Class {
    fn error_class(self) -> ErrorClass {
        match self {
            Class::Rejected => ErrorClass::Rejected,
            Class::Exhausted => ErrorClass::Exhausted,
            Class::Uncertain => ErrorClass::Uncertain,
        }
    }
}

impl Row {
    /// The row as `ExistingClaim`, for [`judge_refusal`].
    fn existing(self) -> ExistingClaim {
        ExistingClaim {
            status: self.status.status(),
            attempts: i32::from(self.attempts),
            lease_remaining: (self.lease > 0).then(|| Duration::from_secs(self.lease.into())),
            error_class: self.class.map(|c| c.error_class().as_str().to_string()),
            last_error: None,
        }
    }
}

impl World {
    fn sent(&self) -> bool {
        self.row.is_some_and(|r| r.status == RowStatus::Sent)
    }

    fn dead_lettered(&self) -> bool {
        self.copies
            .iter()
            .any(|c| matches!(c, Copy::DeadLettered(_)))
    }

    /// Every copy is settled and the job is `sent` (accepted) or dead-lettered with a reason.
    pub fn job_ended(&self) -> bool {
        let settled = self
            .copies
            .iter()
            .all(|c| matches!(c, Copy::Acked | Copy::DeadLettered(_)));
        settled
            && self.workers.iter().all(Option::is_none)
            && ((self.sent() && self.accepted >= 1) || self.dead_lettered())
    }

    /// No holder's deadline outlives its lease (step 3: `lease_until` is later than it).
    fn deadlines_within_leases(&self) -> bool {
        let Some(row) = self.row else { return true };
        self.workers.iter().flatten().all(|d| {
            let deadline = d.step.deadline().unwrap_or(0);
            row.status != RowStatus::Sending
                || d.token != row.token
                || deadline == 0
                || deadline + SAFETY <= row.lease
        })
    }
}

impl Step {
    fn deadline(self) -> Option<u8> {
        match self {
            Step::Claiming { deadline }
            | Step::Claimed { deadline, .. }
            | Step::Sending { deadline, .. }
            | Step::Replying { deadline, .. }
            | Step::Writing { deadline, .. } => Some(deadline),
            Step::Settling(_) => None,
        }
    }
}

impl Model for Mailroom {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![World {
            workers: [None; WORKERS],
            copies: [Copy::Ready; COPIES],
            row: None,
            accepted: 0,
            windows: Windows::default(),
            faults: 0,
            seen: Seen::default(),
        }]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        self.enabled(world, actions);
    }

    fn next_state(&self, world: &World, action: Action) -> Option<World> {
        let mut next = world.clone();
        self.apply(&mut next, action);
        next.rename_tokens();
        Some(next)
    }

    /// The `always` properties: a second acceptance needs a window; the fence keeps every dot
    /// inside its sender's live lease, and a deadline inside its lease; `sent` means accepted;
    /// a world where nothing can happen has ended the job. The `sometimes` properties show
    /// that the paths that matter are reached, so no `always` holds for want of a path.
    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no duplicate outside a window", |_, w: &World| {
                w.accepted <= 1 + w.windows.total()
            }),
            Property::always(
                "no duplicate outside a crash or an unrecorded sent",
                |_, w: &World| w.accepted <= 1 + w.windows.crashed + w.windows.unrecorded,
            ),
            Property::always(
                "the dot goes out only under the sender's live lease",
                |_, w: &World| !w.seen.dot_outside_lease,
            ),
            Property::always("a deadline never outlives its lease", |_, w: &World| {
                w.deadlines_within_leases()
            }),
            Property::always("a sent row was accepted", |_, w: &World| {
                !w.sent() || w.accepted >= 1
            }),
            Property::always(
                "a world with nothing left to do has ended the job",
                |m: &Mailroom, w: &World| w.job_ended() || !m.is_stuck(w),
            ),
            Property::sometimes("the job is sent", |_, w: &World| w.job_ended() && w.sent()),
            Property::sometimes("the job is dead-lettered", |_, w: &World| {
                w.job_ended() && w.dead_lettered()
            }),
            Property::sometimes("a claim is taken over", |_, w: &World| w.seen.takeover),
            Property::sometimes("an expired claim is marked uncertain", |_, w: &World| {
                w.seen.expired_uncertain
            }),
            Property::sometimes("a claim is given back at the fence", |_, w: &World| {
                w.seen.give_back
            }),
            Property::sometimes("a window lets a duplicate through", |_, w: &World| {
                w.accepted >= 2
            }),
        ]
    }
}

impl Mailroom {
    /// Nothing can happen any more: no step, no tick.
    pub fn is_stuck(&self, world: &World) -> bool {
        let mut actions = Vec::new();
        self.enabled(world, &mut actions);
        actions.is_empty()
    }
}
