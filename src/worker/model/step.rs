//! The steps of the model: which actions a world enables, and what each one does. Each arm
//! names the protocol step and the code it stands for (the table in the parent module).

use super::world::{can_tick, tick};
use super::{
    Action, Class, Copy, Delivery, LEASE, LEASE_MARGIN, Mailroom, Outcome, RECORD_BUDGET, Row,
    RowStatus, SAFETY, SMTP_TIMEOUT, Step, TIERS, Unrecorded, World, Write, judge_refusal,
};
use crate::config::OnUncertain;
use crate::db::Refusal;

impl Mailroom {
    /// The actions enabled in `world`, in a fixed order.
    pub(super) fn enabled(&self, world: &World, actions: &mut Vec<Action>) {
        let faults_left = world.faults < self.faults;
        for (w, delivery) in world.workers.iter().enumerate() {
            let Some(d) = delivery else {
                for (c, copy) in world.copies.iter().enumerate() {
                    if *copy == Copy::Ready {
                        actions.push(Action::Claim { worker: w, copy: c });
                    }
                }
                continue;
            };
            match d.step {
                Step::Claiming { .. } | Step::Writing { .. } => {
                    actions.push(Action::Commit(w));
                    if faults_left {
                        actions.push(Action::CommitFails(w));
                        actions.push(Action::CommitUnknown(w));
                    }
                }
                Step::Claimed { .. } => actions.push(Action::Fence(w)),
                Step::Sending { .. } => {
                    actions.extend([Action::Dot(w), Action::Refused(w), Action::Rejected(w)]);
                }
                Step::Replying { .. } => {
                    actions.push(Action::Reply(w));
                    if faults_left {
                        actions.push(Action::ReplyLost(w));
                    }
                }
                Step::Settling(_) => actions.push(Action::Settle(w)),
            }
            if faults_left {
                actions.push(Action::Crash(w));
            }
        }
        if can_tick(world) {
            actions.push(Action::Tick);
        }
    }

    /// Applies `action` to `world`.
    pub(super) fn apply(&self, world: &mut World, action: Action) {
        if action.is_fault() {
            world.faults += 1;
        }
        match action {
            Action::Tick => tick(world),
            Action::Claim { worker, copy } => claim(world, worker, copy),
            Action::Commit(w) => self.commit(world, w, true, true),
            Action::CommitFails(w) => self.commit(world, w, false, false),
            Action::CommitUnknown(w) => self.commit(world, w, true, false),
            Action::Fence(w) => self.fence(world, w),
            Action::Dot(w) => dot(world, w),
            Action::Refused(w) => {
                let attempt = world.delivery(w).step.attempt();
                let write = self.retry_or_give_up(attempt, RowStatus::Failed);
                world.delivery(w).step = writing(write);
            }
            Action::Rejected(w) => {
                world.delivery(w).step = writing(give_up(RowStatus::Dead, Class::Rejected));
            }
            Action::Reply(w) => {
                let deadline = world.delivery(w).step.deadline().unwrap_or(0);
                world.delivery(w).step = Step::Writing {
                    write: Write::Sent,
                    deadline,
                };
            }
            Action::ReplyLost(w) => self.reply_lost(world, w),
            Action::Settle(w) => settle(world, w),
            Action::Crash(w) => crash(world, w),
        }
    }

    /// The email went out but its reply was lost: an uncertain send, handled as the policy says.
    fn reply_lost(&self, world: &mut World, w: usize) {
        world.leave_unrecorded(w, Unrecorded::ReplyLost);
        let attempt = world.delivery(w).step.attempt();
        let write = match self.on_uncertain {
            OnUncertain::Resend => self.retry_or_give_up(attempt, RowStatus::Uncertain),
            OnUncertain::DeadLetter => give_up(RowStatus::Uncertain, Class::Uncertain),
        };
        world.delivery(w).step = writing(write);
    }

    /// The pending write of worker `w` commits (`written`) or not, and its answer is an error
    /// unless `ok`.
    fn commit(&self, world: &mut World, w: usize, written: bool, ok: bool) {
        let d = *world.delivery(w);
        match d.step {
            Step::Claiming { deadline } if ok => self.answer_claim(world, w, deadline),
            Step::Claiming { .. } => {
                if written {
                    self.claim(world, d.token);
                }
                // `release_unknown_claim`: the worker cannot tell, so it gives back by token.
                world.delivery(w).step = writing(Write::Release);
            }
            Step::Writing { write, deadline } => {
                if written {
                    world.write(write, d.token, self.token_guard);
                }
                let step = match write {
                    Write::Sent => return self.sent_answered(world, w, written && ok, deadline),
                    Write::Result { then, .. } => Step::Settling(then),
                    Write::UncertainExpired => {
                        Step::Settling(Outcome::DeadLetter(Class::Uncertain))
                    }
                    Write::Release => Step::Settling(Outcome::Retry { delay: 0 }),
                };
                let d = world.delivery(w);
                d.step = step;
                d.token = None;
            }
            _ => unreachable!("no write pending in {:?}", d.step),
        }
    }

    /// Step 3, the claim statement: insert, or take over a `failed` row, or (policy `resend`) an
    /// expired `sending` or an `uncertain` one. Returns the attempt when claimed.
    fn claim(&self, world: &mut World, token: Option<u8>) -> Option<u8> {
        let resend = self.on_uncertain == OnUncertain::Resend;
        let fresh = Row {
            status: RowStatus::Sending,
            attempts: 1,
            lease: LEASE,
            token,
            class: None,
            unrecorded: None,
        };
        let Some(row) = world.row else {
            world.row = Some(fresh);
            return Some(1);
        };
        let expired = row.status == RowStatus::Sending && row.lease == 0;
        let takes_over = resend && (expired || row.status == RowStatus::Uncertain);
        if row.status != RowStatus::Failed && !takes_over {
            return None;
        }
        if takes_over {
            world.seen.takeover = true;
            world.count_window(row);
        }
        let attempts = row.attempts + 1;
        world.row = Some(Row { attempts, ..fresh });
        Some(attempts)
    }

    /// The claim committed and its answer arrived: claimed (with the poison check of `process`)
    /// or refused, judged by the product's [`judge_refusal`].
    fn answer_claim(&self, world: &mut World, w: usize, deadline: u8) {
        let token = world.delivery(w).token;
        let step = match self.claim(world, token) {
            Some(attempt) if attempt > self.max_attempts => {
                writing(give_up(RowStatus::Dead, Class::Exhausted))
            }
            Some(attempt) => Step::Claimed { deadline, attempt },
            None => {
                let existing = world.row.map(Row::existing);
                let resend = self.on_uncertain == OnUncertain::Resend;
                let row = world.row.expect("a refusal comes from a row");
                world.delivery(w).token = None;
                match judge_refusal(existing.as_ref(), resend) {
                    Refusal::AlreadySent => Step::Settling(Outcome::Ack),
                    Refusal::AlreadyDead => match row.class {
                        Some(class) => Step::Settling(Outcome::DeadLetter(class)),
                        None => Step::Settling(Outcome::Ack),
                    },
                    Refusal::Busy { after } => {
                        let after = u8::try_from(after.as_secs()).unwrap_or(u8::MAX);
                        Step::Settling(Outcome::Retry {
                            delay: after.saturating_add(LEASE_MARGIN),
                        })
                    }
                    Refusal::Uncertain => writing(Write::UncertainExpired),
                }
            }
        };
        world.delivery(w).step = step;
    }

    /// Steps 4–5: the fence. A send starts only if it and its record fit before the deadline.
    fn fence(&self, world: &mut World, w: usize) {
        let Step::Claimed { deadline, attempt } = world.delivery(w).step else {
            unreachable!("the fence needs a claim");
        };
        let step = if self.fence && deadline < SMTP_TIMEOUT + RECORD_BUDGET {
            world.seen.give_back = true;
            writing(Write::Release)
        } else {
            Step::Sending {
                deadline,
                left: SMTP_TIMEOUT,
                attempt,
            }
        };
        world.delivery(w).step = step;
    }

    /// `retry_or_give_up`: record `status` and retry, or dead-letter once attempts ran out.
    fn retry_or_give_up(&self, attempt: u8, status: RowStatus) -> Write {
        if attempt >= self.max_attempts {
            return give_up(RowStatus::Dead, Class::Exhausted);
        }
        Write::Result {
            status,
            class: None,
            then: Outcome::Retry { delay: 0 },
        }
    }

    /// Step 7's answer: `sent` is durable (or the claim was taken over: ack, the new holder
    /// decides), or it is retried until the deadline, then the delivery goes to a retry tier.
    fn sent_answered(&self, world: &mut World, w: usize, ok: bool, deadline: u8) {
        let step = if ok {
            Step::Settling(Outcome::Ack)
        } else if deadline > 0 {
            return; // the retry loop writes again
        } else {
            world.leave_unrecorded(w, Unrecorded::GaveUp);
            Step::Settling(Outcome::Retry { delay: LEASE })
        };
        let d = world.delivery(w);
        d.step = step;
        d.token = None;
    }
}

/// A dead-letter with `class`, recorded once as `status` (`give_up`, `give_up_as`).
fn give_up(status: RowStatus, class: Class) -> Write {
    Write::Result {
        status,
        class: Some(class),
        then: Outcome::DeadLetter(class),
    }
}

fn writing(write: Write) -> Step {
    Step::Writing { write, deadline: 0 }
}

/// Step 6: the server accepts the final dot and counts it.
fn dot(world: &mut World, w: usize) {
    let d = *world.delivery(w);
    let Step::Sending {
        deadline,
        left,
        attempt,
    } = d.step
    else {
        unreachable!("a dot needs a send");
    };
    let live = world
        .row
        .is_some_and(|r| r.status == RowStatus::Sending && r.lease > 0 && r.token == d.token);
    world.seen.dot_outside_lease |= !live;
    world.accepted += 1;
    if let Some(row) = world.row.as_mut().filter(|_| live) {
        row.unrecorded = Some(Unrecorded::Live);
    }
    world.delivery(w).step = Step::Replying {
        deadline,
        left,
        attempt,
    };
}

/// Step 8: ack, retry through the tier that covers the delay, or dead-letter.
fn settle(world: &mut World, w: usize) {
    let d = world.workers[w].take().expect("settling needs a delivery");
    let Step::Settling(outcome) = d.step else {
        unreachable!("settle needs an outcome");
    };
    world.copies[usize::from(d.copy)] = match outcome {
        Outcome::Ack => Copy::Acked,
        Outcome::Retry { delay } => {
            let tier = TIERS.iter().copied().find(|t| *t >= delay);
            Copy::Delayed(tier.unwrap_or(TIERS[TIERS.len() - 1]))
        }
        Outcome::DeadLetter(class) => Copy::DeadLettered(class),
    };
}

/// Worker `worker` takes copy `copy`: decoded, SMTP session taken (waiting for it holds no
/// claim: the copy may wait in the broker as long), claim issued with a fresh token: the
/// deadline starts.
fn claim(world: &mut World, worker: usize, copy: usize) {
    world.copies[copy] = Copy::Held;
    world.workers[worker] = Some(Delivery {
        copy: copy as u8,
        step: Step::Claiming {
            deadline: LEASE - SAFETY,
        },
        token: Some(u8::MAX),
    });
}

/// Worker `w` dies: what it did not record stays unrecorded, and its copy goes back to the queue.
fn crash(world: &mut World, w: usize) {
    world.leave_unrecorded(w, Unrecorded::Crashed);
    let d = world.workers[w].take().expect("a crash needs a delivery");
    world.copies[usize::from(d.copy)] = Copy::Ready;
}
