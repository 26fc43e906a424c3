//! mailroom gets email out of a web application's database transaction and into the
//! recipient's inbox once.
//!
//! The modules follow one message:
//! - [`job`]: the job a producer writes, and its validation;
//! - [`door`]: the one validation every door applies, on the bytes the worker will read;
//! - [`broker`]: RabbitMQ topology, connections and confirmed publishing;
//! - [`relay`]: outbox → broker with confirms, woken by LISTEN/NOTIFY;
//! - [`worker`]: consume → claim → render → send → record → ack;
//! - [`db`]: the claim ledger `sent_notifications` and the outbox `mailroom_outbox`;
//! - [`render`]: Handlebars templates → subject, text and HTML;
//! - [`smtp`]: MIME building, the deterministic Message-ID, sending and error classes;
//! - [`dlq`]: the dead-letter queue: list, show, replay, purge;
//! - [`http`], [`status`]: the HTTP API and `/metrics`, a job's state;
//! - [`jobs`], [`overview`]: every job findable with its timeline; the pipeline at a glance;
//! - [`console`]: the operators' web console under `/console` (templates editor and preview);
//! - [`startup`]: each process (worker, relay, HTTP API, all three) built from its settings;
//! - [`config`], [`cli`], [`telemetry`], [`shutdown`], [`exit`]: the process around them;
//! - [`failpoint`]: crash points for the fault tests.

pub mod broker;
pub mod cli;
pub mod config;
pub mod console;
pub mod db;
pub mod dlq;
pub mod door;
pub mod exit;
pub mod failpoint;
pub mod http;
pub mod job;
pub mod jobs;
pub mod overview;
pub mod relay;
pub mod render;
pub mod shutdown;
pub mod smtp;
pub mod startup;
pub mod status;
pub mod telemetry;
pub mod worker;

#[cfg(test)]
mod layers;
