//! What a slow-down reply slows, for a job with recipients in two domains: a 4.7.x reply to one
//! RCPT TO slows that recipient's domain only; a 421 without 4.7.x (the server closes the
//! session) slows the whole server, and no domain in particular. Neither spends an attempt.

use super::*;

/// A job to every address of `to`.
fn job_to_all(app: &TestApp, job_id: &str, to: &[&str]) -> serde_json::Value {
    let mut job = app.job(job_id);
    job["to"] = serde_json::json!(to);
    job
}

const LIMITS: [&str; 4] = [
    "--domain-limits",
    "slow.test=50/s, fast.test=50/s",
    "--max-attempts",
    "2",
];

async fn assert_each_sent_once_on_its_one_attempt(app: &TestApp, jobs: &[String]) {
    let spent = app
        .count("SELECT count(*) FROM sent_notifications WHERE attempts <> 1 OR status <> 'sent'")
        .await;
    assert_eq!(spent, 0, "the slow-down replies spent no attempts");
    for job in jobs {
        assert_eq!(app.smtp.count(&app.message_id(job, "welcome")), 1, "{job}");
    }
}

#[tokio::test]
async fn a_4_7_reply_to_one_recipient_slows_that_domain_and_not_the_jobs_other_domain() {
    // Two RCPTs to slow.test are answered 450 4.7.1; fast.test's never are.
    let app = TestApp::spawn_with(&["--fail", "RCPT:450/4.7.1:2:slow.test"]).await;
    let worker = app.start_worker(&LIMITS);
    let n = 4;
    let jobs: Vec<String> = (0..n).map(|i| format!("both-{i}")).collect();
    for job in &jobs {
        let to = ["ada@slow.test", "bob@fast.test"];
        app.publish(&job_to_all(&app, job, &to)).await;
    }
    app.smtp.wait_for(n).await;
    worker.stats.wait_until(|s| s.sent == n as u64).await;
    let (sent, _, slow_downs, slowed) = domain(&worker, "slow.test");
    assert_eq!(sent, n as u64);
    assert!(slow_downs >= 1 && slowed, "the 4.7.1 slowed slow.test down");
    let (sent, _, slow_downs, slowed) = domain(&worker, "fast.test");
    assert_eq!(sent, n as u64);
    assert_eq!(
        (slow_downs, slowed),
        (0, false),
        "the reply was about slow.test's recipient, not fast.test's"
    );
    assert_eq!(
        throttle_of(&worker).server(),
        (0, false),
        "nor the server's"
    );
    let s = worker.stats.snapshot();
    assert!(s.held >= 2, "each 4.7.1 held its job back: {s:?}");
    assert_no_retry_but_give_backs(&worker);
    worker.stop().await;
    assert_each_sent_once_on_its_one_attempt(&app, &jobs).await;
}

#[tokio::test]
async fn a_421_closing_the_session_slows_the_server_for_every_domain_and_no_domain_in_particular() {
    // Two RCPTs to slow.test are answered "421 4.3.2 service shutting down", and the server
    // closes the connection.
    let app = TestApp::spawn_with(&["--fail", "RCPT:421:2:slow.test"]).await;
    let worker = app.start_worker(&LIMITS);
    let n = 3;
    let mut jobs: Vec<String> = (0..n).map(|i| format!("both-{i}")).collect();
    for job in &jobs {
        let to = ["ada@slow.test", "bob@fast.test"];
        app.publish(&job_to_all(&app, job, &to)).await;
    }
    app.smtp.wait_for(n).await;
    worker.stats.wait_until(|s| s.sent == n as u64).await;
    let (slow_downs, slowed) = throttle_of(&worker).server();
    assert!(slow_downs >= 1 && slowed, "the 421 slowed the server down");
    for label in ["slow.test", "fast.test", "other"] {
        let (_, _, slow_downs, slowed) = domain(&worker, label);
        assert_eq!((slow_downs, slowed), (0, false), "{label} was slowed");
    }
    // The whole server is slowed: a burst to a third domain, listed nowhere, is paced at half
    // of 10/s (worker::throttle::UNLIMITED_SLOWED_RATE) instead of going at once.
    let burst = 10;
    for i in 0..burst {
        let job = format!("calm-{i}");
        app.publish(&job_to_all(&app, &job, &["cy@calm.test"]))
            .await;
        jobs.push(job);
    }
    app.smtp.wait_for(n + burst).await;
    // Paced at 5/s, the ten transactions begin (MAIL FROM, after the worker's pacing gate) over
    // 1.8 s; at once, within a few tens of milliseconds. Their final dots, later by the SMTP
    // exchange and the claim's group commit, bunch up on a loaded machine, so the start is what
    // is measured.
    let mut starts: Vec<f64> = transactions(&app)
        .iter()
        .filter(|t| t.rcpt_tos.iter().any(|r| r.ends_with("@calm.test")))
        .map(|t| t.mail_at)
        .collect();
    starts.sort_by(f64::total_cmp);
    assert_eq!(starts.len(), burst);
    let span = starts[burst - 1] - starts[0];
    assert!(
        span >= 1.2,
        "the {burst} emails to calm.test began within {span:.2} s: not paced at 5/s"
    );
    let busiest = busiest_second(&starts);
    assert!(
        busiest <= 7,
        "{busiest} emails to calm.test began in one second"
    );
    worker
        .stats
        .wait_until(|s| s.sent == (n + burst) as u64)
        .await;
    assert_no_retry_but_give_backs(&worker);
    worker.stop().await;
    assert_each_sent_once_on_its_one_attempt(&app, &jobs).await;
}
