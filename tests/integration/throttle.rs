//! Sending limits: the account's rate holds over two workers, a domain's limit slows only that
//! domain, and a domain answering 421 4.7.28 is slowed down without spending any job's attempts;
//! [`concurrency`]: a domain's `max N` at a slow server, and a small SMTP pool; [`replies`]:
//! what a slow-down reply slows when a job has recipients in two domains.
//! Rates are measured where they matter, at the SMTP server (the recorder's receive times).

use crate::helpers::*;
use mailroom::worker::throttle::Throttle;

mod concurrency;
mod replies;

/// A job to `address`.
fn job_to(app: &TestApp, job_id: &str, address: &str) -> serde_json::Value {
    let mut job = app.job(job_id);
    job["to"] = serde_json::json!([address]);
    job
}

/// One accepted transaction: its recipients and its span (MAIL FROM to the final reply).
#[derive(serde::Deserialize)]
pub(super) struct Transaction {
    rcpt_tos: Vec<String>,
    mail_at: f64,
    received_at: f64,
}

/// The accepted transactions, from the recorder's log (its `mail_at` field is not part of the
/// test kit's `Received`).
pub(super) fn transactions(app: &TestApp) -> Vec<Transaction> {
    let log = std::fs::read_to_string(app.dir.path().join("received.jsonl")).unwrap();
    log.lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// The most receive times (seconds) that fall within any one second.
fn busiest_second(times: &[f64]) -> usize {
    let mut times = times.to_vec();
    times.sort_by(f64::total_cmp);
    (0..times.len())
        .map(|i| {
            times[i..]
                .iter()
                .take_while(|t| **t < times[i] + 1.0)
                .count()
        })
        .max()
        .unwrap_or(0)
}

fn throttle_of(worker: &RunningWorker) -> &std::sync::Arc<Throttle> {
    worker
        .stats
        .throttle()
        .expect("a built worker has its throttle")
}

/// The counters of one domain label: (sent, held, slow-downs, slowed now).
fn domain(worker: &RunningWorker, label: &str) -> (u64, u64, u64, bool) {
    throttle_of(worker)
        .counts()
        .into_iter()
        .find(|(l, _, _)| l == label)
        .map(|(_, c, slowed)| (c.sent, c.held, c.slow_downs, slowed))
        .unwrap_or_else(|| panic!("no label {label}"))
}

#[tokio::test]
async fn a_global_rate_holds_across_two_workers_and_is_used_nearly_in_full() {
    let app = TestApp::spawn().await;
    let args = ["--smtp-rate", "10/s"];
    let a = app.start_worker(&args);
    let b = app.start_worker(&args);
    // Each worker sends at its share once a beat has counted both (one beat at most).
    eventually("both workers to count two live workers", || async {
        (throttle_of(&a).workers() == 2 && throttle_of(&b).workers() == 2).then_some(())
    })
    .await;
    let n = 50;
    for i in 0..n {
        app.publish(&app.job(&format!("paced-{i}"))).await;
    }
    let received = app.smtp.wait_for(n).await;
    let times: Vec<f64> = received.iter().map(|r| r.received_at).collect();
    let busiest = busiest_second(&times);
    // The limit, plus one send of each worker's bucket that may fall at a window's edge, plus
    // the jitter between a send's slot and its final dot (the claim's group commit, the SMTP
    // exchange) that bunches a few sends on a loaded machine. Each worker sending at the whole
    // rate instead of its share would put 20 in a second.
    assert!(busiest <= 16, "{busiest} emails within one second at 10/s");
    let first = times.iter().copied().fold(f64::INFINITY, f64::min);
    let last = times.iter().copied().fold(0.0, f64::max);
    let rate = (n - 1) as f64 / (last - first);
    eprintln!(
        "{n} emails in {:.2} s: {rate:.1}/s, busiest second {busiest}",
        last - first
    );
    // Both shares in use: one worker alone at its share of 5/s would give 5/s. A machine at load
    // 15 was measured at 6.3/s; an idle one at 9.5–10.9/s.
    assert!(rate >= 6.0, "only {rate:.1}/s of the 10/s allowed");
    assert!(rate <= 11.0, "{rate:.1}/s over the 10/s allowed");
    for w in [&a, &b] {
        assert_no_retry_but_give_backs(w);
    }
    a.stop().await;
    b.stop().await;
    let reclaimed = app
        .count("SELECT count(*) FROM sent_notifications WHERE attempts <> 1 OR status <> 'sent'")
        .await;
    assert_eq!(reclaimed, 0, "every job sent on its one attempt");
    for i in 0..n {
        let mid = app.message_id(&format!("paced-{i}"), "welcome");
        assert_eq!(app.smtp.count(&mid), 1);
    }
}

#[tokio::test]
async fn a_domain_limit_slows_that_domain_while_another_flows_at_full_speed() {
    let app = TestApp::spawn().await;
    let worker = app.start_worker(&["--domain-limits", "slow.test=2/s"]);
    let (slow, fast) = (8, 40);
    for i in 0..slow {
        app.publish(&job_to(&app, &format!("slow-{i}"), "ada@slow.test"))
            .await;
    }
    for i in 0..fast {
        app.publish(&job_to(&app, &format!("fast-{i}"), "bob@fast.test"))
            .await;
    }
    let received = app.smtp.wait_for(slow + fast).await;
    worker
        .stats
        .wait_until(|s| s.sent == (slow + fast) as u64)
        .await;
    let at = |domain: &str| -> Vec<f64> {
        received
            .iter()
            .filter(|r| r.rcpt_tos.iter().any(|t| t.ends_with(domain)))
            .map(|r| r.received_at)
            .collect()
    };
    let (slow_times, fast_times) = (at("@slow.test"), at("@fast.test"));
    assert_eq!((slow_times.len(), fast_times.len()), (slow, fast));
    assert!(
        busiest_second(&slow_times) <= 3,
        "slow.test over 2/s: {slow_times:?}"
    );
    let last_fast = fast_times.iter().copied().fold(0.0, f64::max);
    let last_slow = slow_times.iter().copied().fold(0.0, f64::max);
    assert!(
        last_fast < last_slow,
        "fast.test waited for slow.test: its last email at {last_fast}, slow.test's at {last_slow}"
    );
    let (_, held_fast, _, _) = domain(&worker, "other");
    let (sent_slow, held_slow, _, _) = domain(&worker, "slow.test");
    assert_eq!(held_fast, 0, "fast.test was never held back");
    assert!(held_slow > 0, "slow.test was held back");
    assert_eq!(sent_slow, slow as u64);
    worker.stop().await;
    let reclaimed = app
        .count("SELECT count(*) FROM sent_notifications WHERE attempts <> 1 OR status <> 'sent'")
        .await;
    assert_eq!(reclaimed, 0, "holding back spends no attempt");
}

#[tokio::test]
async fn a_421_from_one_domain_slows_it_spends_no_attempts_and_every_job_is_sent_once() {
    // Three RCPTs to slow.test are answered Gmail's "421 4.7.28" (a 421 without 4.7.x is about
    // the server: see throttle/replies.rs); fast.test is never refused.
    let app = TestApp::spawn_with(&["--fail", "RCPT:421/4.7.28:3:slow.test"]).await;
    let worker = app.start_worker(&["--domain-limits", "slow.test=20/s", "--max-attempts", "2"]);
    let n = 6;
    for i in 0..n {
        app.publish(&job_to(&app, &format!("slow-{i}"), "ada@slow.test"))
            .await;
        app.publish(&job_to(&app, &format!("fast-{i}"), "bob@fast.test"))
            .await;
    }
    app.smtp.wait_for(2 * n).await;
    worker.stats.wait_until(|s| s.sent == 2 * n as u64).await;
    let (sent, _, slow_downs, slowed) = domain(&worker, "slow.test");
    assert_eq!(sent, n as u64);
    assert!(slow_downs >= 1, "the 421 slowed slow.test down");
    assert!(
        slowed,
        "slow.test is still below its rate (it recovers over minutes)"
    );
    let (_, _, other_slow_downs, other_slowed) = domain(&worker, "other");
    assert_eq!(
        (other_slow_downs, other_slowed),
        (0, false),
        "fast.test kept flowing"
    );
    let s = worker.stats.snapshot();
    assert_eq!(s.dead_lettered, 0, "no attempt spent: {s:?}");
    assert_no_retry_but_give_backs(&worker);
    assert!(s.held >= 3, "each 421 held its job back: {s:?}");
    worker.stop().await;
    // With --max-attempts 2, three refusals would have dead-lettered a job had they counted.
    let spent = app
        .count("SELECT count(*) FROM sent_notifications WHERE attempts <> 1 OR status <> 'sent'")
        .await;
    assert_eq!(spent, 0, "the 421s spent no attempts");
    for i in 0..n {
        for job in [format!("slow-{i}"), format!("fast-{i}")] {
            assert_eq!(app.smtp.count(&app.message_id(&job, "welcome")), 1, "{job}");
        }
    }
}

/// Holding back is no retry. The only retries allowed are claims the fence gave back unused (a
/// claim too slow on a loaded machine to leave time for a whole send), which spend no attempt
/// either: each test's ledger check shows every job sent on its one attempt.
fn assert_no_retry_but_give_backs(worker: &RunningWorker) {
    let retried = worker.stats.snapshot().retried;
    let given_back = worker
        .stats
        .given_back
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        retried, given_back,
        "holding back is no retry: {retried} retried, {given_back} of them given back"
    );
}
