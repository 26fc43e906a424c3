//! Dead letters: N letters published to the dead-letter exchange are ingested into the table
//! by `mailroom dlq ingest`, then all replayed by `mailroom dlq replay --all` (the release
//! binary, or `MAILROOM_BENCH_BIN`, as an operator runs them): rows/s of each, process start
//! included, against RabbitMQ's raw persistent publish + confirm.

use std::time::Instant;

use anyhow::Context;
use lapin::options::BasicPublishOptions;
use lapin::types::AMQPValue;
use mailroom::broker;

use crate::workload;
use crate::world::{Services, World};

/// What a dead-letter run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DlqRun {
    pub n: usize,
    /// Letters ingested into the table per second.
    pub ingest_rows_per_s: f64,
    /// Rows republished (confirmed) and marked replayed per second.
    pub replay_rows_per_s: f64,
    /// Rows the replay moved (all `n` unless something failed).
    pub moved: usize,
}

/// Publishes `n` dead letters, ingests them and replays them all, each step timed.
pub async fn run(services: &Services, n: usize) -> anyhow::Result<DlqRun> {
    let world = World::create(services, "dlq", 4).await?;
    let result = run_in(&world, n).await;
    world.cleanup().await;
    result
}

async fn run_in(world: &World, n: usize) -> anyhow::Result<DlqRun> {
    let now = chrono::Utc::now();
    let mut confirms = Vec::with_capacity(n);
    for i in 0..n {
        let (job_id, body) = workload::job("dead", i, now);
        let props = broker::with_headers(
            &broker::job_properties(&job_id, workload::KIND, 1),
            &[
                (
                    "x-mailroom-error",
                    broker::text_value("550 5.1.1 no such user"),
                ),
                ("x-mailroom-error-class", broker::text_value("rejected")),
                ("x-mailroom-attempts", AMQPValue::LongLongInt(1)),
            ],
        );
        confirms.push(
            world
                .publisher
                .basic_publish(
                    world.topology.dlx.as_str().into(),
                    workload::KIND.into(),
                    BasicPublishOptions::default(),
                    &body,
                    props,
                )
                .await?,
        );
    }
    for c in confirms {
        anyhow::ensure!(c.await?.is_ack(), "a dead letter was not confirmed");
    }
    let started = Instant::now();
    mailroom_dlq(world, &["ingest"]).await?;
    let ingest_secs = started.elapsed().as_secs_f64();
    let count = |state: &'static str| async move {
        let n: i64 =
            sqlx::query_scalar("SELECT count(*) FROM mailroom_dead_letters WHERE state = $1")
                .bind(state)
                .fetch_one(world.pg_pool())
                .await?;
        anyhow::Ok(usize::try_from(n)?)
    };
    let ingested = count("dead").await?;
    anyhow::ensure!(ingested == n, "ingested {ingested} of {n} dead letters");

    let started = Instant::now();
    mailroom_dlq(world, &["replay", "--all", "--by", "bench"]).await?;
    let replay_secs = started.elapsed().as_secs_f64();
    let moved = count("replayed").await?;
    anyhow::ensure!(moved == n, "replayed {moved} of {n} dead letters");
    world.purge_work_queue().await?;
    Ok(DlqRun {
        n,
        ingest_rows_per_s: n as f64 / ingest_secs,
        replay_rows_per_s: moved as f64 / replay_secs,
        moved,
    })
}

/// Runs `mailroom dlq <args>` on `world` to its end.
async fn mailroom_dlq(world: &World, args: &[&str]) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(&crate::mailroom().bin)
        .arg("dlq")
        .args(args)
        .env("DATABASE_URL", &world.process_db_url)
        .env("AMQP_URL", &world.services.amqp_url)
        .env("MAILROOM_NAMESPACE", &world.namespace)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running mailroom dlq {}", args.join(" ")))?;
    anyhow::ensure!(
        out.status.success(),
        "mailroom dlq {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
