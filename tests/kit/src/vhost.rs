//! A RabbitMQ virtual host of one's own (made with `rabbitmqctl`), for tests that break every
//! connection in it without touching the tests running beside them.

use crate::services::amqp_url;

/// A RabbitMQ virtual host of its own, for tests that break every connection in it without
/// touching the tests running beside them.
pub struct Vhost {
    pub name: String,
    pub url: String,
}

impl Vhost {
    pub async fn create() -> Vhost {
        let name = format!(
            "mailroom-test-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        make(&name).await;
        let mut url = url::Url::parse(&amqp_url()).unwrap();
        url.set_path(&format!("/{name}"));
        Vhost {
            name,
            url: url.to_string(),
        }
    }

    pub async fn close_all_connections(&self) {
        rabbitmqctl(&[
            "close_all_connections",
            "-p",
            &self.name,
            "mailroom test: broker drops connections",
        ])
        .await;
    }

    /// Wipes the virtual host as a broker reset would (`rabbitmqctl reset`, a node rebuilt
    /// from an empty disk): every connection closed, every exchange and queue gone; then makes
    /// it again, empty, with the same name and permissions.
    pub async fn reset(&self) {
        rabbitmqctl(&["delete_vhost", &self.name]).await;
        make(&self.name).await;
    }

    /// Deletes the virtual host once no connection is left in it (at most 10 s): a process the
    /// test just killed may still have queue declarations in flight, and RabbitMQ 3.10's
    /// dead-letter workers of quorum queues crash on queues deleted while they start; a few at
    /// once take their supervisor down, and every later quorum queue on the node fails.
    pub async fn delete(&self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline && self.connections().await > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        rabbitmqctl(&["delete_vhost", &self.name]).await;
    }

    /// Connections open in this virtual host.
    async fn connections(&self) -> usize {
        let out = tokio::process::Command::new("rabbitmqctl")
            .args(["-q", "list_connections", "vhost", "--no-table-headers"])
            .kill_on_drop(true)
            .output();
        match tokio::time::timeout(RABBITMQCTL_PATIENCE, out).await {
            Ok(Ok(out)) if out.status.success() => String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|line| line.trim() == self.name)
                .count(),
            _ => 0,
        }
    }
}

/// Adds virtual host `name`, open to the test user.
async fn make(name: &str) {
    rabbitmqctl(&["add_vhost", name]).await;
    rabbitmqctl(&["set_permissions", "-p", name, "guest", ".*", ".*", ".*"]).await;
}

/// How long one `rabbitmqctl` call may take (a node restart's `await_startup` included) before
/// the test fails instead of waiting on a wedged node.
const RABBITMQCTL_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs `rabbitmqctl -q ARGS` against the local node and panics with its stderr on failure, or
/// when it has not returned within [`RABBITMQCTL_PATIENCE`].
pub async fn rabbitmqctl(args: &[&str]) {
    let run = tokio::process::Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(RABBITMQCTL_PATIENCE, run)
        .await
        .unwrap_or_else(|_| {
            panic!("rabbitmqctl {args:?} did not return in {RABBITMQCTL_PATIENCE:?}")
        })
        .unwrap();
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
