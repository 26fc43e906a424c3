//! A database of one's own for each test or measurement, created through an admin URL on the
//! server (PostgreSQL or MySQL/MariaDB, by the URL's scheme) and dropped again afterwards.

use anyhow::Context;
use sqlx::{Connection as _, Executor as _, MySqlConnection, PgConnection};

/// The server behind an admin URL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    Postgres,
    MySql,
}

fn server(admin_url: &str) -> anyhow::Result<Server> {
    match admin_url.split_once("://").map(|(scheme, _)| scheme) {
        Some("postgres" | "postgresql") => Ok(Server::Postgres),
        Some("mysql" | "mariadb") => Ok(Server::MySql),
        _ => anyhow::bail!("not a PostgreSQL or MySQL URL: {admin_url}"),
    }
}

/// Creates the empty database `name` on the server of `admin_url`; returns the database's URL.
pub async fn create_database(admin_url: &str, name: &str) -> anyhow::Result<String> {
    match server(admin_url)? {
        Server::Postgres => {
            let mut admin = PgConnection::connect(admin_url)
                .await
                .context("connecting to PostgreSQL (is it running? scripts/services)")?;
            let create = format!(r#"CREATE DATABASE "{name}""#);
            admin
                .execute(sqlx::AssertSqlSafe(create))
                .await
                .with_context(|| format!("creating database {name}"))?;
            let _ = admin.close().await;
        }
        Server::MySql => {
            let mut admin = MySqlConnection::connect(admin_url)
                .await
                .context("connecting to MariaDB/MySQL (is it running? scripts/services)")?;
            let create = format!("CREATE DATABASE `{name}`");
            admin
                .execute(sqlx::AssertSqlSafe(create))
                .await
                .with_context(|| format!("creating MySQL database {name}"))?;
            let _ = admin.close().await;
        }
    }
    let mut url = url::Url::parse(admin_url)?;
    url.set_path(name);
    Ok(url.to_string())
}

/// Drops the database `name` if it exists, closing its connections on PostgreSQL; best effort,
/// for cleanup: a server that is down keeps it.
pub async fn drop_database(admin_url: &str, name: &str) {
    match server(admin_url) {
        Ok(Server::Postgres) => {
            if let Ok(mut admin) = PgConnection::connect(admin_url).await {
                let drop = format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#);
                let _ = admin.execute(sqlx::AssertSqlSafe(drop)).await;
            }
        }
        Ok(Server::MySql) => {
            if let Ok(mut admin) = MySqlConnection::connect(admin_url).await {
                let drop = format!("DROP DATABASE IF EXISTS `{name}`");
                let _ = admin.execute(sqlx::AssertSqlSafe(drop)).await;
            }
        }
        Err(_) => {}
    }
}
