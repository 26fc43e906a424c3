//! A publisher on a connection of its own, for processes that also consume.
//!
//! While a resource alarm is on (memory or disk), RabbitMQ blocks every connection that
//! publishes: it stops reading its socket and sends `connection.blocked`. lapin then stops
//! writing anything on that connection, acks and rejects included, and `basic_publish` (which
//! resolves once its frames are written) waits with them. A worker that published retries on
//! its consuming connection therefore stopped settling every delivery after the first retry
//! of an alarm: each slot ended up waiting on an ack, and nothing was sent until the alarm
//! cleared (RabbitMQ's own advice: separate connections for publishing and consuming). On a
//! connection of its own, only the deliveries that need a publish wait; the others are acked.

use std::time::Duration;

use lapin::{BasicProperties, Channel, Connection, ConnectionStatus};

use super::{PublishError, confirm_channel, connect, publish_on};
use crate::config::UrlList;

/// How often a publish waiting out a blocked connection looks again. lapin records the
/// broker's `connection.unblocked` in the connection's status; a quarter second adds little to
/// an alarm that lasts seconds at least.
const BLOCKED_POLL: Duration = Duration::from_millis(250);

/// A confirm channel on a dedicated connection.
pub struct Publisher {
    conn: Connection,
    channel: Channel,
}

impl Publisher {
    /// Connects (as `name`, shown by `rabbitmqctl list_connections`) and opens a confirm
    /// channel.
    pub async fn connect(urls: &UrlList, name: &str) -> anyhow::Result<Publisher> {
        let conn = connect(urls, name).await?;
        let channel = confirm_channel(&conn).await?;
        Ok(Publisher { conn, channel })
    }

    /// Publishes one persistent, mandatory message and waits for its confirm, as
    /// [`super::publish_confirmed`], except that time spent blocked by the broker does not
    /// count towards the timeout: the publish waits until the alarm clears.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let status = self.conn.status();
        wait_while_blocked(status).await;
        publish_on(
            &self.channel,
            Some(status),
            exchange,
            routing_key,
            body,
            properties,
        )
        .await
    }

    /// Whether the broker blocks this connection now (a resource alarm).
    pub fn is_blocked(&self) -> bool {
        self.conn.status().blocked()
    }

    /// Whether the connection and its channel are still open.
    pub fn is_usable(&self) -> bool {
        self.conn.status().connected() && self.channel.status().connected()
    }

    /// Closes channel and connection, politely and within [`super::GOODBYE_TIMEOUT`] (a
    /// blocked connection cannot say goodbye and is dropped when the process exits).
    pub async fn close(&self, reason: &str) {
        if self.is_blocked() {
            return;
        }
        super::close_within(&self.conn, Some(&self.channel), reason).await;
    }
}

/// Returns once the broker no longer blocks the connection of `status` (at once if it does not),
/// or once that connection is gone.
pub async fn wait_while_blocked(status: &ConnectionStatus) {
    let mut warned = false;
    while status.blocked() && status.connected() {
        if !warned {
            tracing::warn!(
                "RabbitMQ blocks publishing on this connection (resource alarm); waiting until it unblocks"
            );
            warned = true;
        }
        tokio::time::sleep(BLOCKED_POLL).await;
    }
    if warned {
        tracing::info!("RabbitMQ unblocked publishing");
    }
}
