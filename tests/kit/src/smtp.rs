//! The SMTP server of a test: tests/support/smtp_recorder.py (aiosmtpd), which accepts, fails
//! on command, and logs every accepted message for the test to count.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command as Process};

use crate::waits::{PATIENCE, eventually_within};

/// One accepted email, as the SMTP server recorded it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Received {
    pub mail_from: String,
    pub rcpt_tos: Vec<String>,
    pub message_id: Option<String>,
    pub data: String,
    /// When the final dot arrived, in seconds since the Unix epoch.
    #[serde(default)]
    pub received_at: f64,
    /// MAIL FROM, every RCPT TO and DATA reached the server in one read: the client
    /// pipelined them.
    #[serde(default)]
    pub pipelined: bool,
    /// MAIL FROM reached the server in the same read as the previous message's final dot on
    /// its connection: the client wrote this message's commands behind that dot.
    #[serde(default)]
    pub behind_dot: bool,
}

/// A real SMTP server (tests/support/smtp_recorder.py) that logs every accepted message.
pub struct SmtpServer {
    pub port: u16,
    log: PathBuf,
    /// What was read of the log so far: its length in bytes and its records. Waits poll the
    /// log every few milliseconds; reading only what was appended keeps a wait for 5,000
    /// emails from parsing the whole log again on each poll.
    read: Mutex<(usize, Vec<Received>)>,
    child: Child,
}

impl SmtpServer {
    pub async fn start(dir: &Path, args: &[&str]) -> SmtpServer {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../support/smtp_recorder.py");
        let log = dir.join("received.jsonl");
        let mut child = Process::new("/usr/bin/python3")
            .arg(script)
            .args(["--port", "0", "--log"])
            .arg(&log)
            .args(args)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the SMTP recorder (apt-get install python3-aiosmtpd)");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(PATIENCE, lines.next_line())
            .await
            .expect("SMTP recorder did not start")
            .unwrap()
            .expect("SMTP recorder exited");
        let port = first
            .strip_prefix("LISTENING ")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        SmtpServer {
            port,
            log,
            read: Mutex::new((0, Vec::new())),
            child,
        }
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// The recorder's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Everything accepted so far.
    pub fn received(&self) -> Vec<Received> {
        let mut read = self.read.lock().unwrap();
        let (offset, records) = &mut *read;
        if let Ok(new) = read_from(&self.log, *offset) {
            // The last line may still be being written: take complete lines only.
            let complete = new.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
            for line in new[..complete].split_inclusive(|b| *b == b'\n') {
                records.push(serde_json::from_slice(line).unwrap());
            }
            *offset += complete;
        }
        records.clone()
    }

    /// Waits until at least `n` emails were accepted, and returns them all.
    pub async fn wait_for(&self, n: usize) -> Vec<Received> {
        self.wait_for_within(n, PATIENCE).await
    }

    pub async fn wait_for_within(&self, n: usize, patience: Duration) -> Vec<Received> {
        eventually_within(
            patience,
            &format!("{n} emails at the SMTP server"),
            || async {
                let got = self.received();
                (got.len() >= n).then_some(got)
            },
        )
        .await
    }

    /// How many accepted emails carry `message_id`.
    pub fn count(&self, message_id: &str) -> usize {
        self.received()
            .iter()
            .filter(|r| r.message_id.as_deref() == Some(message_id))
            .count()
    }
}

/// The bytes of `path` from `offset` on.
fn read_from(path: &Path, offset: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Read as _, Seek as _};
    let mut file = std::fs::File::open(path)?;
    file.seek(std::io::SeekFrom::Start(offset as u64))?;
    let mut new = Vec::new();
    file.read_to_end(&mut new)?;
    Ok(new)
}
