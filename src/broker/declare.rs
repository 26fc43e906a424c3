//! Declaring the topology part by part, so that one part the broker refuses does not keep the
//! rest of the pipeline down.
//!
//! The exchanges and the work queue are *essential*: without them nothing can be published or
//! consumed, and [`declare_topology`] fails. The dead-letter queue and each retry tier are
//! *optional*: each is declared on a channel of its own (a refused declaration closes its
//! channel), and one that fails — its home node down, arguments that conflict with the queue
//! already there — is reported in [`Declared::missing`], logged once (WARN) while it stays
//! missing ([`super::missing`]), and declared again in the background
//! ([`declare_and_repair`]) until it succeeds (one INFO line). Meanwhile the worker consumes,
//! the relay publishes; a retry or dead letter that has nowhere to go is an unroutable publish,
//! which the worker handles as it handles any failed publish.
//!
//! `<ns>.dead` is a quorum queue (every queue survives the loss of one node of a cluster). A
//! broker that still holds the classic `<ns>.dead` of older versions answers the quorum
//! declaration with PRECONDITION_FAILED; mailroom then keeps using the classic queue
//! ([`DeadQueue::Classic`]), says once (WARN) that `mailroom broker migrate-dead-queue` moves
//! it ([`super::migrate`]), and the part is not missing.

use std::time::Duration;

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::{
    Channel, Connection, ErrorKind, ExchangeKind,
    options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions},
    types::{AMQPValue, FieldTable},
};

use super::{DELAY_HEADER, DELIVERY_LIMIT, Topology, missing, table, text};
use crate::config::UrlList;

/// How often a process declares again the parts that are missing.
pub const REPAIR_EVERY: Duration = Duration::from_secs(5);

/// What `<ns>.dead` is on this broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadQueue {
    /// A quorum queue: what mailroom declares.
    Quorum,
    /// The classic queue of an older version, used as it is until it is migrated.
    Classic,
}

/// One optional part the broker did not declare, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    /// `queue <name>`, as the log, `/readyz` and the metrics name it.
    pub part: String,
    pub error: String,
}

/// What [`declare_topology`] declared: the essential parts always (else it fails), and of the
/// optional ones all but [`Declared::missing`].
#[derive(Clone, Debug)]
pub struct Declared {
    /// `None` when `<ns>.dead` is missing.
    pub dead_queue: Option<DeadQueue>,
    pub missing: Vec<Missing>,
}

impl Declared {
    pub fn complete(&self) -> bool {
        self.missing.is_empty()
    }
}

/// Declares every exchange, queue and binding. Safe to call from many processes at once. Fails
/// only when an essential part (an exchange, the work queue) fails; see the module's text.
pub async fn declare_topology(conn: &Connection, t: &Topology) -> anyhow::Result<Declared> {
    let ch = conn.create_channel().await?;
    declare_exchanges(&ch, t).await?;
    declare_work_queue(&ch, t).await?;
    let _ = ch.close(200, "declared".into()).await;
    let mut missing = Vec::new();
    let dead_queue = match declare_dead_queue(conn, t).await {
        Ok(kind) => Some(kind),
        Err(e) => {
            missing.push(Missing {
                part: format!("queue {}", t.dead),
                error: format!("{e:#}"),
            });
            None
        }
    };
    for delay in &t.retry_delays {
        let ch = conn.create_channel().await?;
        match declare_retry_tier(&ch, t, *delay).await {
            Ok(()) => {
                let _ = ch.close(200, "declared".into()).await;
            }
            Err(e) => missing.push(Missing {
                part: format!("queue {}", t.retry_queue(*delay)),
                error: format!("{e:#}"),
            }),
        }
    }
    missing::record(t, &missing);
    Ok(Declared {
        dead_queue,
        missing,
    })
}

/// Declares the topology for a session of `name`; parts left missing are declared again in the
/// background (a task per namespace that connects to `urls` every [`REPAIR_EVERY`] until the
/// topology is complete).
///
/// A reconnect of a process that has declared the namespace before only looks its essential
/// parts up, read-only, and declares everything again in that background task. Declaring writes
/// to the cluster's metadata store, which waits for every node: on a cluster with one node
/// frozen, a full declaration on a healthy node hangs until the frozen one is thawed or taken
/// for down, while lookups answer at once and consuming a quorum queue needs only a majority.
/// A lookup that fails (a broker reset, a deleted queue) falls back to the full declaration.
pub async fn declare_and_repair(
    conn: &Connection,
    urls: &UrlList,
    t: &Topology,
    name: &str,
) -> anyhow::Result<()> {
    if missing::declared_before(t) {
        match essentials_exist(conn, t).await {
            Ok(()) => {
                spawn_repair(urls, t, name, Duration::ZERO);
                return Ok(());
            }
            Err(e) => {
                tracing::info!("the topology is not all there ({e:#}); declaring it again");
            }
        }
    }
    let declared = declare_topology(conn, t).await?;
    missing::mark_declared(t);
    if !declared.complete() {
        spawn_repair(urls, t, name, REPAIR_EVERY);
    }
    Ok(())
}

/// Declares the topology in the background, on a connection of its own, first after `delay`,
/// then every [`REPAIR_EVERY`] until it is complete; nothing when the namespace's task runs.
fn spawn_repair(urls: &UrlList, t: &Topology, name: &str, delay: Duration) {
    if !missing::start_repair(t) {
        return;
    }
    let (urls, t, name) = (urls.clone(), t.clone(), format!("{name} (declaring)"));
    tokio::spawn(async move {
        let mut delay = delay;
        loop {
            tokio::time::sleep(delay).await;
            delay = REPAIR_EVERY;
            if let Ok(conn) = super::connect(&urls, &name).await {
                let done = declare_topology(&conn, &t)
                    .await
                    .is_ok_and(|d| d.complete());
                let _ = conn.close(200, "declared".into()).await;
                if done {
                    break;
                }
            }
        }
        missing::end_repair(&t);
    });
}

/// Passive declarations (lookups that change nothing) of the exchanges and the work queue.
async fn essentials_exist(conn: &Connection, t: &Topology) -> anyhow::Result<()> {
    let ch = conn.create_channel().await?;
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    declare_exchanges_with(&ch, t, passive).await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    declare_queue(&ch, &t.queue, passive, FieldTable::default()).await?;
    let _ = ch.close(200, "looked up".into()).await;
    Ok(())
}

fn durable_queue() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

async fn declare_exchanges(ch: &Channel, t: &Topology) -> anyhow::Result<()> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    declare_exchanges_with(ch, t, durable).await
}

/// The three exchanges, declared with `opts` (durable, or passive: a lookup).
async fn declare_exchanges_with(
    ch: &Channel,
    t: &Topology,
    opts: ExchangeDeclareOptions,
) -> anyhow::Result<()> {
    let verb = if opts.passive {
        "looking up"
    } else {
        "declaring"
    };
    for (name, kind) in [
        (&t.exchange, ExchangeKind::Topic),
        (&t.retry_exchange, ExchangeKind::Headers),
        (&t.dlx, ExchangeKind::Fanout),
    ] {
        ch.exchange_declare(name.as_str().into(), kind, opts, FieldTable::default())
            .await
            .map_err(|e| anyhow::anyhow!("{verb} exchange {name}: {e}"))?;
    }
    Ok(())
}

/// The quorum work queue `<ns>`, bound to every routing key of the exchange.
async fn declare_work_queue(ch: &Channel, t: &Topology) -> anyhow::Result<()> {
    // At-least-once dead-lettering (RabbitMQ 3.10+) needs reject-publish overflow.
    let args = table(&[
        ("x-queue-type", text("quorum")),
        ("x-delivery-limit", AMQPValue::LongLongInt(DELIVERY_LIMIT)),
        ("x-dead-letter-exchange", text(&t.dlx)),
        ("x-dead-letter-strategy", text("at-least-once")),
        ("x-overflow", text("reject-publish")),
    ]);
    declare_queue(ch, &t.queue, durable_queue(), args).await?;
    bind(ch, &t.queue, &t.exchange, "#", FieldTable::default()).await
}

/// The arguments of a plain quorum queue: those of `<ns>.dead`, and of any queue a test or the
/// bench declares to measure the broker as mailroom uses it.
pub fn quorum_queue_args() -> FieldTable {
    table(&[("x-queue-type", text("quorum"))])
}

/// Declares `<ns>.dead` as a quorum queue bound to the DLX; a classic one already there is kept
/// as it is (its binding was made when it was).
async fn declare_dead_queue(conn: &Connection, t: &Topology) -> anyhow::Result<DeadQueue> {
    let ch = conn.create_channel().await?;
    match declare_queue(&ch, &t.dead, durable_queue(), quorum_queue_args()).await {
        Ok(()) => {
            bind(&ch, &t.dead, &t.dlx, "", FieldTable::default()).await?;
            let _ = ch.close(200, "declared".into()).await;
            Ok(DeadQueue::Quorum)
        }
        Err(e) if is_other_queue_type(&e) => {
            let ch = conn.create_channel().await?;
            let passive = QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            declare_queue(&ch, &t.dead, passive, FieldTable::default()).await?;
            let _ = ch.close(200, "declared".into()).await;
            missing::warn_classic_once(t);
            Ok(DeadQueue::Classic)
        }
        Err(e) => Err(e),
    }
}

/// A declaration (or binding) the broker refused: what it was, and lapin's error, told as one
/// line.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {error}")]
pub struct Refused {
    pub what: String,
    pub error: lapin::Error,
}

impl Refused {
    fn soft(&self) -> Option<(AMQPSoftError, String)> {
        match self.error.kind() {
            ErrorKind::ProtocolError(amqp) => match amqp.kind() {
                AMQPErrorKind::Soft(soft) => Some((soft.clone(), amqp.get_message().to_string())),
                AMQPErrorKind::Hard(_) => None,
            },
            _ => None,
        }
    }
}

fn refused(e: &anyhow::Error) -> Option<(AMQPSoftError, String)> {
    e.downcast_ref::<Refused>().and_then(Refused::soft)
}

/// Whether a declaration failed because the queue exists with another `x-queue-type`.
pub(super) fn is_other_queue_type(e: &anyhow::Error) -> bool {
    refused(e).is_some_and(|(soft, message)| {
        soft == AMQPSoftError::PRECONDITIONFAILED && message.contains("x-queue-type")
    })
}

/// Whether an operation failed because the queue (or exchange) does not exist.
pub(super) fn is_not_found(e: &anyhow::Error) -> bool {
    refused(e).is_some_and(|(soft, _)| soft == AMQPSoftError::NOTFOUND)
}

/// One retry tier: a quorum queue whose TTL dead-letters back to the work exchange, bound to
/// the retry exchange on its delay header.
async fn declare_retry_tier(ch: &Channel, t: &Topology, delay: Duration) -> anyhow::Result<()> {
    let label = Topology::delay_label(delay);
    let queue = t.retry_queue(delay);
    let args = table(&[
        ("x-queue-type", text("quorum")),
        (
            "x-message-ttl",
            AMQPValue::LongLongInt(delay.as_millis() as i64),
        ),
        ("x-dead-letter-exchange", text(&t.exchange)),
        ("x-dead-letter-strategy", text("at-least-once")),
        ("x-overflow", text("reject-publish")),
    ]);
    declare_queue(ch, &queue, durable_queue(), args).await?;
    // `all` ignores headers starting with `x-`, so a binding on `x-mailroom-delay` alone
    // matched every message and each retry went to every tier (one copy per tier).
    // `all-with-x` (RabbitMQ 3.10+) compares them; the old binding is removed.
    let legacy = table(&[("x-match", text("all")), (DELAY_HEADER, text(&label))]);
    ch.queue_unbind(
        queue.as_str().into(),
        t.retry_exchange.as_str().into(),
        "".into(),
        legacy,
    )
    .await
    .map_err(|e| anyhow::anyhow!("unbinding the legacy matcher of {queue}: {e}"))?;
    let matcher = table(&[
        ("x-match", text("all-with-x")),
        (DELAY_HEADER, text(&label)),
    ]);
    bind(ch, &queue, &t.retry_exchange, "", matcher).await
}

/// Declares a queue; a refusal is a [`Refused`] (for [`is_not_found`] and
/// [`is_other_queue_type`]).
pub(super) async fn declare_queue(
    ch: &Channel,
    name: &str,
    opts: QueueDeclareOptions,
    args: FieldTable,
) -> anyhow::Result<()> {
    ch.queue_declare(name.into(), opts, args)
        .await
        .map(|_| ())
        .map_err(|error| {
            anyhow::Error::new(Refused {
                what: format!("declaring queue {name}"),
                error,
            })
        })
}

pub(super) async fn bind(
    ch: &Channel,
    queue: &str,
    exchange: &str,
    key: &str,
    args: FieldTable,
) -> anyhow::Result<()> {
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        key.into(),
        QueueBindOptions::default(),
        args,
    )
    .await
    .map_err(|error| {
        anyhow::Error::new(Refused {
            what: format!("binding {queue} to {exchange}"),
            error,
        })
    })
}
