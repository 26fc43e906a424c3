//! The operator's console: server-rendered HTML under `/console`, served by `mailroom serve`
//! and `mailroom run` beside the API, and by `mailroom templates preview --serve` for template
//! designers (docs/OPERATING.md, "Console").
//!
//! HTML comes from `maud`; htmx (vendored in `assets/vendor/htmx`, embedded in the binary)
//! swaps server-rendered fragments for the live preview. Nothing is fetched from elsewhere: the
//! CSP is `default-src 'self'` with no inline script, and htmx's configuration comes from a
//! meta tag so it injects no style element.
//!
//! - `auth` and `session`: the session cookie (HMAC-signed with a key derived from the API token), the login
//!   form, the CSRF token every POST carries, and the guard in front of every page.
//! - `layout`: the page around each section, its navigation and the security headers.
//! - `assets`: htmx and the stylesheet, at content-hashed URLs with a year-long cache.
//! - `dead_letters`: the failure groups and letters, one letter with its email rendered now,
//!   and replay or purge after a confirmation that states counts.
//! - `overview`: the pipeline at a glance, refreshed by htmx; `jobs`: the job search;
//!   `job`: one job's timeline and its email as it renders now.
//! - `templates`: the list of kinds × locales with their check status, and the editor;
//!   `preview`: a draft rendered in a scratch copy of the directory; `save`: validation, atomic
//!   writes and the revision history (`history` renders it with diffs); `files`: reading the
//!   template directory; `live`: the page that follows the files as a designer edits them.
//!
//! Adding a page: a module with a handler that returns [`layout::page`], and one `.route` in
//! [`router`].

mod assets;
mod auth;
mod dead_letters;
mod files;
mod history;
mod job;
mod jobs;
mod layout;
mod live;
mod overview;
mod preview;
mod save;
mod session;
mod suppressions;
mod templates;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::{
    Router, middleware,
    routing::{get, post},
};

use crate::db::Database;
use crate::render::LiveTemplates;

/// What the console's handlers share.
pub struct Console {
    /// The revision history and jobs' data for previews; `None` for a designer's preview.
    db: Option<Database>,
    /// The directory the editor writes to.
    dir: Option<PathBuf>,
    /// The set this process sends with, told to reload after a save (`mailroom run`).
    live: Option<Arc<LiveTemplates>>,
    keys: session::Keys,
    previews: preview::Cache,
    /// The broker a replay publishes to; `None`: the Dead letters section cannot replay.
    replay: Option<dead_letters::ReplayTo>,
    /// The Overview's queue depths and namespace ([`Console::with_pipeline`]).
    pipeline: Option<overview::Pipeline>,
    /// Only the Templates section (`templates preview --serve`).
    designer: bool,
}

impl Console {
    /// The console of `mailroom serve` and `mailroom run`: `templates` is the set the process
    /// follows (the editor works on its directory); `token` is `MAILROOM_API_TOKEN`.
    pub fn new(
        db: Option<Database>,
        templates: Option<Arc<LiveTemplates>>,
        token: Option<&str>,
    ) -> Console {
        Console {
            db,
            dir: templates
                .as_ref()
                .and_then(|t| t.dir().map(Path::to_path_buf)),
            live: templates,
            keys: session::Keys::new(token),
            previews: preview::Cache::default(),
            replay: None,
            pipeline: None,
            designer: false,
        }
    }

    /// The same console, replaying dead letters to `topology`'s exchange at `amqp`, each copy
    /// sealed with `replay_key` (`None`: the key kept in the database).
    pub fn replaying_to(
        mut self,
        amqp: crate::config::UrlList,
        topology: crate::broker::Topology,
        replay_key: Option<crate::dlq::seal::ReplayKey>,
    ) -> Console {
        self.replay = Some(dead_letters::ReplayTo {
            amqp,
            topology,
            replay_key,
        });
        self
    }

    /// The console of `mailroom templates preview --serve`: the Templates section on `dir`,
    /// no database, loopback only (no token).
    pub fn designer(dir: PathBuf) -> Console {
        Console {
            db: None,
            dir: Some(dir),
            live: None,
            keys: session::Keys::new(None),
            previews: preview::Cache::default(),
            replay: None,
            pipeline: None,
            designer: true,
        }
    }
}

/// The console's routes, all under `/console`.
pub fn router(console: Console) -> Router {
    let console = Arc::new(console);
    let guarded = Router::new()
        .route("/console", get(overview::page))
        .route("/console/overview", get(overview::refresh))
        .route("/console/dead-letters", get(dead_letters::list))
        .route("/console/dead-letters/confirm", get(dead_letters::confirm))
        .route("/console/dead-letters/replay", post(dead_letters::replay))
        .route("/console/dead-letters/purge", post(dead_letters::purge))
        .route("/console/dead-letters/{id}", get(dead_letters::letter))
        .route("/console/jobs", get(jobs::list))
        .route("/console/jobs/{job_id}/{kind}", get(job::page))
        .route("/console/suppressions", get(suppressions::list))
        .route("/console/suppressions/add", post(suppressions::add))
        .route("/console/suppressions/remove", post(suppressions::remove))
        .route("/console/templates", get(templates::list))
        .route("/console/templates/{kind}/{locale}", get(templates::editor))
        .route(
            "/console/templates/{kind}/{locale}/preview",
            post(preview::preview),
        )
        .route("/console/templates/{kind}/{locale}/save", post(save::save))
        .route(
            "/console/templates/{kind}/{locale}/history/{id}",
            get(history::diff),
        )
        .route("/console/templates/{kind}/{locale}/live", get(live::page))
        .route(
            "/console/templates/{kind}/{locale}/live/panel",
            get(live::panel),
        )
        .route("/console/logout", post(auth::logout))
        .route_layer(middleware::from_fn_with_state(console.clone(), auth::guard));
    Router::new()
        .route("/console/login", get(auth::login_form).post(auth::login))
        .route("/console/assets/{name}", get(assets::serve))
        .route("/console/preview/{id}", get(preview::document))
        .merge(guarded)
        .with_state(console)
        .layer(middleware::from_fn(layout::security_headers))
}

/// Serves the designer's console ([`Console::designer`] on `dir`) on `listener` until
/// `shutdown`; refuses anything but a loopback address, as there is no login.
pub async fn serve_designer(
    listener: tokio::net::TcpListener,
    dir: PathBuf,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() {
        anyhow::bail!(
            "refusing to serve the template preview on {addr}: it has no login; listen on 127.0.0.1"
        );
    }
    axum::serve(listener, router(Console::designer(dir)))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}
