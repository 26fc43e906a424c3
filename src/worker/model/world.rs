//! The world's bookkeeping under the steps: the clock, the ledger's writes (the guards of
//! `record` and `release` in `db/postgres.rs`), the windows a takeover opens, and the names of
//! workers, copies and tokens, which do not matter.

use super::{Class, Copy, Delivery, Row, RowStatus, Step, Unrecorded, WORKERS, World, Write};

/// Time may pass unless a send's whole-send timeout is due: then the send ends first.
pub(super) fn can_tick(world: &World) -> bool {
    let due = world.workers.iter().flatten().any(|d| {
        matches!(
            d.step,
            Step::Sending { left: 0, .. } | Step::Replying { left: 0, .. }
        )
    });
    let running = world.row.is_some_and(|r| r.lease > 0)
        || world.copies.iter().any(|c| matches!(c, Copy::Delayed(_)))
        || world
            .workers
            .iter()
            .flatten()
            .any(|d| d.step.deadline().is_some_and(|t| t > 0));
    running && !due
}

pub(super) fn tick(world: &mut World) {
    if let Some(row) = &mut world.row {
        row.lease = row.lease.saturating_sub(1);
    }
    for copy in &mut world.copies {
        if let Copy::Delayed(n) = copy {
            *copy = if *n <= 1 {
                Copy::Ready
            } else {
                Copy::Delayed(*n - 1)
            };
        }
    }
    for d in world.workers.iter_mut().flatten() {
        d.step = d.step.ticked();
    }
}

impl Step {
    /// The step one tick later: every deadline and send timeout one closer.
    fn ticked(self) -> Step {
        match self {
            Step::Claiming { deadline } => Step::Claiming {
                deadline: deadline.saturating_sub(1),
            },
            Step::Claimed { deadline, attempt } => Step::Claimed {
                deadline: deadline.saturating_sub(1),
                attempt,
            },
            Step::Sending {
                deadline,
                left,
                attempt,
            } => Step::Sending {
                deadline: deadline.saturating_sub(1),
                left: left - 1,
                attempt,
            },
            Step::Replying {
                deadline,
                left,
                attempt,
            } => Step::Replying {
                deadline: deadline.saturating_sub(1),
                left: left - 1,
                attempt,
            },
            Step::Writing { write, deadline } => Step::Writing {
                write,
                deadline: deadline.saturating_sub(1),
            },
            step @ Step::Settling(_) => step,
        }
    }

    pub(super) fn attempt(self) -> u8 {
        match self {
            Step::Claimed { attempt, .. }
            | Step::Sending { attempt, .. }
            | Step::Replying { attempt, .. } => attempt,
            _ => unreachable!("no claim in {self:?}"),
        }
    }
}

impl World {
    pub(super) fn delivery(&mut self, w: usize) -> &mut Delivery {
        self.workers[w].as_mut().expect("the worker has a delivery")
    }

    /// Worker `w` stops trying to record its accepted email (`why`): the row keeps that.
    pub(super) fn leave_unrecorded(&mut self, w: usize, why: Unrecorded) {
        let token = self.delivery(w).token;
        if let Some(row) = self.row.as_mut()
            && row.token == token
            && row.unrecorded == Some(Unrecorded::Live)
        {
            row.unrecorded = Some(why);
        }
    }

    /// A takeover of `row`: if its email was accepted and not recorded, that is a window,
    /// counted by what its holder became (see [`super::Windows`]).
    pub(super) fn count_window(&mut self, row: Row) {
        let recording = self.workers.iter().flatten().any(|d| {
            d.token == row.token
                && matches!(
                    d.step,
                    Step::Writing {
                        write: Write::Sent,
                        ..
                    }
                )
        });
        let count = match row.unrecorded {
            None => return,
            Some(Unrecorded::Live) if !recording => return,
            Some(Unrecorded::Live | Unrecorded::GaveUp) => &mut self.windows.unrecorded,
            Some(Unrecorded::Crashed) => &mut self.windows.crashed,
            Some(Unrecorded::ReplyLost) => &mut self.windows.reply_lost,
        };
        *count += 1;
    }

    /// Applies a ledger write with `token` (see `record` and `release` in `db/postgres.rs`).
    /// Without `guarded` (a broken design, for the test that shows the guard matters), any
    /// write lands whatever the row's token.
    pub(super) fn write(&mut self, write: Write, token: Option<u8>, guarded: bool) {
        let Some(row) = &mut self.row else { return };
        let ours = !guarded || row.token == token;
        match write {
            Write::Sent if ours => {
                row.status = RowStatus::Sent;
                row.lease = 0;
                row.unrecorded = None;
            }
            Write::Result {
                status,
                class,
                then: _,
            } if ours => {
                row.status = status;
                row.class = class;
                row.lease = 0;
            }
            Write::UncertainExpired if row.status == RowStatus::Sending && row.lease == 0 => {
                row.status = RowStatus::Uncertain;
                row.class = Some(Class::Uncertain);
                self.seen.expired_uncertain = true;
            }
            Write::Release if ours => {
                row.status = RowStatus::Failed;
                row.attempts = row.attempts.saturating_sub(1);
                row.lease = 0;
                row.token = None;
            }
            _ => {}
        }
    }

    /// The world up to the names of workers, copies and tokens: the least of the four worlds
    /// that swap workers and copies (all workers, all copies are alike).
    pub(super) fn representative(&self) -> World {
        let mut best: Option<World> = None;
        for swap_workers in [false, true] {
            for swap_copies in [false, true] {
                let mut world = self.clone();
                if swap_workers {
                    world.workers.swap(0, 1);
                }
                if swap_copies {
                    world.copies.swap(0, 1);
                    for d in world.workers.iter_mut().flatten() {
                        d.copy = 1 - d.copy;
                    }
                }
                world.rename_tokens();
                if best.as_ref().is_none_or(|b| world < *b) {
                    best = Some(world);
                }
            }
        }
        best.expect("four candidates")
    }

    /// Renames claim tokens to 1, 2, 3 in order of appearance (row, then workers): tokens are
    /// only compared for equality, so worlds that differ by names only are one world.
    pub(super) fn rename_tokens(&mut self) {
        let mut names: Vec<u8> = Vec::with_capacity(1 + WORKERS);
        let mut rename = |token: &mut Option<u8>| {
            if let Some(t) = token {
                let i = names.iter().position(|n| n == t).unwrap_or_else(|| {
                    names.push(*t);
                    names.len() - 1
                });
                *t = i as u8 + 1;
            }
        };
        if let Some(row) = &mut self.row {
            rename(&mut row.token);
        }
        for d in self.workers.iter_mut().flatten() {
            rename(&mut d.token);
        }
        debug_assert!(names.len() <= 1 + WORKERS);
    }
}
