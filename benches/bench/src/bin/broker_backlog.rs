//! A backlog on the broker: publishes `n` jobs (the bench's `welcome` job, a UUID for its id,
//! mailroom's message properties, persistent, confirmed) to a quorum queue of their own, so
//! the broker's memory per queued job can be read with `rabbitmqctl` before and after.
//!
//! ```text
//! cargo run -p mailroom-bench --bin broker_backlog -- <amqp-url> <queue> <n>   # fill
//! cargo run -p mailroom-bench --bin broker_backlog -- <amqp-url> <queue> delete
//! ```
//! The queue is declared as mailroom declares its work queue (`x-queue-type: quorum`); it is
//! never one of mailroom's own, so nothing consumes it: delete it when done.

use anyhow::Context;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::{BasicProperties, Connection};
use serde_json::json;

/// Confirms awaited together: the publisher's window.
const WINDOW: usize = 256;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, queue, what] = &args[..] else {
        anyhow::bail!("usage: broker_backlog <amqp-url> <queue> <n | delete>");
    };
    let conn = Connection::connect(url, Default::default()).await?;
    let ch = conn.create_channel().await?;
    if what == "delete" {
        let n = ch
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await?;
        println!("deleted {queue} holding {n} messages");
        return Ok(());
    }
    let n: usize = what.parse().context("n")?;
    let args = mailroom::broker::quorum_queue_args();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.as_str().into(), durable, args)
        .await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut bytes = 0;
    let mut pending = Vec::with_capacity(WINDOW);
    for i in 0..n {
        let job_id = uuid::Uuid::new_v4().to_string();
        let body = serde_json::to_vec(&job(&job_id, i))?;
        bytes += body.len();
        let props: BasicProperties =
            mailroom::broker::job_properties(&job_id, "welcome", 1).with_delivery_mode(2);
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                &body,
                props,
            )
            .await?;
        pending.push(confirm);
        if pending.len() == WINDOW || i + 1 == n {
            for confirm in pending.drain(..) {
                anyhow::ensure!(confirm.await?.is_ack(), "the broker refused a message");
            }
        }
    }
    println!(
        "published {n} jobs to {queue}, {} body bytes each on average",
        bytes / n.max(1)
    );
    Ok(())
}

/// The bench's `welcome` job (benches/bench/src/workload.rs), as a producer writes it.
fn job(job_id: &str, i: usize) -> serde_json::Value {
    json!({
        "job_id": job_id,
        "kind": "welcome",
        "to": [format!("Ada Lovelace <ada+{i}@example.com>")],
        "data": {
            "product_name": "Acme Cloud",
            "user": { "name": "Ada" },
            "getting_started_url": "https://acme.example/start?utm_source=email&utm_campaign=welcome",
            "support_email": "support@acme.example"
        },
        "created_at": chrono::Utc::now(),
    })
}
