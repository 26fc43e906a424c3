//! The pool every mailroom process uses (`Database::connect_lazy`): a connection idle for a
//! while is pinged before use, so one the server dropped meanwhile is replaced instead of
//! failing a statement, while connections in steady use go straight to their statement; and a
//! server on this machine is spoken to in the clear unless the URL requires TLS.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use mailroom::config::SecretUrl;
use mailroom::db::{Database, Engine, OnAcquire, PING_IDLE_AFTER};

use crate::helpers::*;

/// The backend (PostgreSQL) or connection id (MySQL) of the session a pool hands out.
async fn session_id(db: &Database) -> Result<i64, sqlx::Error> {
    match db {
        Database::Postgres(pool) => {
            sqlx::query_scalar("SELECT pg_backend_pid()::int8")
                .fetch_one(pool)
                .await
        }
        Database::MySql(pool) => {
            sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
                .fetch_one(pool)
                .await
        }
    }
}

/// Waits until `db`'s one connection is idle in the pool: sqlx pings each connection as it goes
/// back, after the statement's answer, and a session dropped before that ping is already
/// replaced when the pool hands it out.
async fn back_in_the_pool(db: &Database) {
    eventually("the connection back in the pool", || async {
        let idle = match db {
            Database::Postgres(pool) => pool.num_idle(),
            Database::MySql(pool) => pool.num_idle(),
        };
        (idle == 1).then_some(())
    })
    .await;
}

/// Ends session `id` from the server's side, as a restart or an idle timeout would, and waits
/// until it is gone.
async fn drop_session(app: &TestApp, id: i64) {
    let kill = match engine() {
        Engine::Postgres => format!("SELECT pg_terminate_backend({id})"),
        Engine::MySql => format!("KILL CONNECTION {id}"),
    };
    app.execute(&kill).await;
    let gone = match engine() {
        Engine::Postgres => format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {id}"),
        Engine::MySql => {
            format!("SELECT count(*) FROM information_schema.processlist WHERE id = {id}")
        }
    };
    eventually("the dropped session is gone from the server", || async {
        (app.count(&gone).await == 0).then_some(())
    })
    .await;
}

/// A one-connection pool on `app`'s database.
fn one_connection(app: &TestApp, on_acquire: OnAcquire) -> Database {
    let url: SecretUrl = app.db_url.parse().unwrap();
    Database::connect_lazy_with(&url, 1, on_acquire).unwrap()
}

#[tokio::test]
async fn a_connection_the_server_dropped_while_idle_is_replaced_before_a_statement_fails_on_it() {
    let app = TestApp::spawn().await;
    for on_acquire in [OnAcquire::Ping, OnAcquire::NoPing] {
        let db = one_connection(&app, on_acquire);
        let first = session_id(&db).await.unwrap();
        back_in_the_pool(&db).await;
        drop_session(&app, first).await;
        // The pool's only connection, dead now, has been idle as long as the pool waits
        // before it pings: the idle time is the condition under test.
        tokio::time::sleep(PING_IDLE_AFTER + Duration::from_millis(100)).await;
        let next = session_id(&db).await;
        match on_acquire {
            OnAcquire::Ping => {
                let next = next.expect("the dead connection was replaced before the statement");
                assert_ne!(next, first, "a new session serves the statement");
            }
            // Without the ping the statement meets the dead connection: the fault landed.
            OnAcquire::NoPing => assert!(next.is_err(), "{next:?}"),
        }
        db.close().await;
    }
}

/// The pings `proxy` has carried once `db`'s one connection is back in the pool (sqlx pings
/// it there, after the statement's answer, on a task of its own). Holding it while reading
/// leaves one more ping to come, when it goes back again.
async fn pings_settled(db: &Database, proxy: &FaultProxy) -> usize {
    match db {
        Database::Postgres(pool) => {
            let _held = pool.acquire().await.unwrap();
            proxy.pings()
        }
        Database::MySql(pool) => {
            let _held = pool.acquire().await.unwrap();
            proxy.pings()
        }
    }
}

#[tokio::test]
async fn a_connection_in_steady_use_goes_to_its_statement_without_a_ping() {
    let app = TestApp::spawn().await;
    let port = url::Url::parse(&app.db_url)
        .unwrap()
        .port()
        .unwrap_or(match engine() {
            Engine::Postgres => 5432,
            Engine::MySql => 3306,
        });
    // On loopback, so in the clear: the proxy sees each ping.
    let proxy = FaultProxy::start(port).await;
    let url: SecretUrl = proxy.url_through(&app.db_url).parse().unwrap();
    let db = Database::connect_lazy_with(&url, 1, OnAcquire::Ping).unwrap();
    session_id(&db).await.unwrap();
    // sqlx 0.9 pings every connection as it goes back to the pool: one ping per statement,
    // and one for the connection `pings_settled` held. Any more are the pool's, before a
    // statement.
    let statements = 20;
    let before = pings_settled(&db, &proxy).await;
    for _ in 0..statements {
        session_id(&db).await.unwrap();
    }
    let busy = pings_settled(&db, &proxy).await - before;
    assert_eq!(
        busy,
        statements + 1,
        "pings around {statements} statements in a row: one as each connection went back to the pool, none before a statement"
    );
    // Idle past the pool's patience, the next statement is preceded by a ping.
    tokio::time::sleep(PING_IDLE_AFTER + Duration::from_millis(100)).await;
    let before = proxy.pings();
    session_id(&db).await.unwrap();
    let idle = pings_settled(&db, &proxy).await - before;
    assert_eq!(
        idle, 2,
        "pings around a statement on a connection idle for {PING_IDLE_AFTER:?}: one before it, one as it went back"
    );
    db.close().await;
}

#[tokio::test]
async fn a_server_on_loopback_is_spoken_to_in_the_clear_unless_the_url_requires_tls() {
    let app = TestApp::spawn().await;
    // The test servers offer TLS (PostgreSQL with Debian's snakeoil certificate, MariaDB with
    // the one scripts/services makes), so a plain session is mailroom's choice, not theirs.
    let (offered, cases): (bool, &[(&str, bool)]) = match &app.db {
        Database::Postgres(pool) => (
            sqlx::query_scalar::<_, String>("SHOW ssl")
                .fetch_one(pool)
                .await
                .unwrap()
                == "on",
            &[
                ("", false),
                ("sslmode=prefer", false),
                ("sslmode=allow", false),
                ("sslmode=require", true),
            ],
        ),
        Database::MySql(pool) => (
            sqlx::query_scalar::<_, String>("SELECT @@have_ssl")
                .fetch_one(pool)
                .await
                .unwrap()
                == "YES",
            &[
                ("", false),
                ("ssl-mode=preferred", false),
                ("ssl-mode=required", true),
            ],
        ),
    };
    assert!(
        offered,
        "the test server offers no TLS: run scripts/services, which configures it"
    );
    let sep = if app.db_url.contains('?') { '&' } else { '?' };
    for &(query, encrypted) in cases {
        let url = if query.is_empty() {
            app.db_url.clone()
        } else {
            format!("{}{sep}{query}", app.db_url)
        };
        let db = Database::connect(&url.parse().unwrap(), 1, OnAcquire::Ping)
            .await
            .unwrap();
        let ssl = match &db {
            Database::Postgres(pool) => {
                sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
                    .fetch_one(pool)
                    .await
                    .unwrap()
            }
            Database::MySql(pool) => {
                let (_, cipher): (String, String) =
                    sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
                        .fetch_one(pool)
                        .await
                        .unwrap();
                !cipher.is_empty()
            }
        };
        let named = if query.is_empty() {
            "no TLS mode"
        } else {
            query
        };
        assert_eq!(ssl, encrypted, "{named}");
        db.close().await;
    }
}

/// Every `application_name` of this test's database on PostgreSQL, sorted.
async fn session_names(app: &TestApp) -> Vec<String> {
    let Database::Postgres(pool) = &app.db else {
        unreachable!("PostgreSQL only")
    };
    sqlx::query_scalar(
        "SELECT application_name FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_process_names_its_sessions_after_its_subcommand_unless_the_url_names_them() {
    // MySQL's protocol has no session name that sqlx sets; `information_schema.processlist`
    // shows the user and host there.
    if engine() != Engine::Postgres {
        return;
    }
    let app = TestApp::spawn().await;
    let before = session_names(&app).await;
    assert!(
        !before.iter().any(|n| n.starts_with("mailroom ")),
        "{before:?}"
    );
    let mut relay = app.spawn_relay_process(&[], &[]);
    let mut worker = app.spawn_worker_process(&[], &[]);
    let named = format!("{}?application_name=shop-relay", app.db_url);
    let mut own = app.spawn_relay_process(&["--database-url", &named], &[]);
    let names = eventually("the processes' sessions open", || async {
        let names = session_names(&app).await;
        [
            "mailroom relay",
            "mailroom worker",
            "shop-relay",
            // The relays' replication sessions (their wake-up), named apart.
            "mailroom relay (WAL wake-up)",
            "shop-relay (WAL wake-up)",
        ]
        .iter()
        .all(|want| names.iter().any(|n| n == want))
        .then_some(names)
    })
    .await;
    assert!(
        names.iter().all(|n| n.starts_with("mailroom ")
            || n.starts_with("shop-relay")
            || before.contains(n)),
        "{names:?}"
    );
    for child in [&mut relay, &mut worker, &mut own] {
        child.kill().await.unwrap();
    }
}

/// What docs/DEPLOY.md promises a worker's pool holds at most, whatever its concurrency.
const WORKER_POOL_AT_MOST: usize = 34;

#[tokio::test]
async fn a_worker_with_more_deliveries_than_database_connections_stays_within_its_pool_and_sends_each_job_once()
 {
    // Every write on its own (no group) and every chunk 20 ms late: 64 deliveries, each
    // holding a connection for tens of milliseconds, want more connections than the pool has.
    let app = TestApp::spawn().await;
    let proxy = FaultProxy::in_front_of(&app.db_url).await;
    proxy.set(Fault::Delay(Duration::from_millis(20)));
    let url = proxy.url_through(&app.db_url);
    let worker = app.start_worker(&[
        "--database-url",
        &url,
        "--concurrency",
        "64",
        "--ledger-group",
        "1",
        "--smtp-connections",
        "32",
        "--lease",
        "30s",
    ]);
    let ids: Vec<String> = (0..300).map(|i| format!("pool-{i}")).collect();
    for id in &ids {
        app.publish(&app.job(id)).await;
    }
    let peak = Arc::new(AtomicUsize::new(0));
    let watching = tokio::spawn({
        let (peak, open) = (peak.clone(), proxy.opened_counter());
        async move {
            loop {
                peak.fetch_max(open.load(Ordering::SeqCst), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    worker
        .stats
        .wait_until(|s| s.sent == ids.len() as u64)
        .await;
    watching.abort();
    worker.stop().await;
    let peak = peak.load(Ordering::SeqCst);
    assert!(
        peak <= WORKER_POOL_AT_MOST,
        "the worker opened {peak} database connections, more than its pool of {WORKER_POOL_AT_MOST}"
    );
    assert!(
        peak >= WORKER_POOL_AT_MOST - 2,
        "the fault did not land: the deliveries never wanted the whole pool ({peak} connections)"
    );
    for id in &ids {
        assert_eq!(app.smtp.count(&app.message_id(id, "welcome")), 1, "{id}");
    }
}
