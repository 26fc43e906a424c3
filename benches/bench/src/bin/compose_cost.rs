//! What composing one email costs a worker, with no I/O: decoding the job, rendering its
//! templates, building the MIME message and formatting it, in µs per email for the bench's
//! `welcome` job (run from the repository root, which holds `templates/`); then
//! `smtp::build_message` for parts of 1, 2 and 4 MB, which shows whether the cost grows with
//! the part's size or faster; then DKIM signatures with an RSA 2048 and an Ed25519 key (made
//! by `openssl genpkey`), which run on the thread that sends.
//!
//! ```sh
//! cargo run --release -p mailroom-bench --bin compose_cost [n]
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use lettre::message::Mailbox;
use mailroom::job::EmailJob;
use mailroom::render::{RenderedEmail, Templates};
use mailroom::smtp::build_message;
use mailroom::smtp::dkim::{Dkim, DkimSettings};

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("n is a number of emails"))
        .unwrap_or(20_000);
    let templates = Templates::load(Path::new("templates")).expect("templates/ loads");
    let from: Mailbox = "Acme <noreply@acme.example>".parse().unwrap();
    let jobs: Vec<Vec<u8>> = (0..n)
        .map(|i| mailroom_bench::workload::job("compose", i, Utc::now()).1)
        .collect();
    for round in 1..=3 {
        let [mut decode, mut render, mut build, mut format] = [Duration::ZERO; 4];
        let mut bytes = 0;
        for body in &jobs {
            let t0 = Instant::now();
            let job = EmailJob::decode(body).expect("a bench job is valid");
            let t1 = Instant::now();
            let email = templates
                .render(&job.job.kind, job.job.locale.as_deref(), &job.job.data)
                .expect("the welcome template renders");
            let t2 = Instant::now();
            let message = build_message(&from, "acme.example", &job, &email).expect("builds");
            let t3 = Instant::now();
            bytes += message.formatted().len();
            let t4 = Instant::now();
            decode += t1 - t0;
            render += t2 - t1;
            build += t3 - t2;
            format += t4 - t3;
        }
        let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
        println!(
            "round {round}: {:.1} µs per email (decode {:.1}, render {:.1}, build {:.1}, format {:.1}), {} B",
            per(decode + render + build + format),
            per(decode),
            per(render),
            per(build),
            per(format),
            bytes / n
        );
    }
    let job = EmailJob::decode(&jobs[0]).unwrap();
    let line = format!("{}\n", "y".repeat(79));
    for mb in [1usize, 2, 4] {
        let part = line.repeat(mb * 1024 * 1024 / line.len());
        let email = RenderedEmail {
            subject: "large".into(),
            html: part.clone(),
            text: Some(part),
        };
        let started = Instant::now();
        let message = build_message(&from, "acme.example", &job, &email).expect("builds");
        println!(
            "HTML and text parts of {mb} MB each, {} lines: build_message {:.1} ms, {} B",
            email.html.len() / line.len(),
            started.elapsed().as_secs_f64() * 1e3,
            message.formatted().len()
        );
    }
    let dir = std::env::temp_dir().join(format!("compose-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (label, args) in [
        (
            "RSA 2048",
            &["-algorithm", "rsa", "-pkeyopt", "rsa_keygen_bits:2048"][..],
        ),
        ("Ed25519", &["-algorithm", "ed25519"][..]),
    ] {
        let key = dir.join("key.pem");
        let made = std::process::Command::new("openssl")
            .arg("genpkey")
            .args(args)
            .arg("-out")
            .arg(&key)
            .stderr(std::process::Stdio::null())
            .status();
        if !made.is_ok_and(|s| s.success()) {
            println!("DKIM {label}: skipped (openssl genpkey failed)");
            continue;
        }
        let dkim = Dkim::load(&DkimSettings {
            key,
            selector: "bench".into(),
            domain: "acme.example".into(),
        })
        .expect("the key loads");
        let job = EmailJob::decode(&jobs[0]).unwrap();
        let email = templates
            .render(&job.job.kind, None, &job.job.data)
            .unwrap();
        let mut messages: Vec<_> = (0..n.min(2_000))
            .map(|_| build_message(&from, "acme.example", &job, &email).unwrap())
            .collect();
        let started = Instant::now();
        for message in &mut messages {
            dkim.sign(message);
        }
        println!(
            "DKIM {label}: {:.1} µs per signature",
            started.elapsed().as_secs_f64() * 1e6 / messages.len() as f64
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
