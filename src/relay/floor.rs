//! Where the relay's scans of the outbox start on PostgreSQL. Marking a row published leaves
//! its entry in the partial index of pending rows until a `VACUUM` cleans the index, and rows
//! are published in id order, so those entries lie in front of the first pending row and a
//! scan from the start walks all of them (about 1 ms per 200,000; autovacuum may come only
//! every 17 hours on a week's outbox). The scans start at a floor instead, below which no row
//! can still be published.
//!
//! Ids are taken before commit, so the floor never comes from the rows seen alone: a producer
//! may commit a smaller id after a larger one was published. The floor rises in two steps. One
//! reads the last id handed out, S, and the transactions writing to the outbox now (by virtual
//! transaction id); a transaction that holds an id up to S and has not committed is among them
//! (the id sequence hands ids out in order: it has no `CACHE`, as the migration made it).
//! The next, once all of those have ended, reads the first pending id from the floor on: every
//! id up to S is now committed or never will be, so the floor becomes that id, or S + 1 when
//! none is pending. A row below the floor that becomes pending again (an operator clears its
//! `parked_at`) is found by a full scan, one every `--relay-full-scan-every`; a relay's own
//! uncommitted marks read as pending to the step, so they never put their rows below it.

use std::time::Duration;

use tokio::time::Instant;

use crate::db::Database;

/// How often the floor takes a step (one or two small statements; a rise takes two steps), so
/// it trails the published rows by about a second of them.
pub const STEP_EVERY: Duration = Duration::from_millis(500);

/// The floor under the relay's scans, and its step in progress.
#[derive(Debug)]
pub struct ScanFloor {
    value: i64,
    /// The last id handed out and the transactions that were writing to the outbox then.
    in_doubt: Option<(i64, Vec<String>)>,
    full_every: Duration,
    next_full: Instant,
    next_step: Instant,
    /// The relay's count of published rows when the last round began: with none published
    /// since, there is nothing new to rise over, and an idle relay sends no statement for it.
    published: u64,
}

impl ScanFloor {
    /// A floor at 0; a full scan every `full_every` (none when zero: every scan is full).
    pub fn new(full_every: Duration) -> ScanFloor {
        let now = Instant::now();
        ScanFloor {
            value: 0,
            in_doubt: None,
            full_every,
            next_full: now + full_every,
            next_step: now,
            published: 0,
        }
    }

    /// Where a probe ("is there work?") starts: as the next claim will ([`ScanFloor::scan_from`]),
    /// without taking the full scan that may be due, which is the claim's to make.
    pub fn probe_from(&self) -> i64 {
        if self.full_every.is_zero() || Instant::now() >= self.next_full {
            return 0;
        }
        self.value
    }

    /// The id the next claim starts from: the floor, or 0 when a full scan is due (it then
    /// counts as made).
    pub fn scan_from(&mut self) -> i64 {
        if self.full_every.is_zero() {
            return 0;
        }
        let now = Instant::now();
        if now >= self.next_full {
            self.next_full = now + self.full_every;
            return 0;
        }
        self.value
    }

    pub fn value(&self) -> i64 {
        self.value
    }

    /// Whether `e` says this server will never answer the floor's statements (class 42: no
    /// privilege on the id sequence, a function this server lacks), not that it failed once.
    pub fn refused(e: &sqlx::Error) -> bool {
        matches!(e, sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("42")))
    }

    /// Every scan from the first row from now on.
    pub fn disable(&mut self) {
        self.full_every = Duration::ZERO;
        self.value = 0;
        self.in_doubt = None;
    }

    /// One step of the rise when one is due ([`STEP_EVERY`]) and the relay published rows
    /// (`published`, its running count) since the last round began; true when one was taken.
    pub async fn step(&mut self, db: &Database, published: u64) -> Result<bool, sqlx::Error> {
        let now = Instant::now();
        if self.full_every.is_zero() || now < self.next_step {
            return Ok(false);
        }
        let Some((last, writing)) = self.in_doubt.take() else {
            if published == self.published {
                return Ok(false);
            }
            self.next_step = now + STEP_EVERY;
            self.published = published;
            self.in_doubt = db.outbox_ids_in_doubt().await?;
            return Ok(self.in_doubt.is_some());
        };
        self.next_step = now + STEP_EVERY;
        if db.outbox_writers_ended(&writing).await? {
            let first = db.first_pending_outbox_id(self.value).await?;
            self.value = rise(self.value, last, first);
        } else {
            self.in_doubt = Some((last, writing));
        }
        Ok(true)
    }
}

/// The new floor: the first pending id at or above the old floor, or one past the last id
/// handed out when none is pending (every id up to `last` being settled); never lower.
fn rise(floor: i64, last: i64, first_pending: Option<i64>) -> i64 {
    let settled = last.saturating_add(1);
    first_pending
        .map_or(settled, |id| id.min(settled))
        .max(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_rises_to_the_first_pending_row_or_past_the_last_id_and_never_falls() {
        for (floor, last, first, risen) in [
            // Nothing pending: past every id handed out.
            (0, 100, None, 101),
            // A row pending below the last id: at it.
            (0, 100, Some(40), 40),
            // Pending rows above the last id were not settled when the step began: only up
            // to it.
            (0, 100, Some(150), 101),
            // Never lower than it was.
            (120, 100, None, 120),
            (60, 100, Some(60), 60),
            // No id handed out yet.
            (0, 0, None, 1),
        ] {
            assert_eq!(rise(floor, last, first), risen, "{floor} {last} {first:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_scan_comes_every_period_and_none_disables_the_floor() {
        let mut floor = ScanFloor::new(Duration::from_secs(5));
        floor.value = 500;
        assert_eq!((floor.probe_from(), floor.scan_from()), (500, 500));
        tokio::time::advance(Duration::from_secs(5)).await;
        // A probe that finds a row below the floor leaves the full scan to the claim after it.
        assert_eq!(floor.probe_from(), 0, "the full scan is due");
        assert_eq!(floor.probe_from(), 0, "a probe does not take it");
        assert_eq!(floor.scan_from(), 0, "the claim does");
        assert_eq!(floor.scan_from(), 500, "and once made, not again at once");
        assert_eq!(floor.probe_from(), 500);
        let mut off = ScanFloor::new(Duration::ZERO);
        off.value = 500;
        assert_eq!(off.scan_from(), 0);
    }
}
