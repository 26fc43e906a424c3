//! One pass over the dead-letter queue without losing or reordering anything.
//!
//! Every message is taken with `basic.get` and *not* acknowledged, on a channel of its own.
//! Messages the caller removes are acknowledged one by one; closing the channel hands every other
//! one back to the queue, which puts it back in its original position (a classic queue does).
//! A pass that dies halfway (a crash, a lost connection) loses nothing either: the broker requeues
//! the unacknowledged messages of a closed channel.
//!
//! A pass takes at most the number of messages that were ready when it opened, so messages that
//! arrive meanwhile are left for the next pass, and a message is never seen twice in one pass
//! (nothing is requeued before the channel closes).

use anyhow::Context;
use lapin::{
    Channel, Connection,
    message::Delivery,
    options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions},
    types::FieldTable,
};

/// An open pass over one queue.
pub(super) struct Pass {
    channel: Channel,
    queue: String,
    total: usize,
    left: usize,
}

impl Pass {
    /// Opens a channel and counts the ready messages of `queue` (it must exist).
    pub(super) async fn open(conn: &Connection, queue: &str) -> anyhow::Result<Pass> {
        let channel = conn
            .create_channel()
            .await
            .context("opening a RabbitMQ channel")?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .with_context(|| format!("reading queue {queue}"))?;
        let total = declared.message_count() as usize;
        Ok(Pass {
            channel,
            queue: queue.to_owned(),
            total,
            left: total,
        })
    }

    /// How many messages this pass will look at, at most.
    pub(super) fn total(&self) -> usize {
        self.total
    }

    /// The next message, held unacknowledged; `None` at the end of the pass.
    pub(super) async fn next(&mut self) -> anyhow::Result<Option<Delivery>> {
        if self.left == 0 {
            return Ok(None);
        }
        let got = self
            .channel
            .basic_get(
                self.queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await
            .with_context(|| format!("reading from {}", self.queue))?;
        match got {
            Some(message) => {
                self.left -= 1;
                Ok(Some(message.delivery))
            }
            None => {
                self.left = 0;
                Ok(None)
            }
        }
    }

    /// Removes a message of this pass from the queue for good.
    pub(super) async fn remove(&self, delivery: &Delivery) -> anyhow::Result<()> {
        match delivery.ack(BasicAckOptions::default()).await {
            Ok(true) => Ok(()),
            Ok(false) => anyhow::bail!(
                "cannot remove it from {}: the channel is closed (it stays in the queue)",
                self.queue
            ),
            Err(e) => Err(e).with_context(|| format!("removing it from {}", self.queue)),
        }
    }

    /// Ends the pass: every message not removed goes back to the queue, in its place.
    pub(super) async fn close(self) {
        if let Err(e) = self
            .channel
            .close(200, "dead-letter pass done".into())
            .await
        {
            // A closed channel requeues its messages just the same.
            tracing::debug!(error = %e, "closing the dead-letter pass channel");
        }
    }
}
