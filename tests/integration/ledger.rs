//! The claim ledger's group commit, against the real database of the engine under test: a group
//! must answer every claim and record exactly as the one-by-one statements do, and concurrent
//! deliveries of one job must still get one claim between them.

use std::time::Duration;

use mailroom::db::group::{ClaimItem, Group, Ledger, RecordItem};
use mailroom::db::{Claim, ClaimRequest, Record};
use mailroom::db::{Database, LedgerStatus};
use uuid::Uuid;

use crate::helpers::TestApp;

const KIND: &str = "welcome";
const LEASE: Duration = Duration::from_secs(60);

/// The states a row can be in when a claim arrives; `None` is no row at all.
const STATES: [&str; 7] = [
    "fresh",
    "failed",
    "sending-live",
    "sending-expired",
    "sent",
    "dead",
    "uncertain",
];

fn request<'a>(job_id: &'a str, lease: Duration, resend: bool) -> ClaimRequest<'a> {
    ClaimRequest {
        job_id,
        kind: KIND,
        message_id: "<ledger@mailroom.test>",
        token: uuid::Uuid::new_v4(),
        lease,
        resend_uncertain: resend,
        replay: false,
        recipient: None,
        screen: &[],
    }
}

/// Puts `job_id` in `state` through the one-by-one statements.
async fn prepare(db: &Database, job_id: &str, state: &str) {
    if state == "fresh" {
        return;
    }
    let lease = if state == "sending-expired" {
        Duration::ZERO
    } else {
        LEASE
    };
    let Claim::Claimed { token, .. } = db.claim(&request(job_id, lease, true)).await.unwrap()
    else {
        panic!("a fresh claim of {job_id} was refused");
    };
    let (status, class) = match state {
        "sending-live" | "sending-expired" => return,
        "failed" => (LedgerStatus::Failed, None),
        "sent" => (LedgerStatus::Sent, None),
        "dead" => (LedgerStatus::Dead, Some("rejected")),
        "uncertain" => (LedgerStatus::Uncertain, Some("uncertain")),
        other => panic!("unknown state {other}"),
    };
    let record = Record {
        job_id,
        kind: KIND,
        token: Some(token),
        status,
        smtp_reply: None,
        error: Some("prepared"),
        class,
    };
    assert!(db.record(&record).await.unwrap());
}

/// A claim's answer without its random token, and the lease rounded to "some"/"none".
fn shape(claim: &Claim) -> String {
    match claim {
        Claim::Claimed { attempt, .. } => format!("claimed attempt {attempt}"),
        Claim::Refused(None) => "refused, no row".into(),
        Claim::Refused(Some(e)) => format!(
            "refused by {} after {} attempts, lease {}, class {:?}",
            e.status,
            e.attempts,
            if e.lease_remaining.is_some() {
                "live"
            } else {
                "none"
            },
            e.error_class
        ),
    }
}

async fn row_shape(db: &Database, job_id: &str) -> String {
    match db.notification(job_id, KIND).await.unwrap() {
        None => "no row".into(),
        Some(n) => format!(
            "{} attempts={} reply={:?} error={:?} revision={:?} sent_at={}",
            n.status,
            n.attempts,
            n.smtp_reply,
            n.last_error,
            n.template_revision,
            n.sent_at.is_some()
        ),
    }
}

#[tokio::test]
async fn a_group_answers_each_claim_and_record_as_the_single_statements_do() {
    let app = TestApp::spawn().await;
    let db = &app.db;
    for resend in [true, false] {
        let tag = if resend { "resend" } else { "dead-letter" };
        for state in STATES {
            prepare(db, &format!("single-{tag}-{state}"), state).await;
            prepare(db, &format!("group-{tag}-{state}"), state).await;
        }
        // `sending-expired` needs its zero lease to be in the past by the database's clock.
        tokio::time::sleep(Duration::from_millis(20)).await;

        // Two held claims whose results are recorded: one by its holder, one with a stale token.
        let mut held = Vec::new();
        for who in ["single", "group"] {
            for which in ["holder", "stale"] {
                let job_id = format!("{who}-{tag}-record-{which}");
                let Claim::Claimed { token, .. } =
                    db.claim(&request(&job_id, LEASE, resend)).await.unwrap()
                else {
                    panic!("fresh claim refused");
                };
                let token = if which == "holder" {
                    token
                } else {
                    Uuid::new_v4()
                };
                held.push((job_id, token));
            }
        }

        let mut single_claims = Vec::new();
        for state in STATES {
            let job_id = format!("single-{tag}-{state}");
            single_claims.push(db.claim(&request(&job_id, LEASE, resend)).await.unwrap());
        }
        let mut single_records = Vec::new();
        for (job_id, token) in held.iter().filter(|(j, _)| j.starts_with("single")) {
            let record = Record {
                job_id,
                kind: KIND,
                token: Some(*token),
                status: LedgerStatus::Sent,
                smtp_reply: Some("250 2.0.0 queued"),
                error: None,
                class: None,
            };
            single_records.push(
                db.record_with_revision(&record, Some("rev1"))
                    .await
                    .unwrap(),
            );
        }

        let group = Group {
            lease: LEASE,
            resend_uncertain: resend,
            claims: STATES
                .iter()
                .map(|state| ClaimItem {
                    job_id: format!("group-{tag}-{state}"),
                    kind: KIND.into(),
                    message_id: "<ledger@mailroom.test>".into(),
                    token: Uuid::new_v4(),
                    recipient: None,
                    screen: vec![],
                })
                .collect(),
            records: held
                .iter()
                .filter(|(j, _)| j.starts_with("group"))
                .map(|(job_id, token)| RecordItem {
                    job_id: job_id.clone(),
                    kind: KIND.into(),
                    token: *token,
                    status: LedgerStatus::Sent,
                    smtp_reply: Some("250 2.0.0 queued".into()),
                    error: None,
                    class: None,
                    revision: Some("rev1".into()),
                })
                .collect(),
        };
        let result = db.write_group(&group).await.unwrap();

        assert_eq!(result.claims.len(), STATES.len());
        for ((state, single), grouped) in STATES.iter().zip(&single_claims).zip(&result.claims) {
            assert_eq!(
                shape(grouped),
                shape(single),
                "claim of a {state} row with on-uncertain={tag}"
            );
            if let Claim::Claimed { token, .. } = grouped {
                let item = group.claims.iter().find(|c| c.job_id.ends_with(state));
                assert_eq!(
                    Some(*token),
                    item.map(|c| c.token),
                    "the group's token holds"
                );
            }
        }
        assert_eq!(
            result.records, single_records,
            "records with on-uncertain={tag}"
        );
        assert_eq!(result.records, vec![true, false], "holder and stale token");

        let mut keys: Vec<String> = STATES.iter().map(|s| s.to_string()).collect();
        keys.extend(["record-holder".into(), "record-stale".into()]);
        for key in keys {
            assert_eq!(
                row_shape(db, &format!("group-{tag}-{key}")).await,
                row_shape(db, &format!("single-{tag}-{key}")).await,
                "row after a {key} claim or record with on-uncertain={tag}"
            );
        }
    }
}

#[tokio::test]
async fn concurrent_claims_of_one_job_through_a_grouped_ledger_give_one_claim() {
    let app = TestApp::spawn().await;
    let ledger = Ledger::direct(app.db.clone(), Default::default()).grouped(16);
    // 100 jobs, each delivered twice at the same moment (a redelivery racing the original).
    let jobs: Vec<String> = (0..100).map(|i| format!("twice-{i}")).collect();
    let claims = jobs.iter().chain(&jobs).map(|job_id| {
        let ledger = ledger.clone();
        let job_id = job_id.clone();
        tokio::spawn(async move { ledger.claim(&request(&job_id, LEASE, true)).await })
    });
    let answers: Vec<Claim> = futures_util::future::join_all(claims)
        .await
        .into_iter()
        .map(|joined| joined.unwrap().unwrap())
        .collect();
    let claimed = answers
        .iter()
        .filter(|c| matches!(c, Claim::Claimed { attempt: 1, .. }))
        .count();
    let busy = answers
        .iter()
        .filter(|c| matches!(c, Claim::Refused(Some(e)) if e.status == LedgerStatus::Sending && e.lease_remaining.is_some()))
        .count();
    assert_eq!(
        (claimed, busy),
        (100, 100),
        "one claim per job: {answers:?}"
    );
    assert_eq!(app.count_status("sending").await, 100);

    // Every holder records, grouped too; each record lands.
    let records = answers
        .iter()
        .zip(jobs.iter().chain(&jobs))
        .filter_map(|(c, job_id)| {
            let Claim::Claimed { token, .. } = c else {
                return None;
            };
            let (ledger, job_id, token) = (ledger.clone(), job_id.clone(), *token);
            Some(tokio::spawn(async move {
                ledger.record(&sent(&job_id, token), Some("rev")).await
            }))
        });
    for recorded in futures_util::future::join_all(records).await {
        assert!(recorded.unwrap().unwrap(), "the holder's record lands");
    }
    assert_eq!(app.count_status("sent").await, 100);

    let stats = ledger.stats();
    let groups = stats.groups.load(std::sync::atomic::Ordering::Relaxed);
    let writes = stats.writes.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        writes, 300,
        "200 claims and 100 records went through groups"
    );
    assert!(
        groups < writes,
        "concurrent writes share commits: {writes} writes in {groups} groups"
    );
}

/// PostgreSQL caches a generic plan of the group statement per connection. Made while the
/// ledger is young (a new installation's first minutes), a plan that hashes the group's keys
/// and scans the table would stay as the table grows, and every record would read it all.
/// After groups on a young table, the table grows (no ANALYZE: autovacuum is off for it) and
/// more groups run on the same connections: they must read their own rows through the index.
#[tokio::test]
async fn groups_planned_on_a_young_ledger_still_probe_the_index_when_it_has_grown() {
    if !crate::helpers::runs_on(
        mailroom::db::Engine::Postgres,
        "PostgreSQL caches generic plans; MySQL plans each execution",
    ) {
        return;
    }
    let app = TestApp::spawn().await;
    app.execute("ALTER TABLE sent_notifications SET (autovacuum_enabled = false)")
        .await;
    let url: mailroom::config::SecretUrl = app.db_url.parse().unwrap();
    // Two connections: each runs far more than the five executions after which PostgreSQL
    // may switch to a cached generic plan.
    let db = Database::connect_lazy(&url, 2).unwrap();
    let ledger = Ledger::direct(db, Default::default()).grouped(64);
    deliveries(&ledger, "young", 32, 10).await;

    app.execute(
        "INSERT INTO sent_notifications (job_id, kind, status, message_id)
         SELECT 'history-' || g, 'welcome', 'sent', '<h' || g || '@mailroom.test>'
         FROM generate_series(1, 20000) g",
    )
    .await;
    let Database::Postgres(pg) = &app.db else {
        unreachable!("runs on PostgreSQL only")
    };
    let counters = || async {
        let (read, updated): (i64, i64) = sqlx::query_as(
            "SELECT seq_tup_read, n_tup_upd FROM pg_stat_user_tables
             WHERE relname = 'sent_notifications'",
        )
        .fetch_one(pg)
        .await
        .unwrap();
        (read, updated)
    };
    // The young phase's counters, once its connections reported them.
    let before = crate::helpers::eventually("the young groups' statistics", || async {
        let (read, updated) = counters().await;
        (updated >= 320).then_some(read)
    })
    .await;
    deliveries(&ledger, "grown", 32, 5).await;
    let read = crate::helpers::eventually("the grown groups' statistics", || async {
        let (read, updated) = counters().await;
        (updated >= 320 + 160).then_some(read)
    })
    .await;
    let groups = ledger
        .stats()
        .groups
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        read - before < 20_000,
        "{} rows read by sequential scans in the grown phase ({groups} groups in all): \
         a group scanned the 20,000-row table instead of probing the index",
        read - before
    );
}

/// `tasks` concurrent deliveries, each claiming and recording `each` new jobs in turn.
async fn deliveries(ledger: &Ledger, prefix: &str, tasks: usize, each: usize) {
    let runs = (0..tasks).map(|t| {
        let ledger = ledger.clone();
        let prefix = prefix.to_string();
        tokio::spawn(async move {
            for i in 0..each {
                let job_id = format!("{prefix}-{t}-{i}");
                let Claim::Claimed { token, .. } =
                    ledger.claim(&request(&job_id, LEASE, true)).await.unwrap()
                else {
                    panic!("a new job's claim was refused");
                };
                let record = Record {
                    job_id: &job_id,
                    kind: KIND,
                    token: Some(token),
                    status: LedgerStatus::Sent,
                    smtp_reply: Some("250 ok"),
                    error: None,
                    class: None,
                };
                assert!(ledger.record(&record, None).await.unwrap());
            }
        })
    });
    for run in futures_util::future::join_all(runs).await {
        run.unwrap();
    }
}

/// One delivery through `ledger`: claim `job_id`, "send" for `send` (the worker's SMTP
/// exchange, which the ledger does not see), record `sent`.
async fn deliver(ledger: &Ledger, job_id: &str, send: Duration) {
    let Claim::Claimed { token, .. } = ledger.claim(&request(job_id, LEASE, true)).await.unwrap()
    else {
        panic!("{job_id} was not claimed");
    };
    tokio::time::sleep(send).await;
    assert!(
        ledger
            .record(&sent(job_id, token), Some("rev"))
            .await
            .unwrap()
    );
}

/// The record of a send of `job_id` the SMTP server accepted, by the holder of `token`.
fn sent(job_id: &str, token: Uuid) -> Record<'_> {
    Record {
        job_id,
        kind: KIND,
        token: Some(token),
        status: LedgerStatus::Sent,
        smtp_reply: Some("250 ok"),
        error: None,
        class: None,
    }
}

fn counts(ledger: &Ledger) -> (u64, u64, u64, u64) {
    let stats = ledger.stats();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    (
        load(&stats.writes),
        load(&stats.groups),
        load(&stats.waits),
        load(&stats.waits_alone),
    )
}

/// Deliveries that arrive together (a relay's batch) are claimed in one group; their sends end
/// apart, up to 3.5 ms, and their records wait for each other: one commit for the claims and
/// one for the records of each batch, where each record written as soon as the writer was
/// free took three or four.
#[tokio::test]
async fn records_of_deliveries_claimed_together_wait_for_each_other() {
    let app = TestApp::spawn().await;
    let ledger = Ledger::direct(app.db.clone(), Default::default()).grouped(16);
    const BATCHES: u64 = 10;
    const SIZE: u64 = 7;
    let mut every = tokio::time::interval(Duration::from_millis(20));
    for b in 0..BATCHES {
        every.tick().await;
        let mut batch = tokio::task::JoinSet::new();
        for i in 0..SIZE {
            let ledger = ledger.clone();
            let send = Duration::from_micros(500 * (i + 1));
            batch.spawn(async move { deliver(&ledger, &format!("batch-{b}-{i}"), send).await });
        }
        while let Some(done) = batch.join_next().await {
            done.unwrap();
        }
    }
    assert_eq!(app.count_status("sent").await, (BATCHES * SIZE) as i64);
    let (writes, groups, waits, alone) = counts(&ledger);
    assert_eq!(writes, 2 * BATCHES * SIZE);
    assert!(
        groups * 2 <= BATCHES * 5,
        "{groups} commits for {BATCHES} batches of {SIZE}: at most 2.5 a batch"
    );
    assert!(
        waits - alone >= BATCHES / 2,
        "record groups that waited for their cohort: {} of {waits}",
        waits - alone
    );
}

#[tokio::test]
async fn records_of_one_job_at_a_time_never_wait_for_company() {
    let app = TestApp::spawn().await;
    let ledger = Ledger::direct(app.db.clone(), Default::default()).grouped(16);
    // The next job starts only once the last is recorded, as fast as the database answers:
    // its claim comes because the record was answered, so a record waiting for it would only
    // wait out the linger, every time.
    for i in 0..40 {
        deliver(&ledger, &format!("alone-{i}"), Duration::from_millis(1)).await;
    }
    let (writes, groups, waits, _) = counts(&ledger);
    assert_eq!(
        (writes, groups, waits),
        (80, 80, 0),
        "each write alone, none waited"
    );
    assert_eq!(app.count_status("sent").await, 40);
}

#[tokio::test]
async fn records_of_deliveries_arriving_on_their_own_share_a_commit_with_the_next_claim() {
    let app = TestApp::spawn().await;
    let ledger = Ledger::direct(app.db.clone(), Default::default()).grouped(16);
    // A delivery every 5 ms (200/s), each sending for 1 ms: apart from the odd overlap, each
    // claim and each record would be a commit of its own.
    const N: u64 = 100;
    let mut every = tokio::time::interval(Duration::from_millis(5));
    let mut deliveries = tokio::task::JoinSet::new();
    for i in 0..N {
        every.tick().await;
        let ledger = ledger.clone();
        deliveries.spawn(async move {
            deliver(&ledger, &format!("paced-{i}"), Duration::from_millis(1)).await
        });
    }
    while let Some(done) = deliveries.join_next().await {
        done.unwrap();
    }
    assert_eq!(app.count_status("sent").await, N as i64);
    let (writes, groups, waits, alone) = counts(&ledger);
    assert_eq!(writes, 2 * N);
    // Records waited for the claim due next and went with it: about one commit per delivery
    // instead of two.
    let joined = waits - alone;
    assert!(
        joined >= N / 3,
        "records that shared a commit with a claim they waited for: {joined} of {waits} waits"
    );
    assert!(
        groups * 4 <= writes * 3,
        "{writes} writes in {groups} commits"
    );
}
