//! A domain's concurrency (`max N`) measured where it matters, at a slow SMTP server: the
//! recorder logs each transaction's MAIL FROM and final reply, and the tests count the
//! deliveries in progress at once. Two workers share the limit; a domain without one flows at
//! the workers' full concurrency, and a pool of SMTP sessions smaller than the demand starves no
//! domain: held jobs hold no session and no claim, and spend no attempt.

use super::*;

/// The most transactions to `domain` (every domain when empty) in progress at one instant.
fn peak(transactions: &[Transaction], domain: &str) -> usize {
    let mut edges: Vec<(f64, i32)> = transactions
        .iter()
        .filter(|t| t.rcpt_tos.iter().any(|r| r.ends_with(domain)))
        .flat_map(|t| [(t.mail_at, 1), (t.received_at, -1)])
        .collect();
    // At one instant an end comes before a start: back-to-back sends do not overlap.
    edges.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut now = 0;
    let mut most = 0;
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap()
}

/// Every job of `prefix`-0.. `prefix`-(n-1) reached the SMTP server once.
fn each_sent_once(app: &TestApp, prefix: &str, n: usize) {
    for i in 0..n {
        let job = format!("{prefix}-{i}");
        assert_eq!(app.smtp.count(&app.message_id(&job, "welcome")), 1, "{job}");
    }
}

async fn assert_every_job_sent_on_its_one_attempt(app: &TestApp) {
    let spent = app
        .count("SELECT count(*) FROM sent_notifications WHERE attempts <> 1 OR status <> 'sent'")
        .await;
    assert_eq!(spent, 0, "a job spent an attempt, or is not sent");
}

#[tokio::test]
async fn a_domains_concurrency_holds_across_two_workers_while_another_domain_uses_them_in_full() {
    // Each transaction lasts 800 ms at the server, so sends in flight really overlap (the jobs
    // arrive over about as long: each publish waits for its confirm).
    let app = TestApp::spawn_with(&["--data-delay", "0.8"]).await;
    // max 4 over two workers: a share of 2 each. Each worker's 8 deliveries at once could put
    // 16 sends to one domain in progress without the limit.
    // A 4 s send timeout (and the lease that covers it): 800 ms transactions on a loaded machine
    // must not time out, which would spend an attempt for a reason other than the limit.
    let args = [
        "--domain-limits",
        "capped.test=max 4",
        "--concurrency",
        "8",
        "--smtp-timeout",
        "4s",
        "--lease",
        "8s",
    ];
    let a = app.start_worker(&args);
    let b = app.start_worker(&args);
    eventually("both workers to count two live workers", || async {
        (throttle_of(&a).workers() == 2 && throttle_of(&b).workers() == 2).then_some(())
    })
    .await;
    let n = 24;
    for i in 0..n {
        app.publish(&job_to(&app, &format!("capped-{i}"), "ada@capped.test"))
            .await;
        app.publish(&job_to(&app, &format!("free-{i}"), "bob@free.test"))
            .await;
    }
    app.smtp.wait_for(2 * n).await;
    eventually("the workers to record every send", || async {
        (a.stats.snapshot().sent + b.stats.snapshot().sent == 2 * n as u64).then_some(())
    })
    .await;
    for w in [&a, &b] {
        assert_no_retry_but_give_backs(w);
    }
    let log = transactions(&app);
    let (capped, free) = (peak(&log, "@capped.test"), peak(&log, "@free.test"));
    eprintln!("peak sends in progress: capped.test {capped}, free.test {free}");
    assert!(capped <= 4, "{capped} sends to capped.test at once, max 4");
    assert!(
        capped >= 2,
        "capped.test never used its limit: {capped} at once"
    );
    // The same workers, the same server: only the limit keeps capped.test below this.
    assert!(
        free > 4,
        "free.test never went above capped.test's limit ({free} at once): the test shows nothing"
    );
    let held = domain(&a, "capped.test").1 + domain(&b, "capped.test").1;
    assert!(held > 0, "capped.test was never held back");
    assert_eq!(domain(&a, "other").1 + domain(&b, "other").1, 0);
    a.stop().await;
    b.stop().await;
    assert_every_job_sent_on_its_one_attempt(&app).await;
    each_sent_once(&app, "capped", n);
    each_sent_once(&app, "free", n);
}

#[tokio::test]
async fn held_jobs_keep_no_smtp_session_from_other_domains_when_the_pool_is_smaller_than_demand() {
    let app = TestApp::spawn_with(&["--data-delay", "0.2"]).await;
    // Two SMTP sessions for eight deliveries at once; slow.test may use one of them, one send
    // every 2 s: its 5 jobs take 8 s at least, while fast.test's 12 need 6 rounds of the pool.
    let worker = app.start_worker(&[
        "--domain-limits",
        "slow.test=30/min max 1",
        "--smtp-connections",
        "2",
        "--concurrency",
        "8",
        "--max-attempts",
        "2",
    ]);
    let (slow, fast) = (5, 12);
    for i in 0..fast {
        if i < slow {
            app.publish(&job_to(&app, &format!("slow-{i}"), "ada@slow.test"))
                .await;
        }
        app.publish(&job_to(&app, &format!("fast-{i}"), "bob@fast.test"))
            .await;
    }
    app.smtp.wait_for(slow + fast).await;
    worker
        .stats
        .wait_until(|s| s.sent == (slow + fast) as u64)
        .await;
    let log = transactions(&app);
    let (all, slow_peak, fast_peak) = (
        peak(&log, ""),
        peak(&log, "@slow.test"),
        peak(&log, "@fast.test"),
    );
    eprintln!("peak sends in progress: {all} in all, slow.test {slow_peak}, fast.test {fast_peak}");
    assert!(all <= 2, "{all} SMTP sessions at once, the pool is 2");
    assert!(
        slow_peak <= 1,
        "{slow_peak} sends to slow.test at once, max 1"
    );
    // Held slow.test jobs never kept a session idle: fast.test had both sessions at once, and
    // was done before slow.test's rate let it finish.
    assert_eq!(fast_peak, 2, "fast.test never had the whole pool");
    let last = |domain: &str| {
        log.iter()
            .filter(|t| t.rcpt_tos.iter().any(|r| r.ends_with(domain)))
            .map(|t| t.received_at)
            .fold(0.0, f64::max)
    };
    assert!(
        last("@fast.test") < last("@slow.test"),
        "fast.test waited for slow.test"
    );
    let (sent, held, _, _) = domain(&worker, "slow.test");
    assert_eq!(sent, slow as u64);
    assert!(held > 0, "slow.test was held back");
    let s = worker.stats.snapshot();
    assert_eq!((s.dead_lettered, s.duplicates), (0, 0), "{s:?}");
    assert_no_retry_but_give_backs(&worker);
    worker.stop().await;
    assert_every_job_sent_on_its_one_attempt(&app).await;
    each_sent_once(&app, "slow", slow);
    each_sent_once(&app, "fast", fast);
}

#[tokio::test]
async fn a_claim_the_fence_gives_back_frees_its_domains_slot_and_is_sent_once_on_its_retry() {
    let app = TestApp::spawn().await;
    // The first claim of late-0 lingers 3 s of its 5 s lease: too little is left for a 2 s send,
    // so the fence gives it back. Had the give-back kept late.test's only slot, every later job
    // to late.test would be held back for good, in a loop.
    let worker = app.spawn_worker_process(
        &[
            "--domain-limits",
            "late.test=max 1",
            "--max-attempts",
            "1",
            "--lease",
            "5s",
        ],
        &[(
            "MAILROOM_FAILPOINTS",
            "worker.after_claim@late-0=delay-once:3s",
        )],
    );
    let n = 4;
    for i in 0..n {
        app.publish(&job_to(&app, &format!("late-{i}"), "ada@late.test"))
            .await;
    }
    app.smtp.wait_for(n).await;
    eventually("every job recorded sent", || async {
        (app.count_status("sent").await == n as i64).then_some(())
    })
    .await;
    terminate(&worker).await;
    // --max-attempts 1: had the give-back spent the attempt, late-0 would be dead.
    assert_every_job_sent_on_its_one_attempt(&app).await;
    each_sent_once(&app, "late", n);
    if std::env::var_os("TEST_LOG").is_none() {
        // The worker's log (its stderr): the fence fired once, so the test did test it.
        let log = std::fs::read_to_string(app.dir.path().join("worker.log")).unwrap();
        let given_back = log
            .lines()
            .filter(|l| l.contains("late-0") && l.contains("less than a whole send"))
            .count();
        assert!(
            given_back >= 1,
            "the fence gave late-0's claim back:\n{log}"
        );
    }
}
