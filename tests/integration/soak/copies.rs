//! Duplicate copies of committed jobs, published straight to the soak's exchange as a relay
//! that published a row twice (a lost confirm) would: the `starve-smtp` op sends them so that
//! two copies of one job meet in workers that wait for SMTP sessions.

use mailroom::broker;
use mailroom::db::Database;

use crate::helpers::TestApp;

/// Publishes a copy of up to `n` jobs whose claim is held now (`sending`: a worker may be
/// waiting for an SMTP session on it) and of the `n` newest outbox rows; returns how many the
/// broker confirmed (the nemesis may have closed the connection under it: fewer is fine).
pub async fn publish(app: &TestApp, n: u32) -> usize {
    let mut copies = rows(app, SENDING, n).await;
    copies.extend(rows(app, NEWEST, n).await);
    let mut confirmed = 0;
    let attempt = async {
        let conn = lapin::Connection::connect(&app.amqp_url, Default::default()).await?;
        let ch = broker::confirm_channel(&conn).await?;
        for (job_id, kind, payload) in &copies {
            let props = broker::job_properties(job_id, kind, 1);
            let exchange = &app.topology.exchange;
            broker::publish_confirmed(&ch, exchange, kind, payload.as_bytes(), props).await?;
            confirmed += 1;
        }
        let _ = conn.close(0, "copies published".into()).await;
        anyhow::Ok(())
    };
    let _ = attempt.await;
    confirmed
}

/// Which rows to copy: (PostgreSQL, MySQL) statements, `LIMIT` bound to `n`. On MySQL the
/// job_id is VARBINARY (byte-exact keys), read back as text.
type Query = (&'static str, &'static str);

const SENDING: Query = (
    "SELECT o.job_id, o.kind, o.payload::text FROM mailroom_outbox o \
     JOIN sent_notifications n ON n.job_id = o.job_id AND n.kind = o.kind \
     WHERE n.status = 'sending' LIMIT $1",
    "SELECT CAST(o.job_id AS CHAR CHARACTER SET utf8mb4), o.kind, CAST(o.payload AS CHAR) \
     FROM mailroom_outbox o \
     JOIN sent_notifications n ON n.job_id = o.job_id AND n.kind = o.kind \
     WHERE n.status = 'sending' LIMIT ?",
);

const NEWEST: Query = (
    "SELECT job_id, kind, payload::text FROM mailroom_outbox ORDER BY id DESC LIMIT $1",
    "SELECT CAST(job_id AS CHAR CHARACTER SET utf8mb4), kind, CAST(payload AS CHAR) \
     FROM mailroom_outbox ORDER BY id DESC LIMIT ?",
);

/// `(job_id, kind, payload)` of the rows `query` selects, at most `n`.
async fn rows(app: &TestApp, (pg, my): Query, n: u32) -> Vec<(String, String, String)> {
    match &app.db {
        Database::Postgres(pool) => sqlx::query_as(pg).bind(i64::from(n)).fetch_all(pool).await,
        Database::MySql(pool) => sqlx::query_as(my).bind(i64::from(n)).fetch_all(pool).await,
    }
    .unwrap()
}
