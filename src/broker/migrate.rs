//! `mailroom broker migrate-dead-queue`: replaces a classic `<ns>.dead` (older versions) by the
//! quorum queue mailroom now declares, losing no letter, and safe to run again after any
//! interruption.
//!
//! A queue cannot change type, and two queues cannot share a name, so the letters pass through
//! a quorum holding queue, `<ns>.dead.migrating`:
//! 1. declare the holding queue and bind it to the DLX, then unbind the classic queue: new dead
//!    letters go to the holding queue;
//! 2. move every letter of the classic queue into it: `basic.get`, publish to the DLX with
//!    confirms (the same exchange, routing key, headers and body: the letter's identity in the
//!    table does not change), then ack the original;
//! 3. delete the classic queue (only if empty), declare the quorum `<ns>.dead`, bind it;
//! 4. unbind the holding queue, move its letters into `<ns>.dead` the same way, delete it.
//!
//! Interrupted anywhere, nothing is lost: a letter is acked only after its copy is confirmed,
//! and a run starts from what it finds (a classic `<ns>.dead`, a holding queue, both, or
//! neither). An interruption between a confirm and its ack leaves one letter twice; the
//! ingest's idempotent insert makes the two one row. The workers' ingest keeps consuming
//! throughout (from whichever queue is `<ns>.dead`), so letters also leave by that way.
//! Processes of an older version redeclare the classic queue: upgrade them all first.

use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use serde::Serialize;

use super::declare::{self, DeadQueue, Refused, bind, declare_queue, is_not_found};
use super::{Topology, confirm_channel, connect, publish_confirmed};
use crate::config::UrlList;

/// The failpoint between a moved letter's confirmed copy and the ack of its original; armed per
/// letter by its message id (`broker.migrate_mid_drain@job-3=abort`).
pub const MID_DRAIN: &str = "broker.migrate_mid_drain";

/// How many times the classic queue is drained again when letters came back into it (a
/// consumer's requeue) before it could be deleted.
const DELETE_TRIES: usize = 5;

/// What a migration did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Migrated {
    /// `<ns>.dead` was classic when the run started.
    pub was_classic: bool,
    /// Letters moved from the classic queue into the holding queue.
    pub from_classic: usize,
    /// Letters moved from the holding queue into the quorum `<ns>.dead`.
    pub from_holding: usize,
}

/// The quorum queue the letters pass through.
pub fn holding_queue(t: &Topology) -> String {
    format!("{}.migrating", t.dead)
}

/// Runs the migration (see the module's text) on a connection of its own.
pub async fn migrate_dead_queue(urls: &UrlList, t: &Topology) -> anyhow::Result<Migrated> {
    let conn = connect(urls, "mailroom broker migrate-dead-queue").await?;
    let result = migrate_on(&conn, t).await;
    let _ = conn.close(200, "migrated".into()).await;
    result
}

async fn migrate_on(conn: &Connection, t: &Topology) -> anyhow::Result<Migrated> {
    let declared = declare::declare_topology(conn, t).await?;
    let mut done = Migrated::default();
    match declared.dead_queue {
        None => {
            let why = declared.missing.iter().map(|m| m.error.as_str());
            anyhow::bail!(
                "{} cannot be declared: {}",
                t.dead,
                why.collect::<Vec<_>>().join("; ")
            );
        }
        Some(DeadQueue::Quorum) => {}
        Some(DeadQueue::Classic) => {
            done.was_classic = true;
            done.from_classic = retire_classic(conn, t).await?;
        }
    }
    let holding = holding_queue(t);
    if length(conn, &holding).await?.is_some() {
        let ch = conn.create_channel().await?;
        unbind(&ch, &holding, &t.dlx).await?;
        // Unbound, it receives nothing more; quorum queues take no if-empty delete, so it is
        // deleted once a look finds it empty.
        done.from_holding = drain(conn, &holding, t).await?;
        while length(conn, &holding).await? != Some(0) {
            done.from_holding += drain(conn, &holding, t).await?;
        }
        ch.queue_delete(holding.as_str().into(), QueueDeleteOptions::default())
            .await
            .map_err(|e| anyhow::anyhow!("deleting {holding}: {e}; run the command again"))?;
        tracing::info!(queue = %holding, moved = done.from_holding, "holding queue emptied into {} and deleted", t.dead);
    }
    Ok(done)
}

/// Steps 1 to 3: the classic queue's letters into the holding queue, then the classic queue
/// replaced by the quorum one.
async fn retire_classic(conn: &Connection, t: &Topology) -> anyhow::Result<usize> {
    let holding = holding_queue(t);
    let ch = conn.create_channel().await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    declare_queue(&ch, &holding, durable, declare::quorum_queue_args()).await?;
    bind(&ch, &holding, &t.dlx, "", FieldTable::default()).await?;
    unbind(&ch, &t.dead, &t.dlx).await?;
    let mut moved = 0;
    for _ in 0..DELETE_TRIES {
        moved += drain(conn, &t.dead, t).await?;
        let ch = conn.create_channel().await?;
        match ch.queue_delete(t.dead.as_str().into(), if_empty()).await {
            Ok(_) => {
                tracing::info!(queue = %t.dead, moved, "classic queue emptied into {holding} and deleted");
                declare_queue(&ch, &t.dead, durable, declare::quorum_queue_args()).await?;
                bind(&ch, &t.dead, &t.dlx, "", FieldTable::default()).await?;
                return Ok(moved);
            }
            Err(e) => tracing::warn!(queue = %t.dead, error = %e, "not empty yet; moving again"),
        }
    }
    anyhow::bail!(
        "{} kept receiving letters (is a process of an older version still running?); \
         its letters so far are in {holding}: run the command again",
        t.dead
    )
}

/// Moves every letter of `from` to the DLX (with confirms), acking each after its copy is
/// confirmed; returns how many.
async fn drain(conn: &Connection, from: &str, t: &Topology) -> anyhow::Result<usize> {
    let get = conn.create_channel().await?;
    let publish = confirm_channel(conn).await?;
    let mut moved = 0;
    while let Some(message) = get
        .basic_get(from.into(), BasicGetOptions { no_ack: false })
        .await
        .map_err(|e| anyhow::anyhow!("reading from {from}: {e}"))?
    {
        let d = &message.delivery;
        publish_confirmed(
            &publish,
            &t.dlx,
            d.routing_key.as_str(),
            &d.data,
            super::without_redelivery(&d.properties),
        )
        .await
        .map_err(|e| anyhow::anyhow!("moving a letter from {from} to {}: {e}", t.dlx))?;
        let id = d.properties.message_id().as_ref().map(|s| s.to_string());
        crate::failpoint::hit_job(MID_DRAIN, id.as_deref().unwrap_or("")).await;
        d.ack(BasicAckOptions::default())
            .await
            .map_err(|e| anyhow::anyhow!("acking a moved letter in {from}: {e}"))?;
        moved += 1;
    }
    let _ = get.close(200, "drained".into()).await;
    let _ = publish.close(200, "drained".into()).await;
    Ok(moved)
}

/// The messages ready in queue `name`, `None` if it does not exist (a passive declaration, on
/// a channel of its own: a missing queue closes it).
async fn length(conn: &Connection, name: &str) -> anyhow::Result<Option<u32>> {
    let ch = conn.create_channel().await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    match ch
        .queue_declare(name.into(), passive, FieldTable::default())
        .await
    {
        Ok(q) => {
            let _ = ch.close(200, "looked".into()).await;
            Ok(Some(q.message_count()))
        }
        Err(error) => {
            let e = anyhow::Error::new(Refused {
                what: format!("looking up queue {name}"),
                error,
            });
            if is_not_found(&e) { Ok(None) } else { Err(e) }
        }
    }
}

async fn unbind(ch: &Channel, queue: &str, exchange: &str) -> anyhow::Result<()> {
    ch.queue_unbind(
        queue.into(),
        exchange.into(),
        "".into(),
        FieldTable::default(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("unbinding {queue} from {exchange}: {e}"))
}

fn if_empty() -> QueueDeleteOptions {
    QueueDeleteOptions {
        if_empty: true,
        ..Default::default()
    }
}
