//! RabbitMQ: connecting (with failover over several nodes), declaring the topology, and
//! publishing with confirms. Every process calls [`declare_topology`] at start; it is
//! idempotent, and declares each optional queue on its own ([`declare`]).
//!
//! ```text
//! exchange <ns> (topic) ──#──▶ <ns>.email (quorum, delivery limit, DLX <ns>.dlx)
//! exchange <ns>.retry (headers) ──x-mailroom-delay=5s──▶ <ns>.retry.5s (quorum, TTL 5s, DLX <ns>)
//! exchange <ns>.dlx (fanout) ──▶ <ns>.dead (quorum; consumed by the dead-letter ingest)
//! ```
//! Retry tiers are reached through a headers exchange rather than the default exchange so that
//! a retried message keeps its routing key (the kind) when it expires back into `<ns>`.

use std::time::Duration;

pub mod acks;
mod connect;
mod declare;
pub mod migrate;
mod missing;
mod publisher;

pub use acks::{ACK_LINGER, AckPolicy, Acks};
pub use connect::{
    CONNECT_STAGGER, CONNECT_TIMEOUT, Ended, HEALTHY_AFTER, HEARTBEAT, RECONNECT_MAX,
    RECONNECT_MIN, Reconnect, connect, reconnect_backoff, refusal,
};
pub use declare::{
    DeadQueue, Declared, Missing, REPAIR_EVERY, Refused, declare_and_repair, declare_topology,
    quorum_queue_args,
};
pub use missing::{missing, missing_parts};
pub use publisher::{Publisher, wait_while_blocked};

use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionStatus,
    options::{BasicPublishOptions, ConfirmSelectOptions},
    types::{AMQPValue, FieldTable, LongString, ShortString},
};

/// How many times the broker may deliver one message before dead-lettering it: the guard
/// against a job that crashes every worker that takes it. Connection losses count too on
/// RabbitMQ 3.x, so it leaves room for a few of those.
pub const DELIVERY_LIMIT: i64 = 10;
/// How long a publish may wait for its confirm before it counts as failed.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a goodbye to the broker may take: a consumer's cancel, a channel's and its
/// connection's close. A broker that hears it answers in milliseconds; one cut off without a
/// reset (a partition, a frozen node) never does, and lapin notices only after two missed
/// heartbeats (20 s with [`HEARTBEAT`], 120 s with RabbitMQ's default of 60 s): a worker
/// stopped then took up to that long to exit. Past this the process goes on without the
/// answer; the broker requeues what the connection held once it notices the connection gone.
pub const GOODBYE_TIMEOUT: Duration = Duration::from_secs(3);

/// Closes `channel`, if given, then `conn`, both within [`GOODBYE_TIMEOUT`]; a broker that does
/// not answer in time is left to notice the connection gone once its last handle is dropped.
pub async fn close_within(conn: &Connection, channel: Option<&Channel>, reason: &str) {
    let goodbye = async {
        if let Some(channel) = channel {
            let _ = channel.close(200, reason.into()).await;
        }
        let _ = conn.close(200, reason.into()).await;
    };
    let _ = tokio::time::timeout(GOODBYE_TIMEOUT, goodbye).await;
}

/// How long an ack, nack or reject may take to be written. lapin resolves one once written; one
/// handed to lapin as the broker connection broke (a broker restart) was seen never to resolve:
/// it held a worker's concurrency slot for good, and it stopped a dead-letter ingester for the
/// rest of its process's life and kept that process from exiting. Past this the settle counts
/// as not written: a broken connection's deliveries are redelivered anyway.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
// The wire contract: every `x-mailroom-*` header mailroom writes or reads.
/// Header naming the retry tier a message is published to.
pub const DELAY_HEADER: &str = "x-mailroom-delay";
pub const KIND_HEADER: &str = "x-mailroom-kind";
/// On a retried copy: the number of the delivery attempt it will be (1 for the first).
pub const ATTEMPT_HEADER: &str = "x-mailroom-attempt";
/// On a retried copy: why the previous attempt failed.
pub const LAST_ERROR_HEADER: &str = "x-mailroom-last-error";
/// On a dead letter: why it was given up, and the class of that reason.
pub const ERROR_HEADER: &str = "x-mailroom-error";
pub const ERROR_CLASS_HEADER: &str = "x-mailroom-error-class";
/// On a dead letter: the claims the job spent (not [`ATTEMPT_HEADER`], a retry's counter).
pub const ATTEMPTS_HEADER: &str = "x-mailroom-attempts";
/// On a dead letter: when it was given up (RFC 3339, UTC).
pub const FAILED_AT_HEADER: &str = "x-mailroom-failed-at";
/// Set on a copy replayed from the dead-letter queue (how many times it was replayed): the
/// worker may then claim a `dead` or `uncertain` row once more (never a `sent` one), if the
/// copy also carries a valid seal (`dlq::seal::SEAL_HEADER`).
pub const REPLAY_HEADER: &str = "x-mailroom-replay";

/// The names of every exchange and queue, derived from one namespace so that tests (and
/// tenants sharing a broker) can run side by side.
#[derive(Clone, Debug)]
pub struct Topology {
    pub exchange: String,
    pub queue: String,
    pub retry_exchange: String,
    pub dlx: String,
    pub dead: String,
    pub retry_delays: Vec<Duration>,
}

impl Topology {
    pub fn new(namespace: &str, retry_delays: Vec<Duration>) -> Topology {
        Topology {
            exchange: namespace.to_string(),
            queue: format!("{namespace}.email"),
            retry_exchange: format!("{namespace}.retry"),
            dlx: format!("{namespace}.dlx"),
            dead: format!("{namespace}.dead"),
            retry_delays,
        }
    }

    /// The label of a tier, as used in its queue name and its binding: `5s`, `2m`, `1500ms`.
    pub fn delay_label(delay: Duration) -> String {
        humantime::format_duration(delay)
            .to_string()
            .replace(' ', "")
    }

    pub fn retry_queue(&self, delay: Duration) -> String {
        format!("{}.{}", self.retry_exchange, Self::delay_label(delay))
    }

    /// The longest tier no longer than `wait`, else the shortest: a job parked until a time
    /// comes back at or before it (and is parked again for what is left), or at most one
    /// shortest tier after it when less than that was left.
    pub fn tier_within(&self, wait: Duration) -> Duration {
        self.retry_delays
            .iter()
            .copied()
            .filter(|d| *d <= wait)
            .max()
            .or_else(|| self.retry_delays.iter().copied().min())
            .unwrap_or(Duration::from_secs(5))
    }

    /// The shortest tier at least as long as `wanted`, else the longest tier.
    pub fn tier_for(&self, wanted: Duration) -> Duration {
        self.retry_delays
            .iter()
            .copied()
            .find(|d| *d >= wanted)
            .or_else(|| self.retry_delays.last().copied())
            .unwrap_or(Duration::from_secs(5))
    }
}

fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// Opens a channel in confirm mode, for publishers.
pub async fn confirm_channel(conn: &Connection) -> anyhow::Result<Channel> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    Ok(ch)
}

/// Why a confirmed publish failed. Every variant means "the broker may not have it".
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("no queue is bound for routing key {routing_key:?} on exchange {exchange:?}")]
    Unroutable {
        exchange: String,
        routing_key: String,
    },
    #[error("the broker refused the message (nack)")]
    Nacked,
    #[error("no confirm within {0:?}")]
    Timeout(Duration),
    #[error("the channel is not in confirm mode")]
    NotConfirmed,
    #[error(transparent)]
    Amqp(#[from] lapin::Error),
}

/// Publishes one persistent, mandatory message and waits for its confirm. Succeeds only on a
/// clean ack: unroutable (returned), nacked and timed-out publishes are errors. The timeout
/// covers writing the message too: on a connection the broker blocks, lapin writes nothing.
pub async fn publish_confirmed(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
) -> Result<(), PublishError> {
    publish_on(ch, None, exchange, routing_key, body, properties).await
}

/// [`publish_confirmed`]; with `blocked_by` (the channel's connection), the timeout does not
/// run while the broker blocks that connection: the publish waits until it is unblocked.
async fn publish_on(
    ch: &Channel,
    blocked_by: Option<&ConnectionStatus>,
    exchange: &str,
    routing_key: &str,
    body: &[u8],
    properties: BasicProperties,
) -> Result<(), PublishError> {
    let options = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let confirm = async {
        let pending = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                options,
                body,
                properties.with_delivery_mode(2),
            )
            .await?;
        pending.await
    };
    tokio::pin!(confirm);
    let confirmation = loop {
        match tokio::time::timeout(CONFIRM_TIMEOUT, &mut confirm).await {
            Ok(confirmation) => break confirmation,
            // Still queued in lapin (or unconfirmed): once unblocked it goes out and the same
            // confirm arrives, so waiting publishes no second copy.
            Err(_) if blocked_by.is_some_and(|s| s.blocked() && s.connected()) => {
                wait_while_blocked(blocked_by.unwrap()).await;
            }
            Err(_) => return Err(PublishError::Timeout(CONFIRM_TIMEOUT)),
        }
    };
    judge(confirmation?, exchange, routing_key)
}

/// A confirm's meaning: only a clean ack (not returned as unroutable) is a success.
fn judge(
    confirmation: Confirmation,
    exchange: &str,
    routing_key: &str,
) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_)) => Err(PublishError::Unroutable {
            exchange: exchange.to_string(),
            routing_key: routing_key.to_string(),
        }),
        Confirmation::Nack(_) => Err(PublishError::Nacked),
        Confirmation::NotRequested => Err(PublishError::NotConfirmed),
    }
}

/// The AMQP properties of a job message, as docs/PRODUCERS.md's "The job" fixes them.
pub fn job_properties(job_id: &str, kind: &str, attempt: i64) -> BasicProperties {
    BasicProperties::default()
        .with_message_id(job_id.into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_headers(table(&[
            (KIND_HEADER, text(kind)),
            (ATTEMPT_HEADER, AMQPValue::LongLongInt(attempt)),
        ]))
}

/// Reads an integer header, whatever integer type the publisher used.
pub fn int_header(props: &BasicProperties, name: &str) -> Option<i64> {
    int_value(props.headers().as_ref()?.inner().get(name)?)
}

/// An AMQP integer of any width as `i64`.
pub fn int_value(value: &AMQPValue) -> Option<i64> {
    match value {
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        AMQPValue::LongUInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortUInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortShortUInt(v) => Some(i64::from(*v)),
        _ => None,
    }
}

/// Copies `props` with `headers` set (replacing same-named ones), for retry and dead-letter
/// republishes that must keep the original message id and content type.
pub fn with_headers(props: &BasicProperties, headers: &[(&str, AMQPValue)]) -> BasicProperties {
    let mut merged = props.headers().clone().unwrap_or_default();
    for (k, v) in headers {
        merged.insert(ShortString::from(*k), v.clone());
    }
    props.clone().with_headers(merged)
}

/// Headers a quorum queue adds or changes on each (re)delivery.
const REDELIVERY_HEADERS: &[&str] = &["x-delivery-count", "x-acquired-count"];

/// `props` without the headers a quorum queue adds on delivery: a letter as it was published
/// to the dead-letter exchange, whichever queue it was then delivered from.
pub fn without_redelivery(props: &BasicProperties) -> BasicProperties {
    let Some(headers) = props.headers() else {
        return props.clone();
    };
    let mut kept = FieldTable::default();
    for (name, value) in headers.inner() {
        if !REDELIVERY_HEADERS.contains(&name.as_str()) {
            kept.insert(name.clone(), value.clone());
        }
    }
    props.clone().with_headers(kept)
}

/// A string header value.
pub fn text_value(s: &str) -> AMQPValue {
    text(s)
}

/// Longest error text copied into a dead letter's or a retry's header; the full text is in the
/// log and the ledger.
pub const MAX_REASON_HEADER: usize = 1000;

/// The headers of a dead letter, written by the worker and by the relay alike.
pub fn dead_letter_headers(
    reason: &str,
    class: &str,
    attempts: i64,
) -> [(&'static str, AMQPValue); 4] {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    [
        (ERROR_HEADER, reason_value(reason)),
        (ERROR_CLASS_HEADER, text(class)),
        (ATTEMPTS_HEADER, AMQPValue::LongLongInt(attempts)),
        (FAILED_AT_HEADER, text(&now)),
    ]
}

/// A reason as a header value, cut to [`MAX_REASON_HEADER`] bytes.
pub fn reason_value(reason: &str) -> AMQPValue {
    text(&crate::job::clip(reason, MAX_REASON_HEADER))
}

/// Runs `futures` together and returns their outputs in order. Each is first polled in the
/// list's order, one after the other: lapin takes a message's delivery tag and queues its
/// frames in `basic_publish`'s first poll, so the messages go on the wire in the batch's order.
/// After that only a future that was woken is polled again, so a batch of any size costs polls
/// in proportion to its length. (`join_all` hands long lists to `FuturesOrdered`, whose polling
/// order is its own business.)
pub async fn in_order<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    use futures_util::StreamExt;
    use futures_util::stream::FuturesUnordered;
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    let mut first: Vec<(usize, std::pin::Pin<Box<F>>)> =
        futures.into_iter().map(Box::pin).enumerate().collect();
    let mut rest = FuturesUnordered::new();
    std::future::poll_fn(|cx| {
        for (i, mut f) in first.drain(..) {
            match f.as_mut().poll(cx) {
                std::task::Poll::Ready(out) => outputs[i] = Some(out),
                std::task::Poll::Pending => rest.push(async move { (i, f.await) }),
            }
        }
        std::task::Poll::Ready(())
    })
    .await;
    while let Some((i, out)) = rest.next().await {
        outputs[i] = Some(out);
    }
    outputs
        .into_iter()
        .map(|out| out.expect("every future is done"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    /// Each future logs its first poll, then yields a different number of times: the first
    /// polls come in the list's order, however the futures finish, and so do the outputs.
    #[tokio::test]
    async fn in_order_polls_each_future_first_in_the_lists_order() {
        let first_polls = std::sync::Mutex::new(vec![]);
        let futures = (0..40usize)
            .map(|i| {
                let first_polls = &first_polls;
                async move {
                    first_polls.lock().unwrap().push(i);
                    for _ in 0..(40 - i) % 7 {
                        tokio::task::yield_now().await;
                    }
                    i * 10
                }
            })
            .collect();
        let outputs = in_order(futures).await;
        assert_eq!(outputs, (0..40).map(|i| i * 10).collect::<Vec<_>>());
        assert_eq!(*first_polls.lock().unwrap(), (0..40).collect::<Vec<_>>());
    }

    /// 300 futures, each waiting for its own signal, signalled one at a time: a future is
    /// polled again only when it was woken, not once per wake-up of any other (which would be
    /// 45,000 polls here, and quadratic in a batch's length).
    #[tokio::test]
    async fn in_order_polls_only_the_futures_that_were_woken() {
        use std::sync::atomic::AtomicUsize;
        const N: usize = 300;
        let polls = AtomicUsize::new(0);
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..N)
            .map(|_| tokio::sync::oneshot::channel::<()>())
            .unzip();
        let futures = receivers
            .into_iter()
            .map(|mut rx| {
                let polls = &polls;
                std::future::poll_fn(move |cx| {
                    polls.fetch_add(1, Ordering::Relaxed);
                    std::pin::Pin::new(&mut rx).poll(cx).map(|_| ())
                })
            })
            .collect();
        let signal = async {
            for tx in senders {
                tokio::task::yield_now().await;
                let _ = tx.send(());
            }
        };
        let (outputs, ()) = tokio::join!(in_order(futures), signal);
        assert_eq!(outputs.len(), N);
        let polls = polls.load(Ordering::Relaxed);
        assert!(polls <= 4 * N, "{polls} polls for {N} futures");
    }

    fn topo() -> Topology {
        let d = |s| Duration::from_secs(s);
        Topology::new("mailroom", vec![d(5), d(30), d(120)])
    }

    #[test]
    fn names_follow_the_namespace() {
        let t = topo();
        assert_eq!(t.queue, "mailroom.email");
        assert_eq!(t.dead, "mailroom.dead");
        assert_eq!(t.retry_queue(Duration::from_secs(120)), "mailroom.retry.2m");
        assert_eq!(
            t.retry_queue(Duration::from_millis(1500)),
            "mailroom.retry.1s500ms"
        );
    }

    #[test]
    fn tier_is_the_shortest_that_covers_the_wait() {
        let t = topo();
        assert_eq!(t.tier_for(Duration::ZERO), Duration::from_secs(5));
        assert_eq!(t.tier_for(Duration::from_secs(6)), Duration::from_secs(30));
        assert_eq!(t.tier_for(Duration::from_secs(30)), Duration::from_secs(30));
        assert_eq!(
            t.tier_for(Duration::from_secs(9999)),
            Duration::from_secs(120)
        );
    }

    #[test]
    fn a_parked_job_takes_the_longest_tier_that_does_not_overshoot_its_time() {
        let t = topo();
        let s = Duration::from_secs;
        assert_eq!(t.tier_within(s(3600)), s(120));
        assert_eq!(t.tier_within(s(119)), s(30));
        assert_eq!(t.tier_within(s(30)), s(30));
        assert_eq!(t.tier_within(s(6)), s(5));
        // Less than the shortest tier left: the shortest, at most one tier late.
        assert_eq!(t.tier_within(Duration::from_millis(200)), s(5));
    }
}
