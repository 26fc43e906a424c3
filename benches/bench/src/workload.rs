//! The jobs and the producers that submit them. A [`Producer`] submits job `i` and says when it
//! counts as submitted; the backlog and the paced (offered-rate) drivers work with any producer.
//! Today's producer publishes straight to the exchange ([`BrokerProducer`]); the end-to-end
//! measurement plugs in a producer that commits outbox rows instead (see `relay.rs`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use futures_util::{StreamExt, TryStreamExt};
use lapin::Channel;
use mailroom::broker;
use mailroom::job::EmailJob;
use serde_json::json;

/// The kind every bench job uses: the shipped `welcome` template (text + HTML, a layout).
pub const KIND: &str = "welcome";

/// Job `i` of a run: the `welcome` email with its sample data, as a producer would write it.
pub fn job(prefix: &str, i: usize, created_at: DateTime<Utc>) -> (String, Vec<u8>) {
    let job = email_job(prefix, i, created_at);
    let body = serde_json::to_vec(&job).expect("a job serialises");
    (job.job_id, body)
}

/// The [`EmailJob`] of [`job`].
pub fn email_job(prefix: &str, i: usize, created_at: DateTime<Utc>) -> EmailJob {
    EmailJob {
        job_id: format!("{prefix}-{i}"),
        kind: KIND.into(),
        to: vec![format!("Ada Lovelace <ada+{i}@example.com>")],
        cc: vec![],
        bcc: vec![],
        reply_to: None,
        locale: None,
        data: json!({
            "product_name": "Acme Cloud",
            "user": { "name": "Ada" },
            "getting_started_url": "https://acme.example/start?utm_source=email&utm_campaign=welcome",
            "support_email": "support@acme.example"
        }),
        headers: Default::default(),
        created_at: Some(created_at),
        send_at: None,
        expires_at: None,
    }
}

/// The index of a job id made by [`job`].
pub fn index_of(job_id: &str) -> Option<usize> {
    job_id.rsplit('-').next()?.parse().ok()
}

/// Submits job `i`; resolves to the moment it counts as submitted (this process's clock).
pub trait Producer: Send + Sync + 'static {
    fn submit(&self, i: usize) -> BoxFuture<'static, anyhow::Result<DateTime<Utc>>>;
}

/// Publishes to the exchange as a producer without an outbox would: persistent, mandatory,
/// mailroom's job properties, waiting for the broker's confirm (`broker::publish_confirmed`).
/// A job counts as submitted when its publish starts, so its latency includes the confirm.
pub struct BrokerProducer {
    pub channel: Channel,
    pub exchange: String,
    pub prefix: String,
}

impl Producer for BrokerProducer {
    fn submit(&self, i: usize) -> BoxFuture<'static, anyhow::Result<DateTime<Utc>>> {
        let channel = self.channel.clone();
        let exchange = self.exchange.clone();
        let prefix = self.prefix.clone();
        Box::pin(async move {
            let at = Utc::now();
            let (job_id, body) = job(&prefix, i, at);
            let props = broker::job_properties(&job_id, KIND, 1);
            broker::publish_confirmed(&channel, &exchange, KIND, &body, props).await?;
            Ok(at)
        })
    }
}

/// Submits jobs `0..n` as fast as confirms allow, with at most `window` unconfirmed (a
/// pipelining producer). Returns the submit time of each job, by index.
pub async fn backlog(
    producer: &dyn Producer,
    n: usize,
    window: usize,
) -> anyhow::Result<Vec<DateTime<Utc>>> {
    futures_util::stream::iter(0..n)
        .map(|i| producer.submit(i))
        .buffered(window.max(1))
        .try_collect()
        .await
}

/// Submits `n` jobs at `rate` per second on a fixed schedule (open loop: a slow confirm does
/// not slow the schedule down, as with independent web requests). Returns submit times by
/// index and the rate actually offered.
pub async fn paced(
    producer: Arc<dyn Producer>,
    n: usize,
    rate: f64,
) -> anyhow::Result<(Vec<DateTime<Utc>>, f64)> {
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due).await;
        let submit = producer.submit(i);
        tasks.spawn(async move { (i, submit.await) });
    }
    let scheduled = start.elapsed().as_secs_f64();
    let mut times = vec![DateTime::<Utc>::MIN_UTC; n];
    while let Some(joined) = tasks.join_next().await {
        let (i, at) = joined?;
        times[i] = at?;
    }
    let offered = if n > 1 {
        (n - 1) as f64 / scheduled.max(1e-6)
    } else {
        rate
    };
    Ok((times, offered))
}
