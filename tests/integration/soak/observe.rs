//! What the soak reads back after the nemesis: the SMTP recorder's log, the dead letters (taken
//! from the queue and from the table the workers ingest it into, as they come, so the drain can
//! see them), the ledger, the outbox, the queues, and the
//! uncertain-window events in every worker incarnation's JSON log.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use lapin::options::{BasicGetOptions, QueueDeclareOptions};
use mailroom::db::Database;
use mailroom::db::dead_letters::LetterQuery;
use tokio::time::Instant;

use super::checker::{Committed, DeadLetterSeen, History, Key, Window, WindowEvent};
use crate::helpers::{DeadLetter, TestApp};

/// How long a drain waits once nothing is queued, unpublished or being sent and the pending
/// count stopped changing (jobs still held unacknowledged by a worker would be `sending`).
const QUIET: Duration = Duration::from_secs(30);

pub struct Observer<'a> {
    app: &'a TestApp,
    dead_letters: Vec<DeadLetterSeen>,
}

impl<'a> Observer<'a> {
    pub fn new(app: &'a TestApp) -> Observer<'a> {
        Observer {
            app,
            dead_letters: Vec::new(),
        }
    }

    /// Waits until every committed job is received or dead-lettered and nothing is left in
    /// flight, or `patience` ran out (the checker then reports what is missing).
    pub async fn drain(&mut self, committed: &[Committed], patience: Duration) {
        let deadline = Instant::now() + patience;
        let started = Instant::now();
        let mut next_note = started + Duration::from_secs(15);
        let mut last = ((usize::MAX, 0, 0), Instant::now());
        loop {
            self.take_dead_letters().await;
            let received: HashSet<String> = self
                .app
                .smtp
                .received()
                .into_iter()
                .filter_map(|r| r.message_id)
                .collect();
            let dead: HashSet<&Key> = self.dead_letters.iter().map(|d| &d.key).collect();
            let pending = committed
                .iter()
                .filter(|c| !received.contains(&c.message_id) && !dead.contains(&c.key))
                .count();
            let busy = self.app.count_status("sending").await + self.app.unpublished().await;
            let queued = self.messages_left().await;
            if pending == 0 && busy == 0 && queued == 0 {
                println!("soak: drained in {:.1?}", started.elapsed());
                return;
            }
            if Instant::now() >= next_note {
                next_note += Duration::from_secs(15);
                println!(
                    "soak: draining {:.0?}: {pending} jobs pending, {busy} rows busy, {queued} queued",
                    started.elapsed()
                );
            }
            // Jobs pending with nothing ready, unpublished or being sent cannot move any more.
            let state = (pending, busy, queued);
            if state != last.0 {
                last = (state, Instant::now());
            } else if busy == 0 && queued == 0 && last.1.elapsed() >= QUIET {
                println!(
                    "soak: drain stopped: {pending} jobs pending and nothing moved for {QUIET:?}"
                );
                return;
            }
            if Instant::now() >= deadline {
                println!(
                    "soak: drain gave up after {patience:?}: {pending} pending, {busy} rows busy, {queued} queued"
                );
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Everything the checker needs except the nemesis' kills.
    pub async fn history(mut self, committed: Vec<Committed>, logs: &Path) -> History {
        self.take_dead_letters().await;
        History {
            committed,
            ledger: self.ledger().await,
            received: (self.app.smtp.received().into_iter())
                .map(|r| r.message_id.unwrap_or_default())
                .collect(),
            windows: windows(logs),
            unpublished: self.app.unpublished().await as u64,
            messages_left: self.messages_left().await,
            dead_letters: self.dead_letters,
            ..History::default()
        }
    }

    async fn channel(&self) -> (lapin::Connection, lapin::Channel) {
        let conn = lapin::Connection::connect(&self.app.amqp_url, Default::default())
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        (conn, ch)
    }

    /// Takes every dead letter now in the dead-letter queue, and every one the workers have
    /// ingested into `mailroom_dead_letters` (deleting those rows, so each is taken once).
    async fn take_dead_letters(&mut self) {
        self.take_queued_dead_letters().await;
        let dead = LetterQuery {
            state: Some("dead".into()),
            payload: true,
            ..LetterQuery::default()
        };
        let rows = self.app.db.dead_letters(&dead).await.unwrap();
        if rows.is_empty() {
            return;
        }
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        self.app
            .db
            .purge_dead_letters(&ids, "soak", true)
            .await
            .unwrap();
        for r in rows {
            let letter = DeadLetter {
                properties: mailroom::dlq::decode_properties(&r.properties).unwrap(),
                body: r.body,
            };
            self.see(letter, &r.routing_key);
        }
    }

    /// Takes every message now in the dead-letter queue itself.
    async fn take_queued_dead_letters(&mut self) {
        let (_conn, ch) = self.channel().await;
        let queue = self.app.topology.dead.as_str();
        while let Some(m) = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            let letter = DeadLetter {
                body: m.delivery.data.clone(),
                properties: m.delivery.properties.clone(),
            };
            self.see(letter, m.delivery.routing_key.as_str());
        }
    }

    fn see(&mut self, letter: DeadLetter, routing_key: &str) {
        let job_id = letter
            .properties
            .message_id()
            .as_ref()
            .map(|s| s.to_string());
        self.dead_letters.push(DeadLetterSeen {
            key: Key::new(job_id.as_deref().unwrap_or("?"), routing_key),
            class: letter.header("x-mailroom-error-class"),
            reason: letter.header("x-mailroom-error"),
        });
    }

    /// Messages in the work queue and the retry tiers (ready ones, plus unacked ones once no
    /// consumer holds them).
    async fn messages_left(&self) -> u64 {
        let (_conn, ch) = self.channel().await;
        let t = &self.app.topology;
        let mut queues = vec![t.queue.clone()];
        queues.extend(t.retry_delays.iter().map(|d| t.retry_queue(*d)));
        let mut total = 0;
        for q in queues {
            let opts = QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            let q = ch
                .queue_declare(q.as_str().into(), opts, Default::default())
                .await
                .unwrap();
            total += u64::from(q.message_count());
        }
        total
    }

    async fn ledger(&self) -> Vec<(Key, String)> {
        let sql = "SELECT job_id, kind, status FROM sent_notifications";
        // MySQL's job_id is VARBINARY (keys compare byte for byte): read it back as text.
        let my_sql = "SELECT CAST(job_id AS CHAR CHARACTER SET utf8mb4), kind, status \
                      FROM sent_notifications";
        let rows: Vec<(String, String, String)> = match &self.app.db {
            Database::Postgres(pool) => sqlx::query_as(sql).fetch_all(pool).await,
            Database::MySql(pool) => sqlx::query_as(my_sql).fetch_all(pool).await,
        }
        .unwrap();
        rows.into_iter()
            .map(|(job_id, kind, status)| (Key::new(&job_id, &kind), status))
            .collect()
    }
}

/// The window events of every `worker-*.log` (JSON lines), in each file's order.
pub(crate) fn windows(logs: &Path) -> Vec<WindowEvent> {
    let mut events = Vec::new();
    for entry in std::fs::read_dir(logs).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Some(process) = name
            .strip_suffix(".log")
            .filter(|n| n.starts_with("worker-"))
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        // A SIGKILL may cut the last line short: skip what does not parse.
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let Some(window) = window_of(&v) else {
                continue;
            };
            // The delivery span's fields sit beside the event's (docs/LOGGING.md).
            let (Some(job_id), Some(kind)) = (v["job_id"].as_str(), v["kind"].as_str()) else {
                panic!("{name}: window event without the delivery span: {line}");
            };
            events.push(WindowEvent {
                process: process.to_string(),
                key: Key::new(job_id, kind),
                attempt: v["attempt"].as_i64().unwrap_or(0),
                window,
            });
        }
    }
    events
}

/// The window event a log line marks: its `window` field, or one of the two outcomes the
/// worker logs without one (a `sent` record refused because the claim was taken over, and a
/// `sent` that could not be recorded, which goes to a retry tier).
fn window_of(v: &serde_json::Value) -> Option<Window> {
    if let Some(field) = v["window"].as_str() {
        return Window::parse(field);
    }
    let message = v["message"].as_str()?;
    let reason = v["reason"].as_str().unwrap_or_default();
    if message.contains("claim had been taken over") {
        Some(Window::TakenOver)
    } else if message == "retry scheduled" && reason.starts_with("sent but could not record") {
        Some(Window::Unrecorded)
    } else {
        None
    }
}
