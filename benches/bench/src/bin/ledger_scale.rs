//! The ledger at scale: the latency of the worker's claim and record statements, and of the
//! retention's batch delete, on a `sent_notifications` table already holding many rows.
//!
//! ```text
//! cargo run -p mailroom-bench --bin ledger_scale -- <database-url> [pairs] [delete-batches]
//! ```
//! The database must hold mailroom's schema (its migrations) and the rows to measure against;
//! docs/CAPACITY.md says how the 10-million-row tables were filled. It prints the row count,
//! the table's and each index's bytes, then p50/p99/max of: a claim of a new job, the record of
//! `sent` on it (`Database::claim` and `Database::record`, the worker's own statements and
//! pool, pinged before each use), a claim refused because the job was sent before (a
//! redelivered copy), and `Database::delete_settled_before` batches of the retention (45 days).
//! The pairs it adds stay (delete them with the database).

use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use mailroom::db::group::Ledger;
use mailroom::db::{Claim, Database, OnAcquire};
use mailroom::worker::retention::BATCH;
use mailroom_bench::pair;
use sqlx::Row;

const KIND: &str = "receipt";
const RETENTION: Duration = Duration::from_secs(45 * 86_400);

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let url = args
        .first()
        .context("usage: ledger_scale <database-url> [pairs] [batches]")?;
    let pairs: usize = args.get(1).map_or(Ok(2000), |s| s.parse())?;
    let batches: usize = args.get(2).map_or(Ok(20), |s| s.parse())?;
    let url = url.parse().map_err(anyhow::Error::msg)?;
    let db = Database::connect(&url, 2, OnAcquire::Ping).await?;
    sizes(&db).await?;

    let ledger = Ledger::direct(db.clone(), Default::default());
    let (mut claim, mut record) = (hist(), hist());
    let log_before = log_bytes(&db).await?;
    for _ in 0..pairs {
        let job_id = uuid::Uuid::new_v4().to_string();
        let (c, r) = pair::claim_and_record(&ledger, &job_id, KIND).await?;
        claim.record(micros(c))?;
        record.record(micros(r))?;
    }
    let logged = log_bytes(&db).await? - log_before;
    println!(
        "log written during the pairs (the whole server's: others' writes count too): {logged} B = {} B per claim + record",
        logged / pairs.max(1) as i64
    );
    show("claim (new job)", &claim);
    show("record sent", &record);

    let mut dup = hist();
    for (job_id, kind) in existing_sent(&db, pairs.min(2000)).await? {
        let t = Instant::now();
        // The message id's length is what matters to the row; its exact form is the worker's.
        let request = pair::claim_request(&job_id, &kind, "<bench.receipt@mailroom.example>");
        let answer = db.claim(&request).await?;
        dup.record(micros(t.elapsed()))?;
        anyhow::ensure!(
            matches!(answer, Claim::Refused(_)),
            "a sent job was claimed again"
        );
    }
    show("claim refused (sent before)", &dup);

    let (mut delete, mut rows, mut each) = (hist(), 0, Vec::new());
    let started = Instant::now();
    for _ in 0..batches {
        let t = Instant::now();
        rows += db.delete_settled_before(RETENTION, BATCH).await?;
        each.push(t.elapsed().as_secs_f64() * 1000.0);
        delete.record(micros(t.elapsed()))?;
    }
    show("retention batch delete", &delete);
    // Dead rows left behind by earlier batches can slow the later ones down.
    let tenth = (each.len() / 10).max(1);
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len().max(1) as f64;
    println!(
        "retention: first tenth of batches {:.1} ms each, last tenth {:.1} ms each",
        mean(&each[..tenth.min(each.len())]),
        mean(&each[each.len().saturating_sub(tenth)..])
    );
    let secs = started.elapsed().as_secs_f64();
    println!(
        "retention: {rows} rows in {secs:.2} s = {:.0} rows/s",
        rows as f64 / secs
    );
    Ok(())
}

/// `n` sent rows spread over the table (not the hot, just-written ones).
async fn existing_sent(db: &Database, n: usize) -> anyhow::Result<Vec<(String, String)>> {
    let rows = match db {
        Database::Postgres(pool) => sqlx::query(
            "SELECT job_id, kind FROM sent_notifications TABLESAMPLE SYSTEM (1)
                 WHERE status = 'sent' LIMIT $1",
        )
        .bind(n as i64)
        .fetch_all(pool)
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect(),
        Database::MySql(pool) => {
            sqlx::query(
                // Text job ids only (a table filled with MariaDB's `UUID()` may hold binary ones).
                "SELECT CAST(job_id AS CHAR), kind FROM sent_notifications
                 WHERE status = 'sent' AND job_id REGEXP '^[0-9a-f-]{36}$' LIMIT ?",
            )
            .bind(n as i64)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
        }
    };
    Ok(rows)
}

/// Bytes the server has written to its log so far: PostgreSQL's WAL position, MariaDB's
/// `Binlog_bytes_written`.
async fn log_bytes(db: &Database) -> anyhow::Result<i64> {
    Ok(match db {
        Database::Postgres(pool) => {
            sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint")
                .fetch_one(pool)
                .await?
        }
        Database::MySql(pool) => {
            let text: String = sqlx::query_scalar(
                "SELECT variable_value FROM information_schema.global_status
                 WHERE variable_name = 'BINLOG_BYTES_WRITTEN'",
            )
            .fetch_one(pool)
            .await?;
            text.parse()?
        }
    })
}

/// Rows, table bytes and index bytes of `sent_notifications`.
async fn sizes(db: &Database) -> anyhow::Result<()> {
    let lines: Vec<(String, i64)> = match db {
        Database::Postgres(pool) => {
            sqlx::query_as(
                "SELECT 'rows (estimate)', reltuples::bigint FROM pg_class
                     WHERE relname = 'sent_notifications'
                 UNION ALL SELECT 'table (heap + toast)', pg_table_size('sent_notifications')
                 UNION ALL SELECT indexrelid::regclass::text, pg_relation_size(indexrelid)
                     FROM pg_index WHERE indrelid = 'sent_notifications'::regclass",
            )
            .fetch_all(pool)
            .await?
        }
        Database::MySql(pool) => sqlx::query_as(
            "SELECT 'rows (estimate)', CAST(table_rows AS SIGNED) FROM information_schema.tables
                     WHERE table_schema = DATABASE() AND table_name = 'sent_notifications'
                 UNION ALL SELECT CONCAT('index ', index_name),
                     CAST(stat_value * @@innodb_page_size AS SIGNED)
                     FROM mysql.innodb_index_stats WHERE database_name = DATABASE()
                     AND table_name = 'sent_notifications' AND stat_name = 'size'",
        )
        .fetch_all(pool)
        .await?,
    };
    for (what, value) in lines {
        println!("{what}: {value}");
    }
    Ok(())
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

fn show(what: &str, h: &Histogram<u64>) {
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{what}: n={} p50={:.2} ms p99={:.2} ms max={:.2} ms",
        h.len(),
        ms(0.5),
        ms(0.99),
        h.max() as f64 / 1000.0
    );
}
