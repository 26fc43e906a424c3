//! `mailroom dlq show` and `GET /v1/dlq/{job_id}`: one rule for email addresses, the text and
//! the JSON alike: masked everywhere (job, headers, ledger row) unless `--reveal` /
//! `?reveal=true`.

use serde_json::Value;

use super::{letter, publish_dead};
use crate::helpers::*;

const FULL: [&str; 2] = ["ada@example.com", "support@acme.example"];

fn assert_masked(text: &str) {
    for address in FULL {
        assert!(!text.contains(address), "{address} shown in full: {text}");
    }
    assert!(text.contains("a***@example.com"), "{text}");
}

fn assert_revealed(text: &str) {
    for address in FULL {
        assert!(text.contains(address), "{address} not revealed: {text}");
    }
}

#[tokio::test]
async fn show_masks_every_address_in_text_and_json_unless_revealed() {
    let app = TestApp::spawn().await;
    let reason = "550 5.1.1 <ada@example.com>: no such user";
    publish_dead(&app, &[letter(&app.job("shown"), "rejected", reason)]).await;

    let text = app.cli(&["dlq", "show", "shown"]).await;
    assert_masked(&text);
    assert!(text.contains("to           a***@example.com"), "{text}");
    let json = app.cli(&["dlq", "show", "shown", "--json"]).await;
    assert_masked(&json);
    let shown: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(shown[0]["job"]["to"][0], "Ada Lovelace <a***@example.com>");
    assert_eq!(shown[0]["job"]["job_id"], "shown");

    let text = app.cli(&["dlq", "show", "shown", "--reveal"]).await;
    assert_revealed(&text);
    let json = app
        .cli(&["dlq", "show", "shown", "--json", "--reveal"])
        .await;
    assert_revealed(&json);
    let shown: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(shown[0]["job"]["to"][0], "Ada Lovelace <ada@example.com>");
    let header = shown[0]["headers"]["x-mailroom-error"].as_str().unwrap();
    assert_eq!(header, reason);
}

#[tokio::test]
async fn the_http_api_masks_a_shown_dead_letter_unless_revealed() {
    let app = TestApp::spawn().await;
    publish_dead(&app, &[letter(&app.job("over-http"), "rejected", "550")]).await;
    let api = Api::start(&app).await;
    let get = |query: &str| {
        let url = format!("{}/v1/dlq/over-http{query}", api.base);
        let req = api.client.get(url).bearer_auth(TOKEN);
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status().as_u16(), 200);
            resp.text().await.unwrap()
        }
    };
    assert_masked(&get("").await);
    assert_masked(&get("?reveal=false").await);
    assert_revealed(&get("?reveal=true").await);
}
