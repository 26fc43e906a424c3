//! The transactional outbox `mailroom_outbox`: producers insert a job inside their own
//! transaction ([`enqueue`]); the relay claims batches of unpublished rows with
//! `FOR UPDATE SKIP LOCKED` ([`Database::claim_outbox_batch`]), publishes them, and marks the
//! ones the broker confirmed in the same transaction.
//!
//! Rows are selected by state (`published_at IS NULL`), never by "id greater than the last one
//! seen": ids are allocated before commit, so a slow transaction can commit a smaller id after
//! a larger one was published, and a high-water mark would skip it forever.

use std::future::Future;
use std::time::Duration;

use sqlx::{MySql, MySqlConnection, PgConnection, Postgres, Transaction};

use super::{Database, mysql, postgres, refused};
use crate::door::{self, Admitted};
use crate::job::{EmailJob, JobError};
use crate::render::Templates;

pub use super::rows::{OutboxStatus, PendingRow};

/// The channel the PostgreSQL outbox trigger notifies.
pub const NOTIFY_CHANNEL: &str = "mailroom_outbox";

/// What [`enqueue`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// A new row, with its outbox id.
    New(i64),
    /// The same `(job_id, kind)` was enqueued before; nothing was written.
    AlreadyQueued,
}

/// Why a job could not be enqueued.
#[derive(Debug, thiserror::Error)]
pub enum EnqueueError {
    #[error(transparent)]
    Invalid(#[from] JobError),
    #[error("writing the outbox row: {0}")]
    Database(#[from] sqlx::Error),
}

/// A connection or transaction of either engine that [`enqueue`] can write to:
/// `PgConnection`, `MySqlConnection` and `Transaction`s of both.
pub trait OutboxWriter: Send {
    /// Inserts one row unless `(job_id, kind)` exists; returns the new id, or `None`.
    #[doc(hidden)]
    fn insert_outbox_row<'a>(
        &'a mut self,
        job_id: &'a str,
        kind: &'a str,
        payload: String,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a;
}

impl OutboxWriter for PgConnection {
    fn insert_outbox_row<'a>(
        &'a mut self,
        job_id: &'a str,
        kind: &'a str,
        payload: String,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a {
        postgres::insert_outbox_row(self, job_id, kind, payload)
    }
}

impl OutboxWriter for MySqlConnection {
    fn insert_outbox_row<'a>(
        &'a mut self,
        job_id: &'a str,
        kind: &'a str,
        payload: String,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a {
        mysql::insert_outbox_row(self, job_id, kind, payload)
    }
}

impl<DB: sqlx::Database> OutboxWriter for Transaction<'_, DB>
where
    DB::Connection: OutboxWriter,
{
    fn insert_outbox_row<'a>(
        &'a mut self,
        job_id: &'a str,
        kind: &'a str,
        payload: String,
    ) -> impl Future<Output = Result<Option<i64>, sqlx::Error>> + Send + 'a {
        (**self).insert_outbox_row(job_id, kind, payload)
    }
}

/// Validates `job` and inserts it into the outbox inside the caller's transaction, so the email
/// exists if and only if the caller's business rows commit. Works on a PostgreSQL or a
/// MySQL/MariaDB transaction (or a bare connection, where the row commits on its own):
///
/// ```no_run
/// # async fn example(pool: sqlx::PgPool, job: mailroom::job::EmailJob) -> anyhow::Result<()> {
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (1042)").execute(&mut *tx).await?;
/// mailroom::db::outbox::enqueue(&mut tx, &job).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// The validation is [`door::admit`] without templates: the size on the bytes the worker will
/// read, ids, addresses, headers. A job without `created_at` gets the current time.
pub async fn enqueue<C: OutboxWriter + ?Sized>(
    conn: &mut C,
    job: &EmailJob,
) -> Result<Enqueued, EnqueueError> {
    let admitted = admit_for_outbox(job, None)?;
    Ok(insert_admitted(conn, &admitted).await?)
}

/// The outbox door: fills in `created_at` (it counts toward the size), then [`door::admit`].
pub fn admit_for_outbox(
    job: &EmailJob,
    templates: Option<&Templates>,
) -> Result<Admitted, JobError> {
    let mut job = job.clone();
    job.created_at.get_or_insert_with(chrono::Utc::now);
    door::admit(job, templates)
}

/// Inserts a job a door admitted: its canonical body, exactly what the relay will publish.
pub async fn insert_admitted<C: OutboxWriter + ?Sized>(
    conn: &mut C,
    admitted: &Admitted,
) -> Result<Enqueued, sqlx::Error> {
    let job = admitted.job();
    let id = conn
        .insert_outbox_row(&job.job_id, &job.kind, admitted.body_text())
        .await?;
    Ok(id.map_or(Enqueued::AlreadyQueued, Enqueued::New))
}

/// A transaction holding the row locks of one relay batch: other relays skip these rows until
/// it commits (or its connection dies, which rolls it back and frees them). Its rows are
/// marked published as they are claimed (`publish_attempts` counted): the marks commit only
/// after the broker confirmed, and what was not published is un-marked first
/// ([`OutboxBatch::unmark`], [`OutboxBatch::mark_publish_failed`]).
pub struct OutboxBatch {
    tx: BatchTx,
    pub rows: Vec<PendingRow>,
}

enum BatchTx {
    Postgres(Transaction<'static, Postgres>),
    MySql(Transaction<'static, MySql>),
}

impl OutboxBatch {
    /// Claims (and marks) up to `limit` more rows in this transaction (into `rows`): rows
    /// committed since its last claim, never the ones it claimed already. Each statement reads
    /// what is committed when it runs (READ COMMITTED on both engines).
    pub async fn claim_more(&mut self, limit: i64, from: i64) -> Result<(), sqlx::Error> {
        self.rows = match &mut self.tx {
            BatchTx::Postgres(tx) => postgres::claim_outbox_batch(tx, limit, from).await?,
            BatchTx::MySql(tx) => mysql::claim_outbox_batch(tx, limit).await?,
        };
        Ok(())
    }

    /// Un-marks claimed rows that were not published (the tail of a batch cut by its bytes):
    /// unpublished, their attempt not counted.
    pub async fn unmark(&mut self, ids: &[i64]) -> Result<(), sqlx::Error> {
        if ids.is_empty() {
            return Ok(());
        }
        match &mut self.tx {
            BatchTx::Postgres(tx) => postgres::unmark(tx, ids).await,
            BatchTx::MySql(tx) => mysql::unmark(tx, ids).await,
        }
    }

    /// Records a refused publish: the row is unpublished again, its attempt counted, and
    /// retried after `retry_in`, or parked when `park`.
    pub async fn mark_publish_failed(
        &mut self,
        id: i64,
        error: &str,
        retry_in: Duration,
        park: bool,
    ) -> Result<(), sqlx::Error> {
        match &mut self.tx {
            BatchTx::Postgres(tx) => {
                postgres::mark_publish_failed(tx, id, error, retry_in, park).await
            }
            BatchTx::MySql(tx) => mysql::mark_publish_failed(tx, id, error, retry_in, park).await,
        }
    }

    /// Records a row the relay refused as `dead` (class `invalid`) unless the ledger has a row
    /// for it, in the batch's transaction: it commits with the row's mark, after the dead
    /// letter was confirmed.
    pub async fn record_refused(
        &mut self,
        row: &PendingRow,
        reason: &str,
    ) -> Result<bool, sqlx::Error> {
        match &mut self.tx {
            BatchTx::Postgres(tx) => {
                refused::pg_insert_dead(tx, &row.job_id, &row.kind, reason).await
            }
            BatchTx::MySql(tx) => refused::my_insert_dead(tx, &row.job_id, &row.kind, reason).await,
        }
    }

    /// Commits the marks and releases the row locks.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        match self.tx {
            BatchTx::Postgres(tx) => tx.commit().await,
            BatchTx::MySql(tx) => tx.commit().await,
        }
    }
}

impl Database {
    /// Enqueues `job` in a transaction of its own (the CLI and the HTTP API; applications
    /// call [`enqueue`] inside theirs).
    pub async fn enqueue(&self, job: &EmailJob) -> Result<Enqueued, EnqueueError> {
        match self {
            Database::Postgres(pool) => enqueue(&mut *pool.acquire().await?, job).await,
            Database::MySql(pool) => enqueue(&mut *pool.acquire().await?, job).await,
        }
    }

    /// Inserts a job a door admitted, in a transaction of its own.
    pub async fn enqueue_admitted(&self, admitted: &Admitted) -> Result<Enqueued, sqlx::Error> {
        match self {
            Database::Postgres(pool) => {
                insert_admitted(&mut *pool.acquire().await?, admitted).await
            }
            Database::MySql(pool) => insert_admitted(&mut *pool.acquire().await?, admitted).await,
        }
    }

    /// Locks (and marks, uncommitted) up to `limit` publishable rows in id order, skipping rows
    /// other relays hold.
    pub async fn claim_outbox_batch(
        &self,
        limit: i64,
        from: i64,
    ) -> Result<OutboxBatch, sqlx::Error> {
        Ok(match self {
            Database::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                let rows = postgres::claim_outbox_batch(&mut tx, limit, from).await?;
                OutboxBatch {
                    tx: BatchTx::Postgres(tx),
                    rows,
                }
            }
            Database::MySql(pool) => {
                let mut tx = pool.begin().await?;
                let rows = mysql::claim_outbox_batch(&mut tx, limit).await?;
                OutboxBatch {
                    tx: BatchTx::MySql(tx),
                    rows,
                }
            }
        })
    }

    /// Whether any row is ready to publish: one cheap statement without locks, so an idle
    /// polling relay costs one query per poll.
    pub async fn outbox_has_work(&self, from: i64) -> Result<bool, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::outbox_has_work(pool, from).await,
            Database::MySql(pool) => mysql::outbox_has_work(pool).await,
        }
    }

    /// PostgreSQL: the last outbox id handed out and the transactions writing to the outbox
    /// now, one of which may hold an id up to it uncommitted ([`ScanFloor`]); `None` on MySQL,
    /// whose scans need no floor (InnoDB purges the index entries of published rows as it goes).
    ///
    /// [`ScanFloor`]: crate::relay::floor::ScanFloor
    pub async fn outbox_ids_in_doubt(&self) -> Result<Option<(i64, Vec<String>)>, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::outbox_ids_in_doubt(pool).await.map(Some),
            Database::MySql(_) => Ok(None),
        }
    }

    /// PostgreSQL: whether every one of `writing` has ended (always true on MySQL).
    pub async fn outbox_writers_ended(&self, writing: &[String]) -> Result<bool, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::transactions_ended(pool, writing).await,
            Database::MySql(_) => Ok(true),
        }
    }

    /// The smallest id from `from` on of a row unpublished and unparked, due or not.
    pub async fn first_pending_outbox_id(&self, from: i64) -> Result<Option<i64>, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::first_pending_id(pool, from).await,
            Database::MySql(_) => Ok(None),
        }
    }

    /// The shortest time the server lets a transaction of this pool's sessions stay open or
    /// idle before it ends the session (`None`: no such limit): PostgreSQL's
    /// `idle_in_transaction_session_timeout` and `transaction_timeout`; MariaDB's
    /// `idle_transaction_timeout` and `idle_write_transaction_timeout`, and `wait_timeout`
    /// on both MySQL and MariaDB. The relay holds its marks well inside it.
    pub async fn transaction_idle_limit(&self) -> Result<Option<Duration>, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::transaction_idle_limit(pool).await,
            Database::MySql(pool) => mysql::transaction_idle_limit(pool).await,
        }
    }

    /// Deletes up to `limit` rows published more than `age` ago; returns how many went.
    pub async fn delete_published_before(
        &self,
        age: Duration,
        limit: i64,
    ) -> Result<u64, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::delete_published_before(pool, age, limit).await,
            Database::MySql(pool) => mysql::delete_published_before(pool, age, limit).await,
        }
    }

    /// Reads the outbox row of `(job_id, kind)`.
    pub async fn outbox_status(
        &self,
        job_id: &str,
        kind: &str,
    ) -> Result<Option<OutboxStatus>, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::outbox_status(pool, job_id, kind).await,
            Database::MySql(pool) => mysql::outbox_status(pool, job_id, kind).await,
        }
    }

    /// Age in seconds of the oldest unpublished, unparked outbox row (the relay lag), or `None`
    /// when the relay is caught up. Oldest by id, which follows the pending index: one row read.
    pub async fn oldest_unpublished_age(&self) -> Result<Option<f64>, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::oldest_unpublished_age(pool).await,
            Database::MySql(pool) => mysql::oldest_unpublished_age(pool).await,
        }
    }

    /// Unpublished outbox rows: `(pending, parked)`, the relay's backlog and the rows it set
    /// aside for an operator.
    pub async fn outbox_backlog(&self) -> Result<(i64, i64), sqlx::Error> {
        const BACKLOG: &str = "SELECT
             (SELECT count(*) FROM mailroom_outbox WHERE published_at IS NULL AND parked_at IS NULL),
             (SELECT count(*) FROM mailroom_outbox WHERE published_at IS NULL AND parked_at IS NOT NULL)";
        match self {
            Database::Postgres(pool) => sqlx::query_as(BACKLOG).fetch_one(pool).await,
            Database::MySql(pool) => sqlx::query_as(BACKLOG).fetch_one(pool).await,
        }
    }

    /// Every kind known for `job_id`, in the outbox or the ledger, sorted.
    pub async fn kinds_of_job(&self, job_id: &str) -> Result<Vec<String>, sqlx::Error> {
        match self {
            Database::Postgres(pool) => postgres::kinds_of_job(pool, job_id).await,
            Database::MySql(pool) => mysql::kinds_of_job(pool, job_id).await,
        }
    }
}
