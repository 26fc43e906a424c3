//! Integration tests against real services on loopback: RabbitMQ, PostgreSQL, and an SMTP
//! server (aiosmtpd) that records what it accepts. Each test gets its own database,
//! uuid-suffixed exchanges and queues, and its own SMTP server. Exactly-once is always asserted
//! by counting what the SMTP server received.
//!
//! Start the services with `scripts/services` (or run everything with `scripts/test`).
//! `TEST_LOG=1` shows the logs of the workers under test.

mod helpers;

mod acks;
mod binlog;
mod cluster;
mod console;
mod crash;
mod data_syntax;
mod database_refused;
mod dead_queue;
mod delivery;
mod disruptive;
mod dkim;
mod dlq;
mod doors;
mod exposition;
mod failures;
mod first_contact;
mod fleet;
mod hostile;
mod http;
mod http_conventions;
mod http_dlq;
mod image;
mod jobs;
mod ledger;
mod ledger_retention;
mod lifecycle;
mod live_templates;
mod logs;
mod metrics;
mod once;
mod outbox;
mod overview;
mod poison;
mod pool;
mod producers;
mod proxy_faults;
mod readiness;
mod schedule;
mod security;
mod smtp_faults;
mod soak;
mod suppression;
mod templates;
mod throttle;
mod topology;
mod wal;
