//! Duplicate copies of committed jobs, published straight to the soak's exchange as a relay
//! that published a row twice (a lost confirm) would: the `starve-smtp` op sends them so that
//! two copies of one job meet in workers that wait for SMTP sessions.

use mailroom::broker;
use mailroom::db::Database;

use crate::helpers::TestApp;

/// Publishes a copy of each of the `n` newest outbox rows; returns how many the broker
/// confirmed (the nemesis may have closed the connection under it: fewer is fine).
pub async fn publish(app: &TestApp, n: u32) -> usize {
    let rows = newest(app, n).await;
    let mut confirmed = 0;
    let attempt = async {
        let conn = lapin::Connection::connect(&app.amqp_url, Default::default()).await?;
        let ch = broker::confirm_channel(&conn).await?;
        for (job_id, kind, payload) in &rows {
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

/// `(job_id, kind, payload)` of the `n` rows committed last.
async fn newest(app: &TestApp, n: u32) -> Vec<(String, String, String)> {
    match &app.db {
        Database::Postgres(pool) => {
            sqlx::query_as(
                "SELECT job_id, kind, payload::text FROM mailroom_outbox ORDER BY id DESC LIMIT $1",
            )
            .bind(i64::from(n))
            .fetch_all(pool)
            .await
        }
        Database::MySql(pool) => {
            sqlx::query_as(
                // job_id is VARBINARY (byte-exact keys): read it back as text.
                "SELECT CAST(job_id AS CHAR CHARACTER SET utf8mb4), kind, CAST(payload AS CHAR) \
             FROM mailroom_outbox ORDER BY id DESC LIMIT ?",
            )
            .bind(i64::from(n))
            .fetch_all(pool)
            .await
        }
    }
    .unwrap()
}
