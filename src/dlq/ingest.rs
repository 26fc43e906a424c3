//! Ingesting `<ns>.dead` into `mailroom_dead_letters`: a consumer with manual acks that stores
//! each letter ([`stored::new_letter`]) and acks it only after its row commits. Letters that
//! have arrived together are stored in one transaction and acked with one `basic.ack` (up to
//! [`GROUP`] letters; a group takes no more once its bodies reach [`stored::MAX_STORED_BODY`]);
//! a group the database does not take whole is stored letter by letter. A crash between the commit and the ack
//! redelivers the letters, and the idempotent insert (the letter's key) makes each one row
//! still; nothing is lost between the queue and the table.
//!
//! Where it runs: every `mailroom worker` process, and `serve` and `run`, as competing
//! consumers of `<ns>.dead` ([`Ingester::run`]): wherever dead letters are made or browsed,
//! with no extra process to deploy, and any one of them is enough. `mailroom dlq ingest`
//! ([`drain`]) takes what is there once and exits, for cron, operators and tests.
//!
//! A database outage (or a database that refuses the rows) pauses ingesting: the letters in
//! hand are held, neither acked nor handed back, and stored again with backoff until the
//! database takes them (one WARN line when the pause begins, one INFO when it ends). A letter
//! handed back is a delivery spent, and on RabbitMQ 4 a quorum queue drops a message after its
//! delivery limit (20 unless a policy lifts it; `<ns>.dead` has nowhere to dead-letter it), so
//! letters go back only when a process stops, with a `basic.nack` ([`hand_back`]).
//!
//! An oversize letter (body above [`stored::MAX_STORED_BODY`]) is stored with the head of its
//! body and its size, logged as an ERROR, and acked: the queue never sticks on it and its row
//! says what was cut.

mod session;

use std::time::Duration;

use anyhow::Context;
use futures_util::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions,
    BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Consumer};
use serde::Serialize;

use super::{DeadLetters, stored};
use crate::broker::{self, Topology};
use crate::config::UrlList;
use crate::db::Database;
use crate::db::dead_letters::NewDeadLetter;

pub use session::{Ingester, STOP_PATIENCE};

/// The failpoint between a letter's committed row and its ack (the kill test's point).
pub const AFTER_INSERT: &str = "dlq.after_insert";
/// The failpoint inside the ack's bound: held there, the ack stands for one lapin never resolves.
pub const IN_ACK: &str = "dlq.in_ack";

/// What storing one letter did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// A new row.
    New,
    /// Its row was there already (a redelivery).
    Again,
}

/// Why a letter could not be stored: the database did not take it. The letter stays in the
/// queue.
#[derive(Debug, thiserror::Error)]
#[error("storing dead letter {job_id}: {source}")]
pub struct NotStored {
    pub job_id: String,
    #[source]
    pub source: sqlx::Error,
}

/// What a [`drain`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Drained {
    /// New rows.
    pub ingested: usize,
    /// Letters whose row was there already.
    pub duplicates: usize,
}

/// Letters stored in one transaction at most.
pub const GROUP: usize = 100;

/// The row of a letter; an oversize one is logged.
fn row_of(d: &Delivery) -> NewDeadLetter {
    let row = stored::new_letter(d);
    if row.body_size > row.body.len() as i64 {
        tracing::error!(job_id = %row.job_id, kind = %row.kind, size = row.body_size,
            "oversize dead letter: its row keeps only the first {} bytes of the body", row.body.len());
    }
    row
}

/// Stores one letter's row (not acking the letter). A value the database refuses (a data
/// error) is stored again with only the head of the body, so one odd letter never blocks the
/// queue.
async fn store_row(db: &Database, mut row: NewDeadLetter) -> Result<Stored, NotStored> {
    let mut result = db.insert_dead_letters(std::slice::from_ref(&row)).await;
    if let Err(e) = &result
        && crate::db::is_data_error(e)
    {
        tracing::error!(job_id = %row.job_id, error = %e,
            "dead letter refused by the database; storing it with only the head of its body");
        row.body.truncate(stored::OVERSIZE_KEPT.min(row.body.len()));
        row.body_size = row.body_size.max(stored::MAX_STORED_BODY as i64 + 1);
        result = db.insert_dead_letters(std::slice::from_ref(&row)).await;
    }
    match result.map(|stored| stored.first().map(|&(_, new)| new)) {
        Ok(Some(true)) => Ok(Stored::New),
        Ok(Some(false)) => Ok(Stored::Again),
        Ok(None) => unreachable!("one letter in, one answer out"),
        Err(source) => Err(NotStored {
            job_id: row.job_id,
            source,
        }),
    }
}

/// The rows of letters, each oversize one logged once.
fn rows_of(letters: &[Delivery]) -> Vec<NewDeadLetter> {
    letters.iter().map(row_of).collect()
}

/// Stores rows (not acking their letters): all in one transaction, or, when that fails (a value
/// the database refuses, two ingesters' groups in a deadlock, the database down), each on its
/// own as [`store_row`] does, so one odd letter never blocks the others.
async fn store_all(db: &Database, rows: &[NewDeadLetter]) -> Result<Vec<Stored>, NotStored> {
    if rows.len() > 1 {
        match db.insert_dead_letters(rows).await {
            Ok(stored) => {
                return Ok(stored
                    .into_iter()
                    .map(|(_, new)| if new { Stored::New } else { Stored::Again })
                    .collect());
            }
            Err(e) => tracing::debug!(error = %e, letters = rows.len(),
                "a group of dead letters was not stored together; storing each on its own"),
        }
    }
    let mut stored = Vec::with_capacity(rows.len());
    for row in rows {
        stored.push(store_row(db, row.clone()).await?);
    }
    Ok(stored)
}

/// Acks stored letters delivered in order on one channel with one `basic.ack` (`multiple`, up
/// to the last): every earlier delivery of the channel is acked already.
async fn ack_stored(letters: &[Delivery]) -> anyhow::Result<()> {
    let Some(last) = letters.last() else {
        return Ok(());
    };
    crate::failpoint::hit(AFTER_INSERT).await;
    let multiple = BasicAckOptions { multiple: true };
    let ack = async {
        crate::failpoint::hit(IN_ACK).await;
        last.ack(multiple).await
    };
    match tokio::time::timeout(broker::SETTLE_TIMEOUT, ack).await {
        Ok(Ok(true)) => Ok(()),
        Ok(Ok(false)) => anyhow::bail!(
            "the channel closed before the ack (the letters are stored; a redelivery is one row)"
        ),
        Ok(Err(e)) => Err(e).context("acking stored dead letters"),
        Err(_) => anyhow::bail!(
            "the ack of {} stored dead letters was not written within {:?} (the broker redelivers them, and each is one row still)",
            letters.len(),
            broker::SETTLE_TIMEOUT
        ),
    }
}

/// Hands every letter of the channel not acked back to the queue with one `basic.nack`
/// (`requeue`, `multiple` from delivery tag 0) before the channel closes: RabbitMQ 4.3 and later
/// count a letter handed back by a closing channel towards the queue's delivery limit, and a
/// nacked one not.
async fn hand_back(ch: &Channel) {
    let back = BasicNackOptions {
        multiple: true,
        requeue: true,
    };
    let _ = tokio::time::timeout(broker::GOODBYE_TIMEOUT, ch.basic_nack(0, back)).await;
}

/// Whether a group holding `letters` (their bodies `bytes` in all) takes no more: [`GROUP`]
/// letters, or bodies that reach [`stored::MAX_STORED_BODY`], the share of InnoDB's redo log
/// one transaction is meant to write. The letter that reaches it still goes in, so a group of
/// large letters can write up to twice that; one the database refuses is stored letter by
/// letter.
fn group_is_full(letters: usize, bytes: usize) -> bool {
    letters >= GROUP || bytes >= stored::MAX_STORED_BODY
}

/// Takes every letter that is in `<ns>.dead` now into the table, in groups, then returns: the
/// one-shot `mailroom dlq ingest`. Letters arriving meanwhile are taken too, up to a group
/// more; beyond that they are left for the next run.
///
/// The letters there at the start are consumed (up to [`DRAIN_PREFETCH`] on their way at once:
/// on a quorum queue each `basic.get` is a command through the queue's log, a consumer's
/// deliveries are not); the drain then ends with `basic.get`s, the last of which finds the
/// queue empty.
pub async fn drain(urls: &UrlList, topology: &Topology, db: &Database) -> anyhow::Result<Drained> {
    let conn = broker::connect(urls, "mailroom dlq ingest").await?;
    let result = async {
        let ch = conn.create_channel().await?;
        let queue = topology.dead.as_str();
        let ready = ready_in(&ch, queue).await?;
        let mut drain = Drain {
            ch: &ch,
            db,
            done: Drained::default(),
        };
        // Letters that arrive meanwhile are taken too, up to a group more.
        let bound = usize::try_from(ready)
            .unwrap_or(usize::MAX)
            .saturating_add(GROUP);
        let mut taken = 0;
        if ready > 0 {
            taken = drain.consume(queue, bound).await?;
        }
        while taken < bound {
            let (mut group, mut bytes) = (Vec::new(), 0);
            while taken + group.len() < bound && !group_is_full(group.len(), bytes) {
                let got = ch
                    .basic_get(queue.into(), BasicGetOptions { no_ack: false })
                    .await
                    .with_context(|| format!("reading from {queue}"))?;
                let Some(message) = got else { break };
                bytes += message.delivery.data.len();
                group.push(message.delivery);
            }
            // A quorum queue may drop acks still pending when the channel closes, and hand
            // their letters back (rabbitmq-server#10327). It applies one channel's commands in
            // order, so a basic.get answered after the acks were sent means they were applied:
            // the drain ends on a get that finds the queue empty, after every ack before it.
            if group.is_empty() {
                break;
            }
            taken += group.len();
            drain.take(&group).await?;
        }
        // The acks are frames on this channel: its Close-Ok comes after the broker handled
        // them. Closing the connection at once could overtake the last ack, and the letter
        // would go back to the queue (stored, but still counted there as dead).
        let _ = ch.close(200, "ingested".into()).await;
        anyhow::Ok(drain.done)
    }
    .await;
    let _ = conn.close(200, "ingested".into()).await;
    result
}

/// `first` and the letters that have arrived after it on `consumer`, up to a full group: one
/// group, one commit, one ack.
fn group_with(first: Delivery, consumer: &mut Consumer) -> lapin::Result<Vec<Delivery>> {
    let mut bytes = first.data.len();
    let mut group = vec![first];
    while !group_is_full(group.len(), bytes) {
        let Some(Some(next)) = consumer.next().now_or_never() else {
            break;
        };
        let next = next?;
        bytes += next.data.len();
        group.push(next);
    }
    Ok(group)
}

/// Letters a [`drain`] consumes may be on their way to it at once: two groups, so one is
/// arriving while the last is stored.
pub const DRAIN_PREFETCH: u16 = 2 * GROUP as u16;

/// How long a [`drain`]'s consumer waits for a letter before it asks the queue whether any is
/// left (other ingesters may have taken them).
const DRAIN_IDLE: Duration = Duration::from_millis(100);

/// The letters ready in `queue` (a passive declare).
async fn ready_in(ch: &Channel, queue: &str) -> anyhow::Result<u32> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    Ok(ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await
        .with_context(|| format!("reading queue {queue}"))?
        .message_count())
}

/// A [`drain`] under way: its channel, and what it stored.
struct Drain<'a> {
    ch: &'a Channel,
    db: &'a Database,
    done: Drained,
}

impl Drain<'_> {
    /// Stores a group delivered in order on the channel, then acks it; one the database does
    /// not take is handed back, with every other letter of the channel.
    async fn take(&mut self, group: &[Delivery]) -> anyhow::Result<()> {
        let stored = match store_all(self.db, &rows_of(group)).await {
            Ok(stored) => stored,
            Err(e) => {
                hand_back(self.ch).await;
                let _ = self.ch.close(200, "not stored".into()).await;
                return Err(e.into());
            }
        };
        ack_stored(group).await?;
        for stored in stored {
            match stored {
                Stored::New => self.done.ingested += 1,
                Stored::Again => self.done.duplicates += 1,
            }
        }
        Ok(())
    }

    /// Consumes `queue` in groups until `bound` letters are taken or none is left ready, then
    /// cancels and takes the letters still on their way; returns how many it took.
    async fn consume(&mut self, queue: &str, bound: usize) -> anyhow::Result<usize> {
        self.ch
            .basic_qos(DRAIN_PREFETCH, BasicQosOptions::default())
            .await?;
        let mut consumer = self
            .ch
            .basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("consuming {queue}"))?;
        let mut taken = 0;
        let mut cancelled = false;
        loop {
            if !cancelled && taken >= bound {
                self.ch
                    .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                    .await?;
                cancelled = true;
            }
            let first = if cancelled {
                // Cancel-Ok follows every delivery sent before it: the stream ends after them.
                consumer.next().await
            } else {
                match tokio::time::timeout(DRAIN_IDLE, consumer.next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        if ready_in(self.ch, queue).await? == 0 {
                            self.ch
                                .basic_cancel(consumer.tag(), BasicCancelOptions::default())
                                .await?;
                            cancelled = true;
                        }
                        continue;
                    }
                }
            };
            let Some(first) = first else {
                return Ok(taken);
            };
            let first = first?;
            let group = group_with(first, &mut consumer)?;
            taken += group.len();
            self.take(&group).await?;
        }
    }
}

impl DeadLetters {
    /// [`drain`] into this table.
    pub async fn ingest_once(
        &self,
        urls: &UrlList,
        topology: &Topology,
    ) -> anyhow::Result<Drained> {
        drain(urls, topology, &self.db).await
    }
}

/// How often the retention runs in a long-running ingester.
pub const RETENTION_EVERY: Duration = Duration::from_secs(3600);
