//! The job arguments `publish` and `enqueue` share, and the one validation they go through; and
//! the one syntax of `--data` on every command that takes it ([`parse_data`]).

use std::io::Read;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::Value;

use crate::door::{self, Admitted};
use crate::job::EmailJob;
use crate::startup;

/// The job described on the command line, for `publish` and `enqueue`.
#[derive(Debug, Args)]
pub struct JobArgs {
    /// Template kind, e.g. welcome.
    #[arg(long)]
    pub kind: String,
    /// Recipient mailbox; repeat for several.
    #[arg(long, required = true)]
    pub to: Vec<String>,
    /// Template data: inline JSON ('{"user":{"name":"Ada"}}'), @path/to/file.json, or @- to
    /// read standard input.
    #[arg(long, default_value = "{}", value_parser = parse_data)]
    pub data: Value,
    /// Idempotency key (default: a new UUID). The same key is sent at most once.
    #[arg(long)]
    pub job_id: Option<String>,
    /// Template locale, e.g. fr.
    #[arg(long)]
    pub locale: Option<String>,
    /// Not before this time: RFC 3339 (2026-12-24T18:00:00Z) or from now (+10m).
    #[arg(long, value_parser = parse_time)]
    pub send_at: Option<DateTime<Utc>>,
    /// Not after this time: RFC 3339 or from now (+1h); a job still unsent then is given up
    /// as expired.
    #[arg(long, value_parser = parse_time)]
    pub expires_at: Option<DateTime<Utc>>,
    /// Template directory: when given, a kind without a template is refused here instead of
    /// being dead-lettered by the worker.
    #[arg(long, env = "MAILROOM_TEMPLATES")]
    pub templates: Option<PathBuf>,
}

impl JobArgs {
    /// Builds the job and lets it through the one validation ([`door::admit`]), against the
    /// templates when `--templates` is given. The error names the field, on one line.
    pub fn admitted(&self) -> anyhow::Result<Admitted> {
        let job = EmailJob {
            job_id: self
                .job_id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
            kind: self.kind.clone(),
            to: self.to.clone(),
            cc: vec![],
            bcc: vec![],
            reply_to: None,
            locale: self.locale.clone(),
            data: self.data.clone(),
            headers: Default::default(),
            created_at: Some(Utc::now()),
            send_at: self.send_at,
            expires_at: self.expires_at,
        };
        let templates = match &self.templates {
            Some(dir) => Some(startup::load_templates(dir)?.1),
            None => None,
        };
        Ok(door::admit(job, templates.as_ref())?)
    }
}

/// A time as `--send-at` and `--expires-at` take it: RFC 3339, or `+` and a duration from now.
pub fn parse_time(arg: &str) -> Result<DateTime<Utc>, String> {
    if let Some(from_now) = arg.strip_prefix('+') {
        let d = crate::config::parse_duration(from_now)?;
        let d = chrono::Duration::from_std(d).map_err(|e| format!("{arg}: {e}"))?;
        return Utc::now()
            .checked_add_signed(d)
            .ok_or_else(|| format!("{arg}: too far ahead"));
    }
    DateTime::parse_from_rfc3339(arg)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!("not a time like 2026-12-24T18:00:00Z (RFC 3339) or +10m (from now): {e}")
        })
}

/// `--data` as every command takes it (`enqueue`, `publish`, `templates preview`), the way curl
/// reads `-d`: `@path` is a file, `@-` (or `-`) standard input, anything else inline JSON.
pub fn parse_data(arg: &str) -> Result<Value, String> {
    let (text, from) = match arg {
        "-" | "@-" => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| format!("reading standard input: {e}"))?;
            (text, "standard input".to_owned())
        }
        _ => match arg.strip_prefix('@') {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
                (text, path.to_owned())
            }
            None => return serde_json::from_str(arg).map_err(|e| not_json(&e, "inline", arg)),
        },
    };
    serde_json::from_str(&text).map_err(|e| not_json(&e, &from, arg))
}

fn not_json(error: &serde_json::Error, from: &str, arg: &str) -> String {
    let hint = if from == "inline" && !arg.trim_start().starts_with(['{', '[']) {
        " (a file is @path, standard input @-)"
    } else {
        ""
    };
    format!("{from}: not JSON: {error}{hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_inline_json_or_a_file_after_an_at_sign() {
        assert_eq!(parse_data(r#"{"a": 1}"#), Ok(serde_json::json!({"a": 1})));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("data.json");
        std::fs::write(&file, r#"{"user": {"name": "Ada"}}"#).unwrap();
        let at = format!("@{}", file.display());
        assert_eq!(parse_data(&at).unwrap()["user"]["name"], "Ada");
    }

    #[test]
    fn data_that_is_not_json_says_where_it_came_from() {
        let err = parse_data("data.json").unwrap_err();
        assert!(err.starts_with("inline: not JSON: "), "{err}");
        assert!(
            err.ends_with("(a file is @path, standard input @-)"),
            "{err}"
        );
        let err = parse_data("@/nonexistent/data.json").unwrap_err();
        assert!(err.starts_with("reading /nonexistent/data.json: "), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("broken.json");
        std::fs::write(&file, "{").unwrap();
        let err = parse_data(&format!("@{}", file.display())).unwrap_err();
        assert!(
            err.starts_with(&format!("{}: not JSON: ", file.display())),
            "{err}"
        );
    }
    #[test]
    fn a_time_is_rfc_3339_or_a_duration_from_now() {
        let at = parse_time("2026-12-24T18:00:00+01:00").unwrap();
        assert_eq!(at.to_rfc3339(), "2026-12-24T17:00:00+00:00");
        let before = chrono::Utc::now();
        let soon = parse_time("+10m").unwrap();
        let ahead = soon - before;
        assert!(ahead >= chrono::Duration::minutes(10), "{ahead}");
        assert!(ahead < chrono::Duration::minutes(11), "{ahead}");
        let err = parse_time("tomorrow").unwrap_err();
        assert!(err.contains("RFC 3339"), "{err}");
    }
}
