//! DKIM signing: messages signed with an RSA or an Ed25519 key from `openssl genpkey` verify
//! with an independent verifier (dkimpy, Debian's python3-dkim), and stop verifying once a
//! signed header is changed; a key mailroom cannot use is refused at startup without quoting it.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use serde_json::json;

use crate::helpers::*;

const SELECTOR: &str = "mr2026";

/// Generates a key of `algorithm` (`ed25519` or `rsa`) in `dir`: its file, and the DNS TXT
/// record that publishes its public half.
fn keypair(dir: &Path, algorithm: &str) -> (PathBuf, String) {
    let key = dir.join(format!("{algorithm}.pem"));
    let ok = Command::new("openssl")
        .args(["genpkey", "-algorithm", algorithm, "-out"])
        .arg(&key)
        .status()
        .expect("openssl (scripts/services installs it)");
    assert!(ok.success());
    let public = Command::new("openssl")
        .args(["pkey", "-pubout", "-outform", "DER", "-in"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(public.status.success());
    let b64 = base64::engine::general_purpose::STANDARD;
    let record = match algorithm {
        // RFC 8463: the raw 32-byte key, the end of its SubjectPublicKeyInfo.
        "ed25519" => format!("v=DKIM1; k=ed25519; p={}", b64.encode(&public.stdout[12..])),
        _ => format!("v=DKIM1; k=rsa; p={}", b64.encode(&public.stdout)),
    };
    (key, record)
}

fn verify(dir: &Path, message: &str, record: &str) -> (bool, String) {
    let file = dir.join("message.eml");
    std::fs::write(&file, message).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/dkim_verify.py");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(&file)
        .arg(record)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

async fn signed_message_verifies(algorithm: &str) {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let (key, record) = keypair(dir.path(), algorithm);
    let worker = app.start_worker(&[
        "--dkim-key",
        key.to_str().unwrap(),
        "--dkim-selector",
        SELECTOR,
        "--dkim-domain",
        "mailroom.test",
    ]);
    let mut job = app.job("dkim-1");
    // Encoded words in the headers and a long line in the body.
    job["to"] = json!(["山田 太郎 <taro@example.com>"]);
    job["data"]["user"]["name"] = json!(format!("太郎 {}", "x".repeat(200)));
    app.publish(&job).await;
    let got = app.smtp.wait_for(1).await;
    worker.stop().await;
    let message = &got[0].data;
    assert!(message.contains("DKIM-Signature:"), "{message}");
    let (ok, said) = verify(dir.path(), message, &record);
    assert!(ok, "{said}\n{message}");
    assert!(said.contains("d=mailroom.test"), "{said}");
    assert!(said.contains(&format!("s={SELECTOR}")), "{said}");
    assert!(said.contains(&format!("a={algorithm}-sha256")), "{said}");
    // The verifier is not vacuous: a changed signed header fails.
    let tampered = message.replacen("Subject: ", "Subject: Re: ", 1);
    let (ok, said) = verify(dir.path(), &tampered, &record);
    assert!(!ok, "a tampered subject verified: {said}");
}

#[tokio::test]
async fn messages_signed_with_an_ed25519_key_verify() {
    signed_message_verifies("ed25519").await;
}

#[tokio::test]
async fn messages_signed_with_an_rsa_key_verify() {
    signed_message_verifies("rsa").await;
}

#[tokio::test]
async fn a_key_mailroom_cannot_use_is_refused_at_startup_without_quoting_it() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("bad.pem");
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ5dGVzLW5vdC1hLWtleQ==\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let mut args = vec!["worker".to_string()];
    args.extend(app.worker_args(&[
        "--dkim-key",
        key.to_str().unwrap(),
        "--dkim-selector",
        SELECTOR,
    ]));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = app.cli_output(&args).await;
    assert_eq!(out.status.code(), Some(78), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("not a private key mailroom can sign with"),
        "{}",
        out.stderr
    );
    assert!(
        !out.stderr.contains("c2VjcmV0"),
        "the key was quoted: {}",
        out.stderr
    );
}
