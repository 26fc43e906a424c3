//! Replays that run at once publish each row once: each replay claims a row before it
//! publishes it, a row another replay holds is left to it, and a claim left by a replay that
//! crashed expires, so the row is replayable again.

use mailroom::config::UrlList;
use mailroom::dlq::{CLAIM_TTL, Filter, Replayer, Report, Selection, States, seal};

use super::{letter, publish_dead, table};
use crate::helpers::*;

/// Enough rows that the replays overlap: each publish waits for its confirm.
const ROWS: usize = 200;

async fn replayer(app: &TestApp, name: &str) -> Replayer {
    let urls: UrlList = app.amqp_url.parse().unwrap();
    let key = seal::resolve(None, &app.db).await.unwrap();
    Replayer::connect(&urls, &app.topology, name, key)
        .await
        .unwrap()
}

/// Replays every dead row through `replayer` as `ops`, then closes it.
async fn replay_all(app: &TestApp, mut replayer: Replayer) -> Report {
    let report = table(app)
        .replay(&Selection::All, &mut replayer, "ops")
        .await
        .unwrap();
    replayer.close().await;
    report
}

/// `moved N` of the CLI's report line.
fn moved(stdout: &str) -> usize {
    let at = stdout.find("moved ").expect("a report line") + "moved ".len();
    stdout[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn three_replays_of_one_group_at_once_publish_each_row_once() {
    let app = TestApp::spawn().await;
    let letters: Vec<_> = (0..ROWS)
        .map(|i| {
            letter(
                &app.job(&format!("c-{i}")),
                "rejected",
                "550 5.1.1 no such user",
            )
        })
        .collect();
    publish_dead(&app, &letters).await;
    let dlq = table(&app);
    let groups = dlq.groups(&Filter::default()).await.unwrap();
    assert_eq!(groups.len(), 1);
    let group = groups[0].group.clone();
    let selection = Selection::Group(group.clone());
    let (mut a, mut b) = (
        replayer(&app, "test replay a").await,
        replayer(&app, "test replay b").await,
    );

    let cli = ["dlq", "replay", "--group", &group];
    let (by_a, by_b, by_cli) = tokio::join!(
        dlq.replay(&selection, &mut a, "operator a"),
        dlq.replay(&selection, &mut b, "operator b"),
        app.cli_output(&cli),
    );
    let (by_a, by_b) = (by_a.unwrap(), by_b.unwrap());
    assert!(by_cli.status.success(), "{}", by_cli.stderr);
    let moved_by_cli = moved(&by_cli.stdout);
    assert_eq!(
        by_a.moved + by_b.moved + moved_by_cli,
        ROWS,
        "a: {by_a:?}, b: {by_b:?}, cli: {}",
        by_cli.stdout
    );
    assert!(by_a.interrupted.is_none() && by_b.interrupted.is_none());
    assert_eq!(
        app.ready_messages().await,
        ROWS as u32,
        "each row published once"
    );
    a.close().await;
    b.close().await;

    let worker = app.start_worker(&[]);
    worker.stats.wait_until(|s| s.sent == ROWS as u64).await;
    assert_eq!(worker.stats.snapshot().duplicates, 0);
    worker.stop().await;
    for i in 0..ROWS {
        let id = format!("c-{i}");
        assert_eq!(app.smtp.count(&app.message_id(&id, "welcome")), 1, "{id}");
    }
    assert_eq!(app.dead_count().await, 0);
}

#[tokio::test]
async fn a_row_a_live_replay_holds_is_left_to_it_and_a_stale_claim_is_taken_over() {
    let app = TestApp::spawn().await;
    publish_dead(
        &app,
        &[
            letter(&app.job("held"), "rejected", "550"),
            letter(&app.job("crashed"), "rejected", "550"),
        ],
    )
    .await;
    let dlq = table(&app);
    let page = dlq.list(&Filter::default(), None, 10).await.unwrap();
    let id_of = |job: &str| page.letters.iter().find(|e| e.job_id == job).unwrap().id;
    let (held, crashed) = (id_of("held"), id_of("crashed"));
    // A replay running elsewhere holds one row; one that crashed left an expired claim.
    let claim = |id: i64, token: &'static str, ttl| {
        let db = app.db.clone();
        async move { db.claim_dead_letters(&[id], token, ttl).await.unwrap() }
    };
    assert_eq!(claim(held, "live", CLAIM_TTL).await, [held]);
    assert_eq!(
        claim(crashed, "crashed", std::time::Duration::ZERO).await,
        [crashed]
    );
    assert_eq!(
        claim(held, "third", CLAIM_TTL).await,
        [] as [i64; 0],
        "a live claim is not taken"
    );

    let purged = dlq
        .purge(&Selection::Rows(vec![held]), "ops", false)
        .await
        .unwrap();
    assert_eq!(purged.purged, 0, "a purge leaves a row a replay holds");
    let report = replay_all(&app, replayer(&app, "test replay").await).await;
    assert_eq!(
        (report.moved, report.claimed_elsewhere),
        (1, 1),
        "{report:?}"
    );
    assert_eq!(app.ready_messages().await, 1);

    let all = Filter {
        state: States::All,
        ..Filter::default()
    };
    let rows = dlq.list(&all, None, 10).await.unwrap().letters;
    let state = |id: i64| {
        let e = rows.iter().find(|e| e.id == id).unwrap();
        (e.state.clone(), e.replayed_by.clone())
    };
    assert_eq!(state(held), ("dead".into(), None));
    assert_eq!(state(crashed), ("replayed".into(), Some("ops".into())));
}

/// A replay goes a page at a time (200 rows): over several pages, every row it claims is
/// published once and marked, while a row another replay holds and an oversize row on the same
/// pages stay dead, each counted for what it is.
#[tokio::test]
async fn a_replay_over_several_pages_publishes_each_claimed_row_once_and_leaves_the_rest_dead() {
    const N: usize = 450;
    let app = TestApp::spawn().await;
    let mut letters: Vec<_> = (0..N)
        .map(|i| letter(&app.job(&format!("p-{i}")), "rejected", "550"))
        .collect();
    letters[300].body = vec![b'x'; mailroom::dlq::MAX_STORED_BODY + 1];
    publish_dead(&app, &letters).await;
    let held: i64 = app
        .count("SELECT id FROM mailroom_dead_letters WHERE job_id = 'p-100'")
        .await;
    assert_eq!(
        app.db
            .claim_dead_letters(&[held], "live", CLAIM_TTL)
            .await
            .unwrap(),
        [held]
    );

    let report = replay_all(&app, replayer(&app, "test replay").await).await;

    assert_eq!(report.examined, N, "{report:?}");
    assert_eq!(report.moved, N - 2, "{report:?}");
    assert_eq!(report.claimed_elsewhere, 1, "{report:?}");
    assert_eq!(report.skipped.get("oversize"), Some(&1), "{report:?}");
    assert!(report.interrupted.is_none(), "{report:?}");
    assert_eq!(
        app.ready_messages().await,
        (N - 2) as u32,
        "each published once"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM mailroom_dead_letters WHERE state = 'replayed' AND replayed_by = 'ops' AND replay_result = 'published' AND claim_token IS NULL").await,
        (N - 2) as i64
    );
    assert_eq!(
        app.count("SELECT count(*) FROM mailroom_dead_letters WHERE state = 'dead' AND replay_result LIKE 'oversize%' AND claim_token IS NULL").await,
        1,
        "the oversize row says why and its claim is released"
    );
    assert_eq!(
        app.count(&format!("SELECT count(*) FROM mailroom_dead_letters WHERE id = {held} AND state = 'dead' AND replay_result IS NULL")).await,
        1,
        "the held row is left to its replay"
    );
}

/// Publishes that fail mid-replay (the work queue is gone, so every copy comes back
/// unroutable) leave every row of every page dead with the reason and its claim released, so
/// the next replay, once the queue is back, takes them all.
#[tokio::test]
async fn rows_whose_publish_fails_stay_dead_with_the_reason_and_the_next_replay_takes_them() {
    const N: usize = 250;
    let app = TestApp::spawn().await;
    let letters: Vec<_> = (0..N)
        .map(|i| letter(&app.job(&format!("u-{i}")), "rejected", "550"))
        .collect();
    publish_dead(&app, &letters).await;

    let first = replayer(&app, "test replay").await;
    app.delete_work_queue().await;
    let report = replay_all(&app, first).await;
    assert_eq!((report.examined, report.moved), (N, 0), "{report:?}");
    assert_eq!(report.skipped.get("publish failed"), Some(&N), "{report:?}");
    assert!(report.interrupted.is_none(), "{report:?}");
    assert_eq!(
        app.count("SELECT count(*) FROM mailroom_dead_letters WHERE state = 'dead' AND replay_result LIKE 'publish failed: no queue is bound%' AND replayed_by = 'ops' AND claim_token IS NULL").await,
        N as i64,
        "each row says why, and its claim is released"
    );

    // Connecting declares the topology again: the queue is back.
    let report = replay_all(&app, replayer(&app, "test replay again").await).await;
    assert_eq!(report.moved, N, "{report:?}");
    assert_eq!(app.ready_messages().await, N as u32);
    assert_eq!(app.dead_count().await, 0);
}
