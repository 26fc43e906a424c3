//! The suppression lookups of concurrent deliveries, asked together. Every delivery looks its
//! recipients up in `mailroom_suppressions` before it waits for an SMTP session; asked one by
//! one that is a statement per email, more than the grouped claims and records together. As the
//! ledger groups its writes (`db/group.rs`), [`Screens`] answers whatever lookups are waiting
//! with one statement: nothing waits for a batch to fill, the first lookup goes at once, and
//! those that arrive while two statements are in flight go in the next. A statement slower than
//! [`SLOW`] (its pool waiting for a connection: the database down or refusing) gives its place
//! to the next batch, so no lookup waits behind another's acquire timeout before its own. Each
//! delivery gets the entries of its own addresses only; a failed statement is every member's
//! error.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::db::Database;
use crate::db::suppressions::Suppression;

/// The error of a lookup; shared, because a batch's error is every member's.
pub type LookupError = Arc<sqlx::Error>;

/// Lookups in one statement at most: the addresses of this many deliveries.
const MAX_BATCH: usize = 64;
/// Statements in flight at once, unless they are slow.
const IN_FLIGHT: usize = 2;
/// A statement running longer than this no longer holds back the next batch: a lookup takes a
/// millisecond or two, and one that waits for a connection may wait the pool's acquire timeout.
const SLOW: Duration = Duration::from_millis(50);

/// Suppression lookups, batched once [`Screens::batched`] spawned the task that asks them.
#[derive(Clone, Debug)]
pub struct Screens {
    db: Database,
    queue: Option<mpsc::Sender<Ask>>,
    /// Statements asked so far (batched or not).
    statements: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Ask {
    keys: Vec<String>,
    reply: oneshot::Sender<Result<Vec<Suppression>, LookupError>>,
}

impl Screens {
    /// Each lookup its own statement.
    pub fn direct(db: Database) -> Screens {
        Screens {
            db,
            queue: None,
            statements: Arc::default(),
        }
    }

    /// Batched lookups; spawns the asking task on the current runtime (it ends when the last
    /// clone is dropped).
    pub fn batched(self) -> Screens {
        let (tx, rx) = mpsc::channel(MAX_BATCH * 4);
        tokio::spawn(ask_batches(self.db.clone(), rx, self.statements.clone()));
        Screens {
            queue: Some(tx),
            ..self
        }
    }

    /// Statements asked so far.
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// One statement of its own.
    async fn alone(&self, keys: &[String]) -> Result<Vec<Suppression>, LookupError> {
        self.statements.fetch_add(1, Ordering::Relaxed);
        self.db.suppressed_among(keys).await.map_err(Arc::new)
    }

    /// The entries among `keys` (normalised addresses, as `suppressions::key` makes them).
    pub async fn suppressed_among(
        &self,
        keys: Vec<String>,
    ) -> Result<Vec<Suppression>, LookupError> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let Some(queue) = &self.queue else {
            return self.alone(&keys).await;
        };
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::error::SendError(ask)) = queue.send(Ask { keys, reply }).await {
            return self.alone(&ask.keys).await;
        }
        match answer.await {
            Ok(answer) => answer,
            Err(_) => Err(Arc::new(sqlx::Error::PoolClosed)),
        }
    }
}

/// Takes the waiting lookups, up to [`MAX_BATCH`], once a statement slot is free (or the
/// statement holding it has run [`SLOW`]), and asks them in one statement on a task of its own.
async fn ask_batches(db: Database, mut rx: mpsc::Receiver<Ask>, statements: Arc<AtomicU64>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Ok(slot) = slots.clone().acquire_owned().await {
        let Some(first) = rx.recv().await else { return };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(ask) => batch.push(ask),
                Err(_) => break,
            }
        }
        let db = db.clone();
        statements.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let statement = answer(&db, batch);
            tokio::pin!(statement);
            tokio::select! {
                () = &mut statement => {}
                () = tokio::time::sleep(SLOW) => {
                    drop(slot);
                    statement.await;
                }
            }
        });
    }
}

/// One statement for every address of `batch`; each member gets the entries of its own.
async fn answer(db: &Database, batch: Vec<Ask>) {
    let mut keys: Vec<String> = batch.iter().flat_map(|a| a.keys.iter().cloned()).collect();
    keys.sort_unstable();
    keys.dedup();
    let found = db.suppressed_among(&keys).await.map_err(Arc::new);
    for ask in batch {
        let mine = match &found {
            Ok(found) => Ok(found
                .iter()
                .filter(|s| ask.keys.contains(&s.address))
                .cloned()
                .collect()),
            Err(e) => Err(e.clone()),
        };
        let _ = ask.reply.send(mine);
    }
}
