//! The raw limits of this machine, measured in the same run with mailroom's own settings and
//! code paths, but without mailroom's work in between:
//! - broker: persistent publish + confirm (pipelined, a window of unconfirmed publishes) to the
//!   same quorum queue topology (`broker::declare_topology`), consumed with the worker's prefetch
//!   and one manual ack per delivery;
//! - database: `Database::claim` then `Database::record(sent)` (the very statements the worker
//!   runs), each its own commit, from as many tasks as the worker's concurrency, through a pool
//!   of the worker's size;
//! - SMTP: `smtp-sink`'s accept rate driven through mailroom's `Mailer` (same pool
//!   size, same semaphore, same timeout) with the email the worker sends; and, for reference,
//!   by Postfix's `smtp-source`.
//!
//! Each also measures its unloaded latency: one operation at a time, which is the floor a single
//! job's latency can reach through that part.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{StreamExt, TryStreamExt};
use lapin::{Connection, options::*, types::FieldTable};
use mailroom::broker::{self, Acks};
use mailroom::db::Database;
use mailroom::db::LedgerStatus;
use mailroom::db::group::Ledger;
use mailroom::job::EmailJob;
use mailroom::render::Templates;
use mailroom::smtp::{Mailer, MailerSettings};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::latency::{Lat, Recorder};
use crate::pair;
use crate::procstat::{CpuShare, Roles, Snapshot};
use crate::workload::{self, KIND};
use crate::world::{Services, SmtpSink, World};

/// The worker's defaults (`mailroom worker --help`), which the raw runs mirror.
pub const WORKER_CONCURRENCY: usize = 32;
pub const WORKER_PREFETCH: u16 = 64;
pub const WORKER_SMTP_CONNECTIONS: u32 = 16;
/// Unconfirmed publishes a pipelining producer keeps in flight.
pub const PUBLISH_WINDOW: usize = 256;
/// Lease used for claims (the worker's default).
pub const FROM: &str = "Mailroom Bench <noreply@mailroom.bench>";

#[derive(Clone, Debug, Serialize)]
pub struct RawBroker {
    pub n: usize,
    /// Messages per second through publish + confirm + consume + ack.
    pub rate: f64,
    pub window: usize,
    pub prefetch: u16,
    /// Publish start → delivered to the consumer, at full rate (includes queueing).
    pub loaded: Lat,
    /// The same, one message at a time.
    pub floor: Lat,
    pub cpu: CpuShare,
    /// Consume + ack of a backlog (what a worker-only run asks of the broker): deliveries/s.
    pub drain_rate: f64,
    pub drain_cpu: CpuShare,
}

#[derive(Clone, Debug, Serialize)]
pub struct RawDb {
    pub n: usize,
    /// claim + record pairs per second, each statement its own commit.
    pub rate: f64,
    /// The same through the worker's group commit (`Ledger`, groups of `group`).
    pub grouped_rate: f64,
    pub group: usize,
    /// Mean claims and records per group commit in the grouped run.
    pub mean_group: f64,
    pub concurrency: usize,
    pub claim: Lat,
    pub record: Lat,
    /// One claim + record at a time (the sum of both statements).
    pub floor: Lat,
    pub cpu: CpuShare,
    /// The CPU of the grouped run.
    pub grouped_cpu: CpuShare,
}

#[derive(Clone, Debug, Serialize)]
pub struct RawSmtp {
    pub n: usize,
    /// Messages per second accepted by smtp-sink, driven through mailroom's `Mailer`.
    pub rate: f64,
    /// The same, each message waiting for a connection of its own instead of riding behind a
    /// send in progress: one write and one read more per message.
    pub alone_rate: f64,
    pub alone_cpu: CpuShare,
    pub concurrency: usize,
    pub connections: u32,
    pub message_bytes: usize,
    pub loaded: Lat,
    pub floor: Lat,
    /// The same server driven by Postfix's `smtp-source` (16 sessions, connections reused).
    pub smtp_source_rate: Option<f64>,
    /// Bare lettre `AsyncSmtpConnection`s over sockets with TCP_NODELAY (Nagle off), same
    /// number of connections, without `Mailer`'s pool, semaphore and timeout: the cost of
    /// those. (lettre's own pooled transport, without TCP_NODELAY, stalled 40 ms per message
    /// on the delayed ACK: 352 msg/s here before mailroom opened its own sockets.)
    pub nodelay_rate: Option<f64>,
    pub nodelay_floor: Option<Lat>,
    pub cpu: CpuShare,
}

/// Broker: persistent publish + confirm + consume + manual ack on the quorum queue.
pub async fn broker(services: &Services, n: usize, floor_n: usize) -> anyhow::Result<RawBroker> {
    let world = World::create(services, "raw-broker", 1).await?;
    let result = broker_in(&world, services, n, floor_n).await;
    world.cleanup().await;
    let mut result = result?;
    let world = World::create(services, "raw-drain", 1).await?;
    let drain = drain_in(&world, services, n).await;
    world.cleanup().await;
    (result.drain_rate, result.drain_cpu) = drain?;
    Ok(result)
}

/// A backlog of `n` jobs published first, then consumed with the worker's prefetch and acked
/// through the worker's [`Acks`], one ask per delivery from a task of its own: deliveries/s
/// and the CPU of the drain alone.
async fn drain_in(world: &World, services: &Services, n: usize) -> anyhow::Result<(f64, CpuShare)> {
    futures_util::stream::iter(0..n)
        .map(|i| {
            let (job_id, body) = workload::job("rawd", i, chrono::Utc::now());
            let props = broker::job_properties(&job_id, KIND, 1);
            let ch = world.publisher.clone();
            let exchange = world.topology.exchange.clone();
            async move { broker::publish_confirmed(&ch, &exchange, KIND, &body, props).await }
        })
        .buffer_unordered(PUBLISH_WINDOW)
        .try_collect::<Vec<()>>()
        .await?;
    let roles = Roles::default();
    let before = Snapshot::take(&roles);
    let t0 = Instant::now();
    let (cconn, mut consumer) = worker_consumer(world, services).await?;
    let acks = Acks::new(broker::AckPolicy::for_consumer(
        WORKER_PREFETCH,
        WORKER_CONCURRENCY,
    ));
    let acked = Arc::new(AtomicUsize::new(0));
    for _ in 0..n {
        let delivery = tokio::time::timeout(Duration::from_secs(60), consumer.next())
            .await
            .context("broker drain: deliveries stopped")?
            .context("consumer ended")??;
        let (acks, acked) = (acks.clone(), acked.clone());
        tokio::spawn(async move {
            if let Ok(true) = acks.ack(&delivery.acker, delivery.delivery_tag).await {
                acked.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while acked.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = before.share_until(&Snapshot::take(&roles));
    let _ = cconn.close(200, "done".into()).await;
    Ok((n as f64 / elapsed, cpu))
}

/// A consumer of the world's work queue as a worker has one: a connection of its own and the
/// worker's prefetch.
async fn worker_consumer(
    world: &World,
    services: &Services,
) -> anyhow::Result<(Connection, lapin::Consumer)> {
    let conn = Connection::connect(&services.amqp_url, Default::default()).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(WORKER_PREFETCH, BasicQosOptions::default())
        .await?;
    let consumer = ch
        .basic_consume(
            world.topology.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok((conn, consumer))
}

async fn broker_in(
    world: &World,
    services: &Services,
    n: usize,
    floor_n: usize,
) -> anyhow::Result<RawBroker> {
    let total = floor_n + n;
    let started = Instant::now();
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
    let stamp = |i: usize| sent[i].store(started.elapsed().as_nanos() as u64, Ordering::Relaxed);

    let (cconn, mut consumer) = worker_consumer(world, services).await?;
    let (tx, mut rx) = mpsc::unbounded_channel::<(usize, Duration)>();
    let acked = Arc::new(AtomicUsize::new(0));
    let consume = {
        let sent = sent.clone();
        let acked = acked.clone();
        tokio::spawn(async move {
            let mut seen = 0;
            while seen < total {
                let Some(Ok(delivery)) = consumer.next().await else {
                    break;
                };
                seen += 1;
                let now = started.elapsed();
                let i = delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .and_then(|id| workload::index_of(id.as_str()))
                    .unwrap_or(0);
                let at = Duration::from_nanos(sent[i.min(total - 1)].load(Ordering::Relaxed));
                let _ = tx.send((i, now.saturating_sub(at)));
                let acked = acked.clone();
                // One manual ack per delivery, from a task of its own, as the worker does.
                tokio::spawn(async move {
                    if delivery.ack(BasicAckOptions::default()).await.is_ok() {
                        acked.fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        })
    };

    let publish = |i: usize| {
        stamp(i);
        let (job_id, body) = workload::job("rawb", i, chrono::Utc::now());
        let props = broker::job_properties(&job_id, KIND, 1);
        let ch = world.publisher.clone();
        let exchange = world.topology.exchange.clone();
        async move { broker::publish_confirmed(&ch, &exchange, KIND, &body, props).await }
    };

    // Floor: one message at a time, publish → delivered.
    let mut floor = Recorder::default();
    for i in 0..floor_n {
        publish(i).await?;
        let (_, lat) = rx.recv().await.context("consumer ended")?;
        floor.record_duration(lat);
    }

    // Full rate: pipelined publishes while the consumer drains.
    let roles = Roles::default();
    let before = Snapshot::take(&roles);
    let t0 = Instant::now();
    futures_util::stream::iter(floor_n..total)
        .map(publish)
        .buffer_unordered(PUBLISH_WINDOW)
        .try_collect::<Vec<()>>()
        .await?;
    let mut loaded = Recorder::default();
    for _ in 0..n {
        let (_, lat) = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .context("broker raw run: deliveries stopped")?
            .context("consumer ended")?;
        loaded.record_duration(lat);
    }
    while acked.load(Ordering::Relaxed) < total {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = before.share_until(&Snapshot::take(&roles));
    consume.abort();
    let _ = cconn.close(200, "done".into()).await;
    Ok(RawBroker {
        n,
        rate: n as f64 / elapsed,
        window: PUBLISH_WINDOW,
        prefetch: WORKER_PREFETCH,
        loaded: loaded.summary(true),
        floor: floor.summary(false),
        cpu,
        drain_rate: 0.0,
        drain_cpu: CpuShare::default(),
    })
}

/// Database: `Database::claim` + `Database::record(sent)`, own commit each, at `concurrency`;
/// then the same through the worker's `Ledger` with group commit.
pub async fn database(
    services: &Services,
    n: usize,
    floor_n: usize,
    concurrency: usize,
) -> anyhow::Result<RawDb> {
    // The worker's pool: concurrency + 2 connections.
    let world = World::create(services, "raw-db", concurrency as u32 + 2).await?;
    let result = database_in(&world.db, n, floor_n, concurrency).await;
    world.cleanup().await;
    result
}

async fn claim_and_record(
    db: &Ledger,
    i: usize,
    claim_lat: &mut Recorder,
    record_lat: &mut Recorder,
) -> anyhow::Result<()> {
    let (claimed, recorded) = pair::claim_and_record(db, &format!("rawdb-{i}"), KIND).await?;
    claim_lat.record_duration(claimed);
    record_lat.record_duration(recorded);
    Ok(())
}

async fn database_in(
    db: &Database,
    n: usize,
    floor_n: usize,
    concurrency: usize,
) -> anyhow::Result<RawDb> {
    // Open the pool's connections first, so connecting is not part of the measurement.
    let Database::Postgres(pool) = db else {
        anyhow::bail!("the benchmark runs on PostgreSQL");
    };
    let conns =
        futures_util::future::try_join_all((0..concurrency).map(|_| pool.acquire())).await?;
    drop(conns);

    let direct = Ledger::direct(db.clone(), Default::default());
    let mut floor_claim = Recorder::default();
    let mut floor_record = Recorder::default();
    let mut floor = Recorder::default();
    for i in 0..floor_n {
        let t = Instant::now();
        claim_and_record(&direct, i, &mut floor_claim, &mut floor_record).await?;
        floor.record_duration(t.elapsed());
    }
    let (rate, claim, record, cpu) = pairs(&direct, floor_n, n, concurrency).await?;
    let grouped = Ledger::direct(db.clone(), Default::default()).grouped(GROUP);
    let (grouped_rate, _, _, grouped_cpu) = pairs(&grouped, floor_n + n, n, concurrency).await?;
    let stats = grouped.stats();
    let mean_group = stats.writes.load(Ordering::Relaxed) as f64
        / stats.groups.load(Ordering::Relaxed).max(1) as f64;
    Ok(RawDb {
        n,
        rate,
        grouped_rate,
        group: GROUP,
        mean_group,
        concurrency,
        claim,
        record,
        floor: floor.summary(false),
        cpu,
        grouped_cpu,
    })
}

/// The worker's default `MAILROOM_LEDGER_GROUP`.
const GROUP: usize = 64;

/// `n` claim + record pairs from job `first` on, by `concurrency` clients: pairs/s, the
/// latencies of claims and records, and the CPU of each process.
async fn pairs(
    db: &Ledger,
    first: usize,
    n: usize,
    concurrency: usize,
) -> anyhow::Result<(f64, Lat, Lat, CpuShare)> {
    let next = Arc::new(AtomicUsize::new(first));
    let total = first + n;
    let roles = Roles::default();
    let before = Snapshot::take(&roles);
    let t0 = Instant::now();
    let tasks = (0..concurrency).map(|_| {
        let db = db.clone();
        let next = next.clone();
        tokio::spawn(async move {
            let mut claim = Recorder::default();
            let mut record = Recorder::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    break;
                }
                claim_and_record(&db, i, &mut claim, &mut record).await?;
            }
            anyhow::Ok((claim, record))
        })
    });
    let mut claim = Recorder::default();
    let mut record = Recorder::default();
    for r in futures_util::future::join_all(tasks).await {
        let (c, r) = r??;
        claim.merge(&c);
        record.merge(&r);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = before.share_until(&Snapshot::take(&roles));
    // The statements are the worker's: make sure they did what the worker relies on.
    let sent = db
        .database()
        .notification(&format!("rawdb-{}", total - 1), KIND)
        .await?
        .map(|r| r.status);
    anyhow::ensure!(sent == Some(LedgerStatus::Sent), "raw db run left {sent:?}");
    Ok((
        n as f64 / elapsed,
        claim.summary(false),
        record.summary(false),
        cpu,
    ))
}

/// The email the worker sends for a bench job, built by mailroom's own templates and `Mailer`.
pub async fn bench_mailer(
    sink: &SmtpSink,
) -> anyhow::Result<(Mailer, mailroom::smtp::Outgoing, usize)> {
    bench_mailer_at(&sink.url()).await
}

/// [`bench_mailer`] sending to `url`.
async fn bench_mailer_at(url: &str) -> anyhow::Result<(Mailer, mailroom::smtp::Outgoing, usize)> {
    let templates = Templates::load(&crate::mailroom().templates).context("loading templates/")?;
    let (_, body) = workload::job("rawsmtp", 0, chrono::Utc::now());
    let job = EmailJob::decode(&body)?;
    let rendered = templates.render(KIND, None, &job.job.data)?;
    let mailer = Mailer::new(&MailerSettings {
        url: url.parse().map_err(anyhow::Error::msg)?,
        from: FROM.parse()?,
        message_id_domain: "mailroom.bench".into(),
        timeout: Duration::from_secs(60),
        max_connections: WORKER_SMTP_CONNECTIONS,
        // As a worker whose lease covers a wait for a connection: a sender may wait in line.
        reserved_ahead: WORKER_SMTP_CONNECTIONS,
        deeper: None,
        dkim: None,
    })?;
    let message = mailer.build(&job, &rendered).await?;
    let bytes = message.bytes.len();
    Ok((mailer, message, bytes))
}

/// SMTP: smtp-sink's accept rate through `Mailer` with the worker's pool settings.
pub async fn smtp(sink: &SmtpSink, n: usize, floor_n: usize) -> anyhow::Result<RawSmtp> {
    let (mailer, message, bytes) = bench_mailer(sink).await?;
    let mailer = Arc::new(mailer);
    let message = Arc::new(message);
    let mut floor = Recorder::default();
    for _ in 0..floor_n {
        let t = Instant::now();
        mailer
            .send(&message)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        floor.record_duration(t.elapsed());
    }
    let (rate, loaded, cpu) = smtp_loaded(&mailer, &message, sink, n, true).await?;
    let (alone_rate, _, alone_cpu) = smtp_loaded(&mailer, &message, sink, n, false).await?;
    let smtp_source_rate = smtp_source(sink, n, bytes).await.ok();
    let nodelay = smtp_nodelay(sink, &message, n, floor_n).await;
    if let Err(e) = &nodelay {
        eprintln!("bench: lettre with TCP_NODELAY: {e:#}");
    }
    let (nodelay_rate, nodelay_floor) = match nodelay {
        Ok((rate, floor)) => (Some(rate), Some(floor)),
        Err(_) => (None, None),
    };
    Ok(RawSmtp {
        n,
        rate,
        alone_rate,
        alone_cpu,
        concurrency: WORKER_CONCURRENCY,
        connections: WORKER_SMTP_CONNECTIONS,
        message_bytes: bytes,
        loaded,
        floor: floor.summary(false),
        smtp_source_rate,
        nodelay_rate,
        nodelay_floor,
        cpu,
    })
}

/// smtp-sink "far away": `Mailer` through [`crate::delay::DelayProxy`] at two round-trip
/// times, `n` messages riding along and `n` on their own round trips each.
pub async fn smtp_far(sink: &SmtpSink, n: usize) -> anyhow::Result<Vec<FarSmtp>> {
    let mut runs = vec![];
    for rtt_ms in [2, 10] {
        let delay = Duration::from_micros(rtt_ms * 500);
        let proxy =
            crate::delay::DelayProxy::start(format!("127.0.0.1:{}", sink.port), delay).await?;
        let (mailer, message, _) = bench_mailer_at(&proxy.url()).await?;
        let (mailer, message) = (Arc::new(mailer), Arc::new(message));
        let (along, along_lat, _) = smtp_loaded(&mailer, &message, sink, n, true).await?;
        let (alone, alone_lat, _) = smtp_loaded(&mailer, &message, sink, n, false).await?;
        runs.push(FarSmtp {
            rtt_ms,
            n,
            along,
            along_lat,
            alone,
            alone_lat,
        });
    }
    Ok(runs)
}

/// One [`smtp_far`] run.
pub struct FarSmtp {
    pub rtt_ms: u64,
    pub n: usize,
    pub along: f64,
    pub along_lat: Lat,
    pub alone: f64,
    pub alone_lat: Lat,
}

/// `n` messages through `mailer` by [`WORKER_CONCURRENCY`] senders: (messages/s, latency of
/// each send, CPU). `along`: a sender waiting for a connection may ride behind a send in
/// progress (`Mailer::send`, as a worker's deliveries); otherwise each waits for a connection
/// of its own and sends with its own round trips.
async fn smtp_loaded(
    mailer: &Arc<mailroom::smtp::Mailer>,
    message: &Arc<mailroom::smtp::Outgoing>,
    sink: &SmtpSink,
    n: usize,
    along: bool,
) -> anyhow::Result<(f64, Lat, CpuShare)> {
    let roles = Roles {
        workers: vec![],
        smtp_sink: sink.pid(),
    };
    let before = Snapshot::take(&roles);
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let tasks = (0..WORKER_CONCURRENCY).map(|_| {
        let (mailer, message, next) = (mailer.clone(), message.clone(), next.clone());
        tokio::spawn(async move {
            let mut lat = Recorder::default();
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let t = Instant::now();
                let sent = if along {
                    mailer.send(&message).await
                } else {
                    let session = mailer.session().await.context("mailer closed")?;
                    mailer.send_in(&session, &message).await
                };
                sent.map_err(|e| anyhow::anyhow!("{e}"))?;
                lat.record_duration(t.elapsed());
            }
            anyhow::Ok(lat)
        })
    });
    let mut loaded = Recorder::default();
    for r in futures_util::future::join_all(tasks).await {
        loaded.merge(&r??);
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = before.share_until(&Snapshot::take(&roles));
    Ok((n as f64 / elapsed, loaded.summary(true), cpu))
}

/// A plain SMTP session of lettre's over a socket with Nagle off.
async fn nodelay_connection(
    sink: &SmtpSink,
) -> anyhow::Result<lettre::transport::smtp::client::AsyncSmtpConnection> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", sink.port)).await?;
    tcp.set_nodelay(true)?;
    Ok(
        lettre::transport::smtp::client::AsyncSmtpConnection::connect_with_transport(
            Box::new(tcp),
            &lettre::transport::smtp::extension::ClientId::default(),
        )
        .await?,
    )
}

/// (messages/s with as many connections as the worker's pool, one-at-a-time latency).
async fn smtp_nodelay(
    sink: &SmtpSink,
    message: &mailroom::smtp::Outgoing,
    n: usize,
    floor_n: usize,
) -> anyhow::Result<(f64, Lat)> {
    let envelope = message.envelope.clone();
    let bytes = Arc::new(message.bytes.clone());
    let mut conn = nodelay_connection(sink).await?;
    let mut floor = Recorder::default();
    for _ in 0..floor_n {
        let t = Instant::now();
        conn.send(&envelope, &bytes).await?;
        floor.record_duration(t.elapsed());
    }
    let _ = conn.quit().await;
    let mut conns = vec![];
    for _ in 0..WORKER_SMTP_CONNECTIONS {
        conns.push(nodelay_connection(sink).await?);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let tasks = conns.into_iter().map(|mut conn| {
        let (envelope, bytes, next) = (envelope.clone(), bytes.clone(), next.clone());
        tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < n {
                conn.send(&envelope, &bytes).await?;
            }
            let _ = conn.quit().await;
            anyhow::Ok(())
        })
    });
    for r in futures_util::future::join_all(tasks).await {
        r??;
    }
    Ok((n as f64 / t0.elapsed().as_secs_f64(), floor.summary(false)))
}

/// Postfix's C client against the same sink: 16 parallel sessions that reuse their connection.
async fn smtp_source(sink: &SmtpSink, n: usize, bytes: usize) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    let status = tokio::process::Command::new("/usr/sbin/smtp-source")
        .args([
            "-d",
            "-s",
            "16",
            "-m",
            &n.to_string(),
            "-l",
            &bytes.to_string(),
        ])
        .args(["-f", "bench@mailroom.bench", "-t", "sink@example.com"])
        .arg(format!("127.0.0.1:{}", sink.port))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await?;
    anyhow::ensure!(status.success(), "smtp-source failed: {status}");
    Ok(n as f64 / t0.elapsed().as_secs_f64())
}
