//! The console of a test: the real `mailroom serve` or `mailroom run` binary with a token, a
//! copy of the shipped templates it may edit, and logins from a browser or plain HTTP.

use std::process::Stdio;

use mailroom_test_kit::free_port;
use mailroom_test_kit::waits::eventually;
use tokio::process::{Child, Command};

use super::app::TestApp;
use super::browser::Browser;
use super::processes::test_log_or;
use super::templates::editable_templates;

/// The API token of the console's processes.
pub const CONSOLE_TOKEN: &str = "console-token-3b7d9e";

/// A console served by a real process, stopped (SIGKILL) when dropped.
pub struct ConsoleServer {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// The template directory the console edits.
    pub templates: tempfile::TempDir,
    _process: Child,
}

impl TestApp {
    /// `mailroom serve --templates <a copy>` with [`CONSOLE_TOKEN`], once it answers.
    pub async fn start_console_serve(&self) -> ConsoleServer {
        self.start_console_serve_with(Some(CONSOLE_TOKEN)).await
    }

    /// [`TestApp::start_console_serve`] with this token, or none (loopback only then).
    pub async fn start_console_serve_with(&self, token: Option<&str>) -> ConsoleServer {
        let templates = editable_templates();
        let port = free_port();
        let mut extra = vec!["--templates", templates.path().to_str().unwrap()];
        extra.extend(token.map(|t| ["--api-token", t]).into_iter().flatten());
        let process = self.spawn_serve_process(&format!("127.0.0.1:{port}"), &extra);
        ConsoleServer::ready(port, templates, process).await
    }

    /// [`TestApp::start_console_serve`] with the broker at `amqp_url` (one that is down, say).
    pub async fn start_console_serve_on(&self, amqp_url: &str) -> ConsoleServer {
        let templates = editable_templates();
        let port = free_port();
        let extra = [
            "--templates",
            templates.path().to_str().unwrap(),
            "--api-token",
            CONSOLE_TOKEN,
        ];
        let process = self.spawn_serve_process_on(amqp_url, &format!("127.0.0.1:{port}"), &extra);
        ConsoleServer::ready(port, templates, process).await
    }

    /// `mailroom run` (relay, worker and API; the worker sends to this test's SMTP recorder)
    /// with a copy of the templates and [`CONSOLE_TOKEN`], once it answers.
    pub async fn start_console_run(&self) -> ConsoleServer {
        let templates = editable_templates();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let extra = [
            "--templates",
            templates.path().to_str().unwrap(),
            "--http-addr",
            &addr,
            "--api-token",
            CONSOLE_TOKEN,
        ];
        let process = self.spawn_run_process(&extra);
        ConsoleServer::ready(port, templates, process).await
    }
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_mailroom"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("MAILROOM_API_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(test_log_or(Stdio::null()))
        .kill_on_drop(true)
        .spawn()
        .expect("start mailroom")
}

impl ConsoleServer {
    async fn ready(port: u16, templates: tempfile::TempDir, process: Child) -> ConsoleServer {
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        eventually("the console's process to answer /healthz", || async {
            let r = client.get(format!("{base}/healthz")).send().await.ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        ConsoleServer {
            base,
            templates,
            _process: process,
        }
    }

    /// `mailroom templates preview --serve` on `dir` (the designer's page), once it answers.
    pub async fn start_designer(kind: &str) -> ConsoleServer {
        let templates = editable_templates();
        let port = free_port();
        let args = [
            "templates",
            "preview",
            kind,
            "--templates",
            templates.path().to_str().unwrap(),
            "--serve",
            "--addr",
            &format!("127.0.0.1:{port}"),
        ];
        let process = spawn(&args);
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        eventually("the preview server to answer", || async {
            let r = client
                .get(format!("{base}/console/templates"))
                .send()
                .await
                .ok()?;
            r.status().is_success().then_some(())
        })
        .await;
        ConsoleServer {
            base,
            templates,
            _process: process,
        }
    }

    /// Opens `path` (e.g. `/console/templates`) of this console in `browser`.
    pub async fn open(&self, browser: &Browser, path: &str) {
        browser.goto(&format!("{}{path}", self.base)).await;
    }

    /// The bytes of a template file, e.g. `welcome/subject.hbs`.
    pub fn file(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.templates.path().join(name)).unwrap()
    }

    /// Logs `browser` in with `token` as `name`; the page it lands on.
    pub async fn log_in(&self, browser: &Browser, token: &str, name: &str) -> String {
        browser.goto(&format!("{}/console/login", self.base)).await;
        browser.fill("#token", token).await;
        browser.fill("#name", name).await;
        browser.click("#login").await;
        eventually("the login to be answered", || async {
            let url = browser.url().await;
            let answered = !url.ends_with("/console/login") || browser.has("#login-error").await;
            answered.then_some(url)
        })
        .await
    }

    /// A logged-in session over plain HTTP: its cookie header and CSRF token.
    pub async fn http_session(&self) -> HttpSession {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let login = client
            .get(format!("{}/console/login", self.base))
            .send()
            .await
            .unwrap();
        let pre = cookie_of(&login);
        let csrf = field(&login.text().await.unwrap(), "csrf");
        let form = [
            ("csrf", csrf.as_str()),
            ("token", CONSOLE_TOKEN),
            ("name", "curl"),
        ];
        let answer = client
            .post(format!("{}/console/login", self.base))
            .header("cookie", &pre)
            .header("content-type", FORM)
            .body(form_body(&form))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 303, "login over HTTP");
        let cookie = cookie_of(&answer);
        let page = client
            .get(format!("{}/console/templates/welcome/default", self.base))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        let html = page.text().await.unwrap();
        HttpSession {
            csrf: field(&html, "csrf"),
            base_hash: field(&html, "base"),
            cookie,
            client,
        }
    }
}

/// A console session held by a plain HTTP client.
pub struct HttpSession {
    pub client: reqwest::Client,
    /// `mailroom_console=…`, for a `Cookie` header.
    pub cookie: String,
    pub csrf: String,
    /// The editor's `base` field for welcome in the default locale.
    pub base_hash: String,
}

fn cookie_of(response: &reqwest::Response) -> String {
    let set = response
        .headers()
        .get("set-cookie")
        .expect("a Set-Cookie header")
        .to_str()
        .unwrap();
    set.split(';').next().unwrap().to_owned()
}

/// The value of the form field `name` in `html`.
fn field(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let at = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no field {name} in {html}"))
        + marker.len();
    html[at..].split('"').next().unwrap().to_owned()
}

/// The content type of an HTML form's POST.
pub const FORM: &str = "application/x-www-form-urlencoded";

/// `pairs` as an HTML form's POST body.
pub fn form_body(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}
