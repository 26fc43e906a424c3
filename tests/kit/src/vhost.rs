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
        rabbitmqctl(&["add_vhost", &name]).await;
        rabbitmqctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"]).await;
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

    pub async fn delete(&self) {
        rabbitmqctl(&["delete_vhost", &self.name]).await;
    }
}

/// Runs `rabbitmqctl -q ARGS` against the local node and panics with its stderr on failure.
pub async fn rabbitmqctl(args: &[&str]) {
    let out = tokio::process::Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
