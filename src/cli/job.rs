//! The job arguments `publish` and `enqueue` share, and the one validation they go through.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;

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
    /// Template data: a JSON object, or @path/to/file.json.
    #[arg(long, default_value = "{}")]
    pub data: String,
    /// Idempotency key (default: a new UUID). The same key is sent at most once.
    #[arg(long)]
    pub job_id: Option<String>,
    /// Template locale, e.g. fr.
    #[arg(long)]
    pub locale: Option<String>,
    /// Template directory: when given, a kind without a template is refused here instead of
    /// being dead-lettered by the worker.
    #[arg(long, env = "MAILROOM_TEMPLATES")]
    pub templates: Option<PathBuf>,
}

impl JobArgs {
    /// Builds the job and lets it through the one validation ([`door::admit`]), against the
    /// templates when `--templates` is given. The error names the field, on one line.
    pub fn admitted(&self) -> anyhow::Result<Admitted> {
        let text = match self.data.strip_prefix('@') {
            Some(path) => {
                std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?
            }
            None => self.data.clone(),
        };
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
            data: serde_json::from_str(&text).context("--data is not JSON")?,
            headers: Default::default(),
            created_at: Some(chrono::Utc::now()),
        };
        let templates = match &self.templates {
            Some(dir) => Some(startup::load_templates(dir)?.1),
            None => None,
        };
        Ok(door::admit(job, templates.as_ref())?)
    }
}
