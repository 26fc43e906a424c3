//! Acting on an [`Outcome`]: every delivery ends here in exactly one ack, one reject, or one
//! confirmed republish followed by an ack, and in exactly one log line with its `outcome`
//! (`sent`, `duplicate`, `retry`, `deferred`, `held`, `suppressed` at INFO; `requeued`, `dead` at WARN, or ERROR when the dead
//! letter had to go through the queue's own dead-letter exchange). The delivery span adds
//! `job_id`, `kind`, `attempt` and, after a send, `smtp_ms` and `smtp_reply`. Rejects are per
//! delivery (`basic.reject`), never a bulk nack that could drag innocent deliveries along.
//! Acks are asked for per delivery too; the channel's [`Acks`] writes the acks of a run of
//! settled deliveries as one frame, and never one that covers a delivery not settled.

use std::time::Duration;

use lapin::{BasicProperties, message::Delivery, options::BasicRejectOptions, types::AMQPValue};

use super::{ErrorClass, Link, OTHER_KIND, Outcome, Stats, Worker};
use crate::broker::{self, Acks, PublishError, SETTLE_TIMEOUT, Topology};
use crate::job::mask_addresses;

// An ack first waits up to the linger for company: the timeout must leave it that wait and
// the write, or every ack of a quiet worker would count as unsettled and be redelivered.
const _: () = assert!(SETTLE_TIMEOUT.as_millis() >= 10 * broker::ACK_LINGER.as_millis());

impl Worker {
    pub(super) async fn settle(&self, link: &Link, delivery: &Delivery, outcome: Outcome) {
        match outcome {
            Outcome::Ack { duplicate } => self.settle_done(&link.acks, delivery, duplicate).await,
            Outcome::Retry { delay, reason } => {
                self.settle_retry(link, delivery, delay, &reason).await
            }
            Outcome::Suppressed { reason } => {
                tracing::info!(
                    outcome = "suppressed",
                    reason = mask_addresses(&reason),
                    "not sent: suppressed"
                );
                Stats::bump(&self.stats.suppressed);
                self.ack(&link.acks, delivery).await;
            }
            Outcome::Defer { delay, until } => {
                self.settle_defer(link, delivery, delay, until).await
            }
            Outcome::Held { delay, reason } => {
                self.settle_held(link, delivery, delay, &reason).await
            }
            Outcome::DeadLetter {
                class,
                reason,
                attempts,
            } => {
                self.settle_dead(link, delivery, class, &reason, attempts)
                    .await
            }
        }
    }

    /// Sent now, or earlier (a duplicate): counts it and acks.
    async fn settle_done(&self, acks: &Acks, delivery: &Delivery, duplicate: bool) {
        if duplicate {
            tracing::info!(
                outcome = "duplicate",
                "already handled; duplicate acknowledged"
            );
        } else {
            tracing::info!(outcome = "sent", "sent");
        }
        let stats = &self.stats;
        if duplicate {
            Stats::bump(&stats.duplicates);
        } else {
            Stats::bump(&stats.sent);
            Stats::bump(&stats.kind(&self.kind_label(delivery)).sent);
        }
        self.ack(acks, delivery).await;
    }

    /// Publishes a copy to the retry tier for `delay` (confirmed), then acks; if the publish
    /// fails, the delivery goes back to the queue instead.
    async fn settle_retry(&self, link: &Link, delivery: &Delivery, delay: Duration, reason: &str) {
        let props = retry_properties(delivery, delay, reason);
        let exchange = &self.settings.topology.retry_exchange;
        match link
            .publisher
            .publish(
                exchange,
                delivery.routing_key.as_str(),
                &delivery.data,
                props,
            )
            .await
        {
            Ok(()) => {
                let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                tracing::info!(
                    outcome = "retry",
                    delay_ms,
                    reason = mask_addresses(reason),
                    "retry scheduled"
                );
                Stats::bump(&self.stats.retried);
                Stats::bump(&self.stats.kind(&self.kind_label(delivery)).retried);
                self.ack(&link.acks, delivery).await;
            }
            Err(e) => {
                tracing::warn!(outcome = "requeued", error = %e, reason = mask_addresses(reason), "cannot schedule the retry; returning the delivery to the queue");
                self.reject(&link.acks, delivery, true).await;
            }
        }
    }

    /// Parks a job that is not due in the tier of `delay` (confirmed), its attempt count and
    /// last error unchanged, then acks; if the publish fails, the delivery goes back to the
    /// queue instead.
    async fn settle_defer(
        &self,
        link: &Link,
        delivery: &Delivery,
        delay: Duration,
        until: chrono::DateTime<chrono::Utc>,
    ) {
        if self.park(link, delivery, delay).await {
            let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            let send_at = until.to_rfc3339();
            tracing::info!(
                outcome = "deferred",
                delay_ms,
                send_at,
                "not due yet; parked"
            );
            Stats::bump(&self.stats.deferred);
            self.ack(&link.acks, delivery).await;
        }
    }

    /// Parks a job held back by a sending limit, like one not due yet.
    async fn settle_held(&self, link: &Link, delivery: &Delivery, delay: Duration, reason: &str) {
        if self.park(link, delivery, delay).await {
            let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
            tracing::info!(
                outcome = "held",
                delay_ms,
                reason = mask_addresses(reason),
                "held back by a sending limit; parked"
            );
            Stats::bump(&self.stats.held);
            self.ack(&link.acks, delivery).await;
        }
    }

    /// Publishes a copy to the tier of `delay` (confirmed), its attempt count and last error
    /// unchanged; if that fails, the delivery goes back to the queue instead (`false`).
    async fn park(&self, link: &Link, delivery: &Delivery, delay: Duration) -> bool {
        let props = broker::with_headers(
            &delivery.properties,
            &[(
                broker::DELAY_HEADER,
                broker::text_value(&Topology::delay_label(delay)),
            )],
        );
        let exchange = &self.settings.topology.retry_exchange;
        let key = delivery.routing_key.as_str();
        match link
            .publisher
            .publish(exchange, key, &delivery.data, props)
            .await
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(outcome = "requeued", error = %e, "cannot park the job in a delay tier; returning the delivery to the queue");
                self.reject(&link.acks, delivery, true).await;
                false
            }
        }
    }

    /// Publishes the job to our dead-letter exchange with its reason (confirmed), then acks. If
    /// the publisher's connection was lost, publishes once more on a connection of its own; if
    /// the publish fails otherwise (unroutable, nacked, unconfirmed), rejects it to the queue's
    /// own dead-letter exchange.
    async fn settle_dead(
        &self,
        link: &Link,
        delivery: &Delivery,
        class: ErrorClass,
        reason: &str,
        attempts: i64,
    ) {
        let props = broker::with_headers(
            &delivery.properties,
            &broker::dead_letter_headers(reason, class.as_str(), attempts),
        );
        let dlx = &self.settings.topology.dlx;
        let key = delivery.routing_key.as_str();
        #[cfg(feature = "failpoints")]
        crate::failpoint::hit_job("worker.before_dead_letter", &failpoint_job_id(delivery)).await;
        let mut published = link
            .publisher
            .publish(dlx, key, &delivery.data, props.clone())
            .await
            .map_err(anyhow::Error::from);
        if let Err(e) = &published
            && matches!(e.downcast_ref(), Some(PublishError::Amqp(_)))
        {
            // The publisher's connection or channel is gone (the session ends and reconnects).
            // Rejected to the queue's DLX, the letter would carry no reason; returned to the
            // queue, it could come back on this session, meet the same dead publisher and
            // spend the queue's delivery limit, which ends in that same reasonless letter.
            tracing::warn!(error = %e, "the publisher's connection was lost before the dead letter was confirmed; publishing it on a connection of its own");
            published = self.publish_alone(dlx, key, &delivery.data, props).await;
        }
        match published {
            Ok(()) => {
                tracing::warn!(
                    outcome = "dead",
                    class = class.as_str(),
                    reason = mask_addresses(reason),
                    "dead-lettered"
                );
                self.stats
                    .dead_lettered(&self.kind_label(delivery), class.as_str());
                self.ack(&link.acks, delivery).await;
            }
            Err(e) => {
                // The queue's own dead-letter exchange keeps the message (at-least-once),
                // without our reason headers; the reason is in this log line.
                tracing::error!(outcome = "dead", error = %format!("{e:#}"), class = class.as_str(), reason = mask_addresses(reason), "cannot publish to the dead-letter exchange; rejecting to the queue's DLX");
                self.stats
                    .dead_lettered(&self.kind_label(delivery), class.as_str());
                self.reject(&link.acks, delivery, false).await;
            }
        }
    }

    /// One confirmed publish on a connection opened for it, then closed.
    async fn publish_alone(
        &self,
        exchange: &str,
        key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> anyhow::Result<()> {
        let s = &self.settings;
        let name = format!("{} dead-letter publisher", s.name);
        let publisher = broker::Publisher::connect(&s.amqp, &name).await?;
        let published = publisher.publish(exchange, key, body, props).await;
        publisher.close("dead letter published").await;
        Ok(published?)
    }

    async fn ack(&self, acks: &Acks, delivery: &Delivery) {
        // Whatever the outcome, it is recorded (or published) by now; only the ack is missing.
        crate::failpoint::hit("worker.before_ack").await;
        let ack = acks.ack(&delivery.acker, delivery.delivery_tag);
        match tokio::time::timeout(SETTLE_TIMEOUT, ack).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => self.unsettled("ack not sent: the channel is closed (or the delivery was settled already); the broker will redeliver and the claim deduplicates"),
            Ok(Err(e)) => self.unsettled(&format!("ack failed ({e}); the broker will redeliver and the claim deduplicates")),
            Err(_) => self.unsettled(&format!("ack not written within {SETTLE_TIMEOUT:?}; if the broker never got it, it redelivers and the claim deduplicates")),
        }
    }

    async fn reject(&self, acks: &Acks, delivery: &Delivery, requeue: bool) {
        let reject = delivery.reject(BasicRejectOptions { requeue });
        match tokio::time::timeout(SETTLE_TIMEOUT, reject).await {
            // Written: a later `multiple` ack may pass over it.
            Ok(Ok(true)) => acks.rejected(delivery.delivery_tag),
            Ok(Ok(false)) => {
                self.unsettled("reject not sent: the channel is closed; the broker will redeliver")
            }
            Ok(Err(e)) => {
                self.unsettled(&format!("reject failed ({e}); the broker will redeliver"))
            }
            Err(_) => self.unsettled(&format!(
                "reject not written within {SETTLE_TIMEOUT:?}; the broker will redeliver"
            )),
        }
    }

    /// The kind as a metric label: the routing key when it names a template, else
    /// [`OTHER_KIND`], so that whoever can publish cannot create unbounded series.
    fn kind_label(&self, delivery: &Delivery) -> String {
        let key = delivery.routing_key.as_str();
        if self.templates.current().contains(key) {
            key.to_owned()
        } else {
            OTHER_KIND.to_owned()
        }
    }

    fn unsettled(&self, what: &str) {
        Stats::bump(&self.stats.unsettled);
        tracing::warn!("{what}");
    }
}

/// The delivery's properties for its next attempt: the retry tier, the attempt count (one
/// more), and the reason of this one.
fn retry_properties(delivery: &Delivery, delay: Duration, reason: &str) -> BasicProperties {
    let attempt = broker::int_header(&delivery.properties, broker::ATTEMPT_HEADER).unwrap_or(1) + 1;
    broker::with_headers(
        &delivery.properties,
        &[
            (
                broker::DELAY_HEADER,
                broker::text_value(&Topology::delay_label(delay)),
            ),
            (broker::ATTEMPT_HEADER, AMQPValue::LongLongInt(attempt)),
            (broker::LAST_ERROR_HEADER, broker::reason_value(reason)),
        ],
    )
}

/// The job id in a delivery's body, for the failpoints armed per job (`name@JOB_ID`).
#[cfg(feature = "failpoints")]
fn failpoint_job_id(delivery: &Delivery) -> String {
    serde_json::from_slice::<serde_json::Value>(&delivery.data)
        .ok()
        .and_then(|job| job["job_id"].as_str().map(str::to_owned))
        .unwrap_or_default()
}
