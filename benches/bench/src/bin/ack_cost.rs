//! What an ack costs the broker: consumes a backlog of `n` jobs from a quorum queue of its own
//! with the worker's prefetch, settling each delivery either with an ack of its own (as the
//! worker does) or with one `multiple` ack per `k` deliveries, and reports the consume rate and
//! the CPU RabbitMQ and this process spent per delivery.
//!
//! ```text
//! cargo run --release -p mailroom-bench --bin ack_cost -- <amqp-url> <n> <rate|max> <k>...
//! ```
//! `k = 1` is an ack per delivery, each from a task of its own; `rate` paces the consumer to
//! that many deliveries a second (the worker's own rate, where the broker batches less).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use anyhow::Context;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};
use mailroom_bench::procstat::{Roles, Snapshot};

const WINDOW: usize = 256;
const PREFETCH: u16 = 64;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, n, rate, ks @ ..] = &args[..] else {
        anyhow::bail!("usage: ack_cost <amqp-url> <n> <rate|max> <k>...");
    };
    let n: usize = n.parse().context("n")?;
    let rate: Option<f64> = (rate != "max")
        .then(|| rate.parse())
        .transpose()
        .context("rate")?;
    for k in ks {
        let k: usize = k.parse().context("k")?;
        run(url, n, rate, k).await?;
    }
    Ok(())
}

async fn run(url: &str, n: usize, rate: Option<f64>, k: usize) -> anyhow::Result<()> {
    let queue = "mailroom-bench-ack-cost";
    let conn = Connection::connect(url, Default::default()).await?;
    let ch = conn.create_channel().await?;
    let _ = ch
        .queue_delete(queue.into(), QueueDeleteOptions::default())
        .await;
    let args = mailroom::broker::quorum_queue_args();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), durable, args).await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let body = vec![b'x'; 400];
    let mut pending = Vec::with_capacity(WINDOW);
    for i in 0..n {
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
        pending.push(confirm);
        if pending.len() == WINDOW || i + 1 == n {
            for confirm in pending.drain(..) {
                anyhow::ensure!(confirm.await?.is_ack(), "the broker refused a message");
            }
        }
    }

    let cch = conn.create_channel().await?;
    cch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
    let roles = Roles::default();
    let before = Snapshot::take(&roles);
    let t0 = Instant::now();
    let mut consumer = cch
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let acked = Arc::new(AtomicUsize::new(0));
    let mut seen = 0;
    while seen < n {
        let delivery = consumer.next().await.context("consumer ended")??;
        seen += 1;
        if let Some(rate) = rate {
            let due = t0 + std::time::Duration::from_secs_f64(seen as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        if k == 1 {
            let acked = acked.clone();
            tokio::spawn(async move {
                if delivery.ack(BasicAckOptions::default()).await.is_ok() {
                    acked.fetch_add(1, Ordering::Relaxed);
                }
            });
        } else if seen % k == 0 || seen == n {
            delivery.ack(BasicAckOptions { multiple: true }).await?;
            acked.store(seen, Ordering::Relaxed);
        }
    }
    while acked.load(Ordering::Relaxed) < n {
        tokio::task::yield_now().await;
    }
    // The queue is empty once every ack has been applied.
    loop {
        let q = ch
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        if q.message_count() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = before.share_until(&Snapshot::take(&roles));
    let per = |share: f64| share / 100.0 * secs / n as f64 * 1e6;
    println!(
        "k={k:>3}: {:>6.0} deliveries/s; RabbitMQ {:>5.1} µs, consumer {:>5.1} µs per delivery; machine {:.0} %",
        n as f64 / secs,
        per(cpu.broker),
        per(cpu.bench),
        cpu.machine_busy
    );
    ch.queue_delete(queue.into(), QueueDeleteOptions::default())
        .await?;
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}
