//! The test's side of RabbitMQ: the broker's URL, dead letters read back, and virtual hosts of
//! their own for tests that break every connection in one.

use lapin::{BasicProperties, types::AMQPValue};

pub fn amqp_url() -> String {
    std::env::var("MAILROOM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A message read back from the dead-letter queue.
#[derive(Debug)]
pub struct DeadLetter {
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

impl DeadLetter {
    pub fn header(&self, name: &str) -> Option<String> {
        match self.properties.headers().as_ref()?.inner().get(name)? {
            AMQPValue::LongString(s) => Some(s.to_string()),
            AMQPValue::ShortString(s) => Some(s.to_string()),
            AMQPValue::LongLongInt(i) => Some(i.to_string()),
            other => Some(format!("{other:?}")),
        }
    }
}

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

async fn rabbitmqctl(args: &[&str]) {
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
