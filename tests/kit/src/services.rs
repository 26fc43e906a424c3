//! The services `scripts/services` runs on loopback, by the `MAILROOM_TEST_*` variables that
//! `scripts/test` sets, defaulting to the same loopback-only development credentials.

/// The PostgreSQL server, through a database the tests may connect to in order to create and
/// drop their own (`MAILROOM_TEST_DATABASE_URL`).
pub fn postgres_url() -> String {
    std::env::var("MAILROOM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://mailroom:mailroom@127.0.0.1:5432/mailroom".into())
}

/// The same on MySQL/MariaDB (`MAILROOM_TEST_MYSQL_URL`).
pub fn mysql_url() -> String {
    std::env::var("MAILROOM_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://mailroom:mailroom@127.0.0.1:3306/mailroom".into())
}

/// RabbitMQ's default virtual host (`MAILROOM_TEST_AMQP_URL`).
pub fn amqp_url() -> String {
    std::env::var("MAILROOM_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}
