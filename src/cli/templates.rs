//! `mailroom templates check | preview`: what CI and a template author run before a deploy.
//! `check` is [`Templates::check`], which compiles every file and renders every template with
//! its kind's `sample.json` in strict mode, and reports every error, one `path:line:column:
//! message` line each; `preview` renders one kind as the worker would, or with `--serve`
//! opens the console's preview page on loopback, re-rendered whenever a file is saved.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use lettre::message::Mailbox;

use super::job::parse_data;
use crate::job::EmailJob;
use crate::render::{RenderedEmail, TemplateError, Templates};
use crate::startup::load_templates;

#[derive(Debug, Args)]
pub struct TemplatesArgs {
    #[command(subcommand)]
    pub command: TemplatesCommand,
}

#[derive(Debug, Subcommand)]
pub enum TemplatesCommand {
    /// Render every template with its sample.json, strictly, in every locale; print every error
    /// (path:line:column: message) and exit ≠ 0 if there is any.
    Check(CheckArgs),
    /// Render one kind as text, HTML, or a whole .eml message.
    Preview(Box<PreviewArgs>),
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Template directory.
    #[arg(long, env = "MAILROOM_TEMPLATES", default_value = "./templates")]
    pub templates: PathBuf,
    /// Report only this kind's files (and the layouts and partials every kind shares).
    #[arg(long)]
    pub kind: Option<String>,
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
    /// Serve a page instead of printing: the kind rendered with its sample.json, again within
    /// a second of each save of a file in the directory (edit in your own editor).
    #[arg(long)]
    pub serve: bool,
    /// Where --serve listens; loopback only (the page has no login).
    #[arg(long, default_value = "127.0.0.1:8025", requires = "serve")]
    pub addr: SocketAddr,
}

impl TemplatesArgs {
    pub async fn run(&self) -> anyhow::Result<()> {
        match &self.command {
            TemplatesCommand::Check(a) => check(a),
            TemplatesCommand::Preview(a) if a.serve => serve_preview(a).await,
            TemplatesCommand::Preview(a) => preview(a),
        }
    }
}

/// `preview --serve`: the console's page that follows the files, until SIGINT/SIGTERM.
async fn serve_preview(a: &PreviewArgs) -> anyhow::Result<()> {
    let dir = std::path::absolute(&a.templates)
        .with_context(|| format!("template directory {}", a.templates.display()))?;
    known_kind(&a.kind, &kind_folders(&dir))?;
    let listener = tokio::net::TcpListener::bind(a.addr)
        .await
        .with_context(|| format!("listening on {}", a.addr))?;
    let locale = a.locale.as_deref().unwrap_or("default");
    let addr = listener.local_addr()?;
    println!(
        "previewing {}: http://{addr}/console/templates/{}/{locale}/live",
        a.kind, a.kind
    );
    let shutdown = crate::shutdown::on_signals()?;
    crate::console::serve_designer(listener, dir, shutdown).await
}

fn check(a: &CheckArgs) -> anyhow::Result<()> {
    let dir = std::path::absolute(&a.templates)
        .with_context(|| format!("template directory {}", a.templates.display()))?;
    let kinds = kind_folders(&dir);
    if let Some(kind) = &a.kind {
        known_kind(kind, &kinds)?;
    }
    match Templates::check(&dir) {
        Ok(templates) => {
            passed(&templates, a.kind.as_deref());
            Ok(())
        }
        Err(errors) => failed(&dir, &kinds, a.kind.as_deref(), &errors),
    }
}

/// Every error (of `only` and the shared files, when given) as `path:line:column: message` on
/// stderr, `ok` for each kind without one, and the count as the command's error.
fn failed(
    dir: &Path,
    kinds: &[String],
    only: Option<&str>,
    errors: &[TemplateError],
) -> anyhow::Result<()> {
    let shared = [dir.join("layouts"), dir.join("partials")];
    let is_shared = |path: &Path| shared.iter().any(|s| path.starts_with(s));
    let chosen = |path: &Path| only.is_none_or(|kind| path.starts_with(dir.join(kind)));
    let shown: Vec<&TemplateError> = errors
        .iter()
        .filter(|e| chosen(e.path()) || is_shared(e.path()))
        .collect();
    for e in &shown {
        eprintln!("{}", e.located());
    }
    let files: BTreeSet<&Path> = shown.iter().map(|e| e.path()).collect();
    let clean = |kind: &String| {
        !files
            .iter()
            .any(|f| f.starts_with(dir.join(kind)) || is_shared(f))
    };
    for kind in kinds
        .iter()
        .filter(|k| chosen(&dir.join(k)))
        .filter(|k| clean(k))
    {
        println!("ok  {kind}");
    }
    if shown.is_empty() {
        anyhow::bail!("templates check failed: other kinds have errors (run without --kind)");
    }
    let (n, m) = (shown.len(), files.len());
    anyhow::bail!(
        "templates check failed: {n} error{} in {m} file{} under {}",
        plural(n),
        plural(m),
        dir.display()
    )
}

/// The kinds passed: one line each, then the revision.
fn passed(templates: &Templates, only: Option<&str>) {
    let kinds: Vec<String> = templates
        .kinds()
        .into_iter()
        .filter(|k| only.is_none_or(|o| o == k))
        .collect();
    for kind in &kinds {
        println!("ok  {kind}");
    }
    let n = kinds.len();
    println!(
        "{n} kind{} checked: every template renders its sample.json in every locale; revision {}",
        plural(n),
        templates.revision()
    );
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The kind folders of a template directory, sorted, as far as it can be read.
fn kind_folders(dir: &Path) -> Vec<String> {
    let mut kinds: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.') && n != "layouts" && n != "partials")
        .collect();
    kinds.sort();
    kinds
}

/// Refuses a kind the directory has no folder for, naming those it has.
fn known_kind(kind: &str, kinds: &[String]) -> anyhow::Result<()> {
    if kinds.iter().any(|k| k == kind) {
        return Ok(());
    }
    anyhow::bail!(
        "no template for kind {kind:?}; the kinds are: {}",
        kinds.join(", ")
    )
}

fn preview(a: &PreviewArgs) -> anyhow::Result<()> {
    let (_, templates) = load_templates(&a.templates)?;
    known_kind(&a.kind, &templates.kinds())?;
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
        send_at: None,
        expires_at: None,
    };
    let job = job.validate()?;
    let domain = match &a.message_id_domain {
        Some(d) => d.clone(),
        None => a.from.email.domain().to_string(),
    };
    let message = crate::smtp::build_message(&a.from, &domain, &job, rendered)?;
    Ok(String::from_utf8_lossy(&message.formatted()).into_owned())
}
