//! The suppression list: a job to a suppressed address is recorded `suppressed` and not sent,
//! lookups compare normalised addresses, a hard bounce suppresses its address, and the CLI and
//! the HTTP API manage the list.

use serde_json::{Value, json};

use crate::helpers::*;

fn to(app: &TestApp, job_id: &str, address: &str) -> Value {
    let mut job = app.job(job_id);
    job["to"] = json!([address]);
    job
}

#[tokio::test]
async fn a_job_to_a_suppressed_address_is_not_sent_and_says_suppressed_with_the_reason() {
    let app = TestApp::spawn().await;
    let out = app
        .cli(&[
            "suppressions",
            "add",
            "ada@EXAMPLE.com",
            "--reason",
            "unsubscribed",
            "--detail",
            "ticket 7",
        ])
        .await;
    assert!(
        out.contains("ada@example.com suppressed (unsubscribed)"),
        "{out}"
    );
    let worker = app.start_worker(&[]);
    app.publish(&app.job("to-ada")).await;
    app.publish(&to(&app, "to-bob", "bob@example.com")).await;
    app.wait_for_row("to-bob", "welcome", "the other job sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    let row = app
        .wait_for_row("to-ada", "welcome", "row recorded", |n| {
            n.status.as_str() == "dead"
        })
        .await;
    let reason = row.last_error.unwrap_or_default();
    assert!(reason.contains("unsubscribed: ticket 7"), "{reason}");
    let out = app.cli(&["status", "to-ada", "welcome"]).await;
    assert!(out.contains("to-ada welcome: suppressed"), "{out}");
    // Found by the recipient it was not sent to.
    let out = app
        .cli(&[
            "jobs",
            "search",
            "--recipient",
            "ada@example.com",
            "--reveal",
        ])
        .await;
    assert!(out.contains("to-ada"), "{out}");

    // A second copy is a duplicate, not a second record or a dead letter.
    app.publish(&app.job("to-ada")).await;
    worker.stats.wait_until(|s| s.duplicates >= 1).await;
    let s = worker.stats.snapshot();
    assert_eq!((s.suppressed, s.dead_lettered), (1, 0), "{s:?}");
    assert_eq!(
        app.dead_count().await,
        0,
        "nothing failed, nothing to triage"
    );
    worker.stop().await;
    assert_eq!(app.smtp.count(&app.message_id("to-ada", "welcome")), 0);
    assert_eq!(app.smtp.received().len(), 1);
}

#[tokio::test]
async fn lookups_ignore_the_domains_case_and_not_the_local_parts() {
    let app = TestApp::spawn().await;
    app.cli(&["suppressions", "add", "Ada@example.com"]).await;
    let check = app
        .cli_output(&["suppressions", "check", "ada@example.com"])
        .await;
    assert_eq!(check.status.code(), Some(1), "{}", check.stdout);
    assert!(
        check.stderr.contains("is not suppressed"),
        "{}",
        check.stderr
    );
    let out = app.cli(&["suppressions", "check", "Ada@EXAMPLE.COM"]).await;
    assert!(out.contains("Ada@example.com  manual"), "{out}");
    // An internationalised domain is one domain in either of its forms.
    app.cli(&["suppressions", "add", "jm@MÜLLER.de"]).await;
    let out = app
        .cli(&["suppressions", "check", "jm@xn--mller-kva.de"])
        .await;
    assert!(out.contains("jm@müller.de  manual"), "{out}");

    let worker = app.start_worker(&[]);
    app.publish(&to(&app, "lower", "ada@example.com")).await;
    app.publish(&to(&app, "upper-domain", "Ada@Example.COM"))
        .await;
    app.wait_for_row("lower", "welcome", "sent", |n| n.status.as_str() == "sent")
        .await;
    let row = app
        .wait_for_row("upper-domain", "welcome", "suppressed", |n| {
            n.status.as_str() == "dead"
        })
        .await;
    let reason = row.last_error.unwrap_or_default();
    assert!(reason.contains("is suppressed (manual"), "{reason}");
    worker.stop().await;
    assert_eq!(
        app.smtp.count(&app.message_id("upper-domain", "welcome")),
        0
    );
}

#[tokio::test]
async fn a_suppressed_cc_is_left_out_and_the_email_goes_to_the_others() {
    let app = TestApp::spawn().await;
    app.cli(&[
        "suppressions",
        "add",
        "bob@example.com",
        "--reason",
        "complaint",
    ])
    .await;
    let mut job = app.job("with-cc");
    job["cc"] = json!(["Bob <bob@example.com>", "carol@example.com"]);
    let worker = app.start_worker(&[]);
    app.publish(&job).await;
    let got = app.smtp.wait_for(1).await;
    worker.stop().await;
    let mut rcpt = got[0].rcpt_tos.clone();
    rcpt.sort();
    assert_eq!(rcpt, ["ada@example.com", "carol@example.com"]);
    assert!(!got[0].data.contains("bob@example.com"), "{}", got[0].data);
}

#[tokio::test]
async fn a_hard_bounce_suppresses_the_address_and_the_next_job_to_it_is_not_sent() {
    // The server refuses the first RCPT as an unknown mailbox (550 5.1.1), then accepts.
    let app = TestApp::spawn_with(&["--fail", "RCPT:550:1"]).await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("bounced")).await;
    app.wait_for_row("bounced", "welcome", "rejected", |n| {
        n.status.as_str() == "dead"
    })
    .await;
    let out = app.cli(&["suppressions", "list", "--json"]).await;
    let entry: Value = serde_json::from_str(out.lines().next().unwrap_or("null")).unwrap();
    assert_eq!(entry["address"], "ada@example.com", "{out}");
    assert_eq!(entry["reason"], "hard_bounce");
    assert!(
        entry["detail"].as_str().unwrap().contains("5.1.1"),
        "{entry}"
    );

    app.publish(&app.job("after-bounce")).await;
    app.publish(&to(&app, "someone-else", "bob@example.com"))
        .await;
    app.wait_for_row("someone-else", "welcome", "sent", |n| {
        n.status.as_str() == "sent"
    })
    .await;
    app.wait_for_row("after-bounce", "welcome", "suppressed", |n| {
        n.status.as_str() == "dead"
    })
    .await;
    worker.stop().await;
    assert_eq!(
        app.smtp.count(&app.message_id("after-bounce", "welcome")),
        0
    );
}

#[tokio::test]
async fn the_http_api_puts_shows_lists_and_deletes_entries() {
    let app = TestApp::spawn().await;
    let api = Api::start(&app).await;
    let url = |address: &str| format!("{}/v1/suppressions/{address}", api.base);
    let put = api
        .client
        .put(url("Ada@EXAMPLE.com"))
        .bearer_auth(TOKEN)
        .json(&json!({"reason": "unsubscribed", "by": "support"}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 200);
    let entry: Value = put.json().await.unwrap();
    assert_eq!(entry["address"], "Ada@example.com");
    assert_eq!(
        (&entry["reason"], &entry["created_by"]),
        (&json!("unsubscribed"), &json!("support"))
    );

    let bad = api
        .client
        .put(url("ada@example.com"))
        .bearer_auth(TOKEN)
        .json(&json!({"reason": "bounced"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    let problem: Value = bad.json().await.unwrap();
    assert_eq!(problem["pointer"], "/reason", "{problem}");

    let list: Value = api
        .client
        .get(format!("{}/v1/suppressions?reason=unsubscribed", api.base))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(list["suppressions"].as_array().unwrap().len(), 1, "{list}");

    let unauthenticated = api.client.get(url("Ada@example.com")).send().await.unwrap();
    assert_eq!(unauthenticated.status().as_u16(), 401);
    let delete = |address: &'static str| api.client.delete(url(address)).bearer_auth(TOKEN).send();
    assert_eq!(
        delete("Ada@example.COM").await.unwrap().status().as_u16(),
        204
    );
    assert_eq!(
        delete("Ada@example.com").await.unwrap().status().as_u16(),
        404
    );
    let gone = api
        .client
        .get(url("Ada@example.com"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status().as_u16(), 404);
}

#[tokio::test]
async fn a_replay_honours_the_suppression_list() {
    // A 5.1.1 bounce suppresses the address; replaying the dead letter does not send to it.
    let app = TestApp::spawn_with(&["--fail", "RCPT:550:1"]).await;
    let worker = app.start_worker(&[]);
    app.publish(&app.job("bounced-then-replayed")).await;
    worker.stats.wait_until(|s| s.dead_lettered == 1).await;
    app.cli(&["dlq", "ingest"]).await;
    app.cli(&["dlq", "replay", "bounced-then-replayed"]).await;
    worker.stats.wait_until(|s| s.suppressed == 1).await;
    let out = app
        .cli(&["status", "bounced-then-replayed", "welcome"])
        .await;
    assert!(
        out.contains("suppressed") && out.contains("hard_bounce"),
        "{out}"
    );
    assert_eq!(
        app.dead_count().await,
        0,
        "replayed, then suppressed: nothing dead"
    );
    worker.stop().await;
    assert!(app.smtp.received().is_empty());
}

/// A claim reads the suppression list's entries for its own addresses in its own statement:
/// 48 claims asked at once through the grouped ledger (a pool of 2 connections, so claims
/// queue while groups are written) each get exactly the entries among their addresses, none of
/// another claim's, and share statements. Addresses are compared byte for byte: a trailing
/// space or another case in the local part is another address. A claim on its own (a replay's
/// path) reads them too.
#[tokio::test]
async fn a_claim_reads_the_entries_of_its_own_addresses_and_none_of_another_claims() {
    use mailroom::db::group::{Ledger, LedgerStats};
    use mailroom::db::suppressions::{Reason, key};
    use mailroom::db::{Claim, ClaimRequest};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    let app = TestApp::spawn().await;
    let address = |i: usize| format!("screen-{i}@example.com");
    for i in (0..48).step_by(3) {
        app.db
            .suppress(&key(&address(i)).unwrap(), Reason::Manual, None, "test")
            .await
            .unwrap();
    }
    app.db
        .suppress("shared@example.com", Reason::Complaint, None, "test")
        .await
        .unwrap();
    let db = mailroom::db::Database::connect_lazy(&app.db_url.parse().unwrap(), 2).unwrap();
    let stats = Arc::new(LedgerStats::default());
    let ledger = Ledger::direct(db.clone(), stats.clone()).grouped(64);
    // What claim `i` looks up: its own address, one nobody suppressed, every fourth the shared
    // entry, and every fifth a near miss of a suppressed address instead of its own.
    let screen = |i: usize| {
        let mut keys = vec![format!("other-{i}@example.com")];
        keys.push(match i % 5 {
            0 => format!("{} ", address(i)),
            1 => address(i).replacen("screen", "Screen", 1),
            _ => address(i),
        });
        if i.is_multiple_of(4) {
            keys.push("shared@example.com".into());
        }
        keys
    };
    let expected = |i: usize| {
        let mut found = vec![];
        if i.is_multiple_of(3) && i % 5 > 1 {
            found.push(address(i));
        }
        if i.is_multiple_of(4) {
            found.push("shared@example.com".to_owned());
        }
        found.sort();
        found
    };
    let asks = (0..48).map(|i| {
        let ledger = ledger.clone();
        let screen = screen(i);
        tokio::spawn(async move {
            let job_id = format!("screened-{i}");
            let request = screened_claim(&job_id, &screen);
            (i, ledger.claim(&request).await.unwrap())
        })
    });
    for answer in futures_util::future::join_all(asks).await {
        let (i, claim) = answer.unwrap();
        let Claim::Claimed { suppressed, .. } = claim else {
            panic!("claim {i} of a new job was refused: {claim:?}");
        };
        let mut found: Vec<String> = suppressed.into_iter().map(|s| s.address).collect();
        found.sort();
        assert_eq!(found, expected(i), "claim {i} looked up {:?}", screen(i));
    }
    let groups = stats.groups.load(Ordering::Relaxed);
    assert!(groups < 48, "48 concurrent claims took {groups} groups");

    // Alone, as a replay's claim goes: the same answer; a refused claim reads nothing.
    let screen = vec![address(3), "shared@example.com".to_owned()];
    let alone = |job_id: &'static str| ClaimRequest {
        resend_uncertain: false,
        replay: true,
        ..screened_claim(job_id, &screen)
    };
    let Claim::Claimed { suppressed, .. } = ledger.claim(&alone("screened-alone")).await.unwrap()
    else {
        panic!("the claim alone was refused");
    };
    let mut found: Vec<String> = suppressed.into_iter().map(|s| s.address).collect();
    found.sort();
    assert_eq!(found, vec![address(3), "shared@example.com".to_owned()]);
    let again = ledger.claim(&alone("screened-alone")).await.unwrap();
    assert!(matches!(again, Claim::Refused(Some(_))), "{again:?}");
}

/// A group's addresses may outnumber what one statement takes (MySQL: 65,535 parameters): a
/// claim looking up 2,500 addresses gets the entries at the start, the middle and the end.
#[tokio::test]
async fn a_claim_looking_up_thousands_of_addresses_gets_every_entry() {
    use mailroom::db::Claim;
    use mailroom::db::suppressions::Reason;

    let app = TestApp::spawn().await;
    let screen: Vec<String> = (0..2_500)
        .map(|i| format!("many-{i}@example.com"))
        .collect();
    let suppressed = [0, 999, 1_000, 1_500, 2_499];
    for i in suppressed {
        app.db
            .suppress(&screen[i], Reason::Manual, None, "test")
            .await
            .unwrap();
    }
    let request = screened_claim("many-addresses", &screen);
    let Claim::Claimed {
        suppressed: found, ..
    } = app.db.claim(&request).await.unwrap()
    else {
        panic!("the claim of a new job was refused");
    };
    let mut found: Vec<String> = found.into_iter().map(|s| s.address).collect();
    found.sort();
    let mut expected: Vec<String> = suppressed.iter().map(|&i| screen[i].clone()).collect();
    expected.sort();
    assert_eq!(found, expected);
}

/// The claim of a new job that looks `screen` up in the suppression list.
fn screened_claim<'a>(job_id: &'a str, screen: &'a [String]) -> mailroom::db::ClaimRequest<'a> {
    mailroom::db::ClaimRequest {
        job_id,
        kind: "welcome",
        message_id: "<screened@mailroom.test>",
        token: uuid::Uuid::new_v4(),
        lease: std::time::Duration::from_secs(60),
        resend_uncertain: true,
        replay: false,
        recipient: None,
        screen,
    }
}
