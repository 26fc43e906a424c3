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
    create_database_from(admin_url, name, None).await
}

/// [`create_database`], as a copy of the database `template` when one is given (PostgreSQL's
/// `CREATE DATABASE … TEMPLATE`; nobody may be connected to the template meanwhile).
pub async fn create_database_from(
    admin_url: &str,
    name: &str,
    template: Option<&str>,
) -> anyhow::Result<String> {
    match server(admin_url)? {
        Server::Postgres => {
            let mut admin = PgConnection::connect(admin_url)
                .await
                .context("connecting to PostgreSQL (is it running? scripts/services)")?;
            let create = match template {
                Some(template) => format!(r#"CREATE DATABASE "{name}" TEMPLATE "{template}""#),
                None => format!(r#"CREATE DATABASE "{name}""#),
            };
            admin
                .execute(sqlx::AssertSqlSafe(create))
                .await
                .with_context(|| format!("creating database {name}"))?;
            let _ = admin.close().await;
        }
        Server::MySql => {
            anyhow::ensure!(template.is_none(), "MySQL has no template databases");
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

/// Whether a database `name` exists on the PostgreSQL server of `admin` (a connection to it).
pub async fn pg_database_exists(admin: &mut PgConnection, name: &str) -> anyhow::Result<bool> {
    let found: Option<i32> = sqlx::query_scalar("SELECT 1 FROM pg_database WHERE datname = $1")
        .bind(name)
        .fetch_optional(admin)
        .await?;
    Ok(found.is_some())
}

/// The PostgreSQL databases named `<prefix><pid>_…` whose process `<pid>` has ended (no
/// `/proc/<pid>`), and those named `<prefix>…` without a pid: what runs that ended left
/// behind. Names under `<prefix>tpl_` (shared templates) are never listed.
pub async fn pg_orphans(admin_url: &str, prefix: &str) -> anyhow::Result<Vec<String>> {
    let mut admin = PgConnection::connect(admin_url).await?;
    let names: Vec<String> =
        sqlx::query_scalar("SELECT datname FROM pg_database WHERE starts_with(datname, $1)")
            .bind(prefix)
            .fetch_all(&mut admin)
            .await?;
    let _ = admin.close().await;
    Ok(names
        .into_iter()
        .filter(|name| orphaned(&name[prefix.len()..]))
        .collect())
}

/// Whether the part of a test database's name after its prefix names no running process.
fn orphaned(rest: &str) -> bool {
    if rest.starts_with("tpl_") {
        return false;
    }
    match rest.split_once('_').map(|(pid, _)| pid.parse::<u32>()) {
        Some(Ok(pid)) => !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        _ => true,
    }
}

/// Drops the database `name` if it exists, closing its connections first (a connection left
/// in a transaction would make a MySQL `DROP DATABASE` wait on its metadata lock for ever);
/// best effort, for cleanup: a server that is down keeps it.
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
                // Connections of the same user may be killed without any privilege.
                let ids: Vec<u64> = sqlx::query_scalar(
                    "SELECT CAST(id AS UNSIGNED) FROM information_schema.processlist WHERE db = ?",
                )
                .bind(name)
                .fetch_all(&mut admin)
                .await
                .unwrap_or_default();
                for id in ids {
                    let kill = format!("KILL {id}");
                    let _ = admin.execute(sqlx::AssertSqlSafe(kill)).await;
                }
                // Never wait for ever on a lock held by a connection of another user.
                let _ = admin.execute("SET SESSION lock_wait_timeout = 30").await;
                let drop = format!("DROP DATABASE IF EXISTS `{name}`");
                let _ = admin.execute(sqlx::AssertSqlSafe(drop)).await;
            }
        }
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::orphaned;

    #[test]
    fn a_database_of_a_running_process_or_a_template_is_not_an_orphan() {
        assert!(!orphaned(&format!("{}_0123abcd", std::process::id())));
        assert!(!orphaned("tpl_0123456789abcdef"));
        // No process has pid 4294967295, and names without a pid came from older runs.
        assert!(orphaned("4294967295_0123abcd"));
        assert!(orphaned("0123456789abcdef"));
    }
}
