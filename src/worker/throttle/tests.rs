use super::*;
use crate::config::limits::{parse_domain_limits, parse_rate};

fn throttle(global: Option<&str>, domains: &str) -> Arc<Throttle> {
    Arc::new(Throttle::new(
        global.map(|g| parse_rate(g).unwrap()),
        parse_domain_limits(domains).unwrap(),
    ))
}

fn to(domain: &str) -> Vec<String> {
    vec![domain.to_owned()]
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Admits as often as allowed from `t0` on, asking every `step`, for `span`; returns the sends.
fn sends(t: &Arc<Throttle>, domain: &str, t0: Instant, step: Duration, span: Duration) -> usize {
    let mut n = 0;
    let mut now = t0;
    while now < t0 + span {
        if let Admission::Go { .. } = t.admit(&to(domain), now) {
            n += 1;
        }
        now += step;
    }
    n
}

#[test]
fn without_limits_every_send_goes_at_once() {
    let t = throttle(None, "");
    assert!(!t.is_active() && !t.adapts());
    let now = Instant::now();
    for _ in 0..100 {
        match t.admit(&to("gmail.com"), now) {
            Admission::Go { wait, .. } => assert_eq!(wait, Duration::ZERO),
            hold => panic!("{hold:?}"),
        }
    }
}

#[test]
fn a_send_due_soon_waits_in_place_and_a_later_one_is_held() {
    let t = throttle(Some("10/s"), "");
    let now = Instant::now();
    let waits: Vec<_> = (0..4)
        .map(|_| match t.admit(&to("a.test"), now) {
            Admission::Go { wait, .. } => Some(wait),
            Admission::Hold { .. } => None,
        })
        .collect();
    assert_eq!(waits, [Some(ms(0)), Some(ms(100)), Some(ms(200)), None]);
    assert_eq!(t.counts()[0].1.held, 1, "held counted under other");
}

#[test]
fn the_global_rate_is_shared_by_the_live_workers() {
    let t = throttle(Some("10/s"), "");
    t.set_workers(2);
    let t0 = Instant::now();
    let n = sends(&t, "a.test", t0, ms(10), Duration::from_secs(10));
    assert!(
        (49..=51).contains(&n),
        "{n} sends in 10 s at 10/s shared by 2"
    );
    t.set_workers(1);
    let n = sends(
        &t,
        "a.test",
        t0 + Duration::from_secs(10),
        ms(10),
        Duration::from_secs(10),
    );
    assert!((99..=102).contains(&n), "{n} sends in 10 s at 10/s alone");
}

#[test]
fn a_domain_limit_slows_that_domain_only() {
    let t = throttle(None, "slow.test=2/s");
    let t0 = Instant::now();
    let slow = sends(&t, "slow.test", t0, ms(10), Duration::from_secs(5));
    let fast = sends(&t, "fast.test", t0, ms(10), Duration::from_secs(5));
    assert!((10..=11).contains(&slow), "{slow}");
    assert_eq!(fast, 500);
}

#[test]
fn a_domain_concurrency_holds_sends_while_its_passes_are_out() {
    let t = throttle(None, "busy.test=max 2");
    let now = Instant::now();
    let first = t.admit(&to("busy.test"), now);
    let second = t.admit(&to("busy.test"), now);
    assert!(matches!(first, Admission::Go { .. }) && matches!(second, Admission::Go { .. }));
    assert!(matches!(
        t.admit(&to("busy.test"), now),
        Admission::Hold { .. }
    ));
    assert!(matches!(
        t.admit(&to("other.test"), now),
        Admission::Go { .. }
    ));
    drop(first);
    assert!(matches!(
        t.admit(&to("busy.test"), now),
        Admission::Go { .. }
    ));
}

#[test]
fn a_slow_down_halves_the_domains_rate_and_it_recovers() {
    let t = throttle(None, "gmail.com=10/s");
    let t0 = Instant::now();
    t.slow_down(&to("gmail.com"), t0);
    let slowed = sends(&t, "gmail.com", t0, ms(10), Duration::from_secs(4));
    assert!(
        (19..=23).contains(&slowed),
        "{slowed} in 4 s at half of 10/s"
    );
    assert!(
        t.counts()
            .iter()
            .any(|(l, c, s)| l == "gmail.com" && *s && c.slow_downs == 1)
    );
    // Other domains are not slowed.
    assert_eq!(
        sends(&t, "yahoo.com", t0, ms(10), Duration::from_secs(1)),
        100
    );
    // 150 s on, the whole rate is back.
    let later = t0 + Duration::from_secs(150);
    let n = sends(&t, "gmail.com", later, ms(10), Duration::from_secs(4));
    assert!((39..=42).contains(&n), "{n} in 4 s at 10/s");
}

#[test]
fn an_unlimited_domain_that_asks_to_slow_down_gets_a_rate_for_a_while() {
    let t = throttle(None, "gmail.com=5/s");
    let t0 = Instant::now();
    t.slow_down(&to("example.org"), t0);
    let n = sends(&t, "example.org", t0, ms(10), Duration::from_secs(2));
    assert!(
        (9..=11).contains(&n),
        "{n} in 2 s at half of {UNLIMITED_SLOWED_RATE}/s"
    );
    let later = t0 + Duration::from_secs(151);
    assert_eq!(
        sends(&t, "example.org", later, ms(10), Duration::from_secs(1)),
        100
    );
}

#[test]
fn only_listed_domains_have_a_label_of_their_own() {
    let t = throttle(None, "gmail.com=5/s");
    t.count_sent(&to("gmail.com"));
    t.count_sent(&to("a.test"));
    t.count_sent(&to("b.test"));
    let labels: Vec<_> = t
        .counts()
        .into_iter()
        .map(|(l, c, _)| (l, c.sent))
        .collect();
    assert_eq!(labels, [("gmail.com".into(), 1), ("other".into(), 2)]);
}

#[test]
fn idle_domains_are_forgotten_past_a_bound() {
    let t = throttle(None, "*=1000/s");
    let t0 = Instant::now();
    for i in 0..FORGET_ABOVE + 10 {
        drop(t.admit(&to(&format!("d{i}.test")), t0));
    }
    drop(t.admit(&to("last.test"), t0 + Duration::from_secs(1)));
    assert!(t.lock().domains.len() < 10);
}

#[test]
fn a_server_slow_down_paces_every_domain_even_without_a_global_rate() {
    let t = throttle(None, "listed.test=max 8");
    let t0 = Instant::now();
    let before = sends(&t, "any.test", t0, ms(10), Duration::from_secs(1));
    assert_eq!(before, 100, "unpaced before");
    let t1 = t0 + Duration::from_secs(2);
    t.slow_down_server(t1);
    assert_eq!(t.server(), (1, true));
    // UNLIMITED_SLOWED_RATE halved, shared by every domain.
    let after = sends(&t, "any.test", t1, ms(10), Duration::from_secs(1))
        + sends(&t, "listed.test", t1, ms(10), Duration::from_secs(1));
    let allowed = (UNLIMITED_SLOWED_RATE / 2.0) as usize;
    assert!(
        after <= allowed + 1,
        "{after} sends in a second after the 421"
    );
    assert_eq!(
        t.counts().iter().map(|c| c.1.slow_downs).sum::<u64>(),
        0,
        "no domain slowed"
    );
}

#[test]
fn a_server_slow_down_halves_the_global_rate_and_recovers() {
    let t = throttle(Some("20/s"), "*=max 8");
    let t0 = Instant::now();
    t.slow_down_server(t0);
    let n = sends(&t, "a.test", t0, ms(5), Duration::from_secs(2));
    assert!((19..=22).contains(&n), "{n} sends in 2 s at 10/s");
    let later = t0 + Duration::from_secs(200);
    let n = sends(&t, "a.test", later, ms(5), Duration::from_secs(2));
    assert!(n >= 39, "{n} sends in 2 s once recovered to 20/s");
}
