//! `mailroom templates check | preview`: what CI and a template author run before a deploy.
//! `check` is [`Templates::load`], which compiles every file and renders every kind with its
//! `sample.json` in strict mode in every locale; `preview` renders one kind as the worker would.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use lettre::message::Mailbox;

use super::job::parse_data;
use crate::job::EmailJob;
use crate::render::RenderedEmail;
use crate::startup::load_templates;

#[derive(Debug, Args)]
pub struct TemplatesArgs {
    #[command(subcommand)]
    pub command: TemplatesCommand,
}

#[derive(Debug, Subcommand)]
pub enum TemplatesCommand {
    /// Render every template with its sample.json, strictly, in every locale; exit ≠ 0 on error.
    Check(CheckArgs),
    /// Render one kind as text, HTML, or a whole .eml message.
    Preview(Box<PreviewArgs>),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Template directory.
    #[arg(long, env = "MAILROOM_TEMPLATES", default_value = "./templates")]
    pub templates: PathBuf,
}

/// What `preview` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The subject and the plain-text part.
    Text,
    /// The HTML part.
    Html,
    /// The whole MIME message, as the SMTP server would receive it.
    Eml,
}

#[derive(Debug, Args)]
pub struct PreviewArgs {
    /// Template directory.
    #[arg(long, env = "MAILROOM_TEMPLATES", default_value = "./templates")]
    pub templates: PathBuf,
    /// The kind (template folder) to render.
    pub kind: String,
    /// Template data, as `enqueue --data` takes it: inline JSON, @path/to/file.json, or @- to
    /// read standard input (default: the kind's sample.json).
    #[arg(long, value_parser = preview_data)]
    pub data: Option<serde_json::Value>,
    /// Locale, e.g. fr or pt-BR (default: the default templates).
    #[arg(long)]
    pub locale: Option<String>,
    /// What to print.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Sender, for --format eml.
    #[arg(
        long,
        env = "MAILROOM_FROM",
        default_value = "Mailroom Preview <preview@mailroom.invalid>"
    )]
    pub from: Mailbox,
    /// Recipient, for --format eml.
    #[arg(long, default_value = "Ada Lovelace <ada@example.com>")]
    pub to: String,
    /// Job id, for the Message-ID of --format eml.
    #[arg(long, default_value = "preview")]
    pub job_id: String,
    /// Right-hand side of the Message-ID (default: the domain of --from).
    #[arg(long, env = "MAILROOM_MESSAGE_ID_DOMAIN")]
    pub message_id_domain: Option<String>,
}

impl TemplatesArgs {
    pub fn run(&self) -> anyhow::Result<()> {
        match &self.command {
            TemplatesCommand::Check(a) => check(&a.templates),
            TemplatesCommand::Preview(a) => preview(a),
        }
    }
}

fn check(dir: &Path) -> anyhow::Result<()> {
    let (_, templates) = load_templates(dir).context("templates check failed")?;
    for kind in templates.kinds() {
        println!("ok  {kind}");
    }
    println!(
        "{} kinds render their sample.json in every locale; revision {}",
        templates.kinds().len(),
        templates.revision()
    );
    Ok(())
}

fn preview(a: &PreviewArgs) -> anyhow::Result<()> {
    let (_, templates) = load_templates(&a.templates)?;
    let data = match &a.data {
        Some(data) => data.clone(),
        None => templates
            .sample(&a.kind)
            .cloned()
            .with_context(|| format!("no template for kind {:?}", a.kind))?,
    };
    let rendered = templates.render(&a.kind, a.locale.as_deref(), &data)?;
    match a.format {
        Format::Text => {
            println!("Subject: {}\n", rendered.subject);
            match &rendered.text {
                Some(text) => print!("{text}"),
                None => println!("(no text part: {:?} has only HTML)", a.kind),
            }
        }
        Format::Html => print!("{}", rendered.html),
        Format::Eml => print!("{}", eml(a, data, &rendered)?),
    }
    Ok(())
}

/// [`parse_data`], and the form `preview` took before it: a bare path to an existing file, read
/// with a note to write `@path`, so scripts written for it keep working.
fn preview_data(arg: &str) -> Result<serde_json::Value, String> {
    let bare_file = !arg.starts_with('@') && arg != "-" && Path::new(arg).is_file();
    if bare_file && serde_json::from_str::<serde_json::Value>(arg).is_err() {
        eprintln!(
            "note: --data {arg} reads the file for now; write --data @{arg}, as enqueue takes it"
        );
        return parse_data(&format!("@{arg}"));
    }
    parse_data(arg)
}

/// The whole MIME message a job of `a.kind` with `data` would be sent as.
fn eml(
    a: &PreviewArgs,
    data: serde_json::Value,
    rendered: &RenderedEmail,
) -> anyhow::Result<String> {
    let job = EmailJob {
        job_id: a.job_id.clone(),
        kind: a.kind.clone(),
        to: vec![a.to.clone()],
        cc: vec![],
        bcc: vec![],
        reply_to: None,
        locale: a.locale.clone(),
        data,
        headers: Default::default(),
        created_at: None,
    };
    let job = job.validate()?;
    let domain = match &a.message_id_domain {
        Some(d) => d.clone(),
        None => a.from.email.domain().to_string(),
    };
    let message = crate::smtp::build_message(&a.from, &domain, &job, rendered)?;
    Ok(String::from_utf8_lossy(&message.formatted()).into_owned())
}
