//! A headless Chromium driven over WebDriver (W3C, through Debian's `chromedriver`), with the
//! few commands the console's tests use. Each [`Browser`] starts its own chromedriver on a free
//! port with a fresh profile; both go away when it is dropped. Waits poll a condition until
//! [`PATIENCE`]: no sleeps.
//!
//! `CHROMEDRIVER` and `CHROMIUM` override `/usr/bin/chromedriver` and `/usr/bin/chromium`. A
//! machine without them fails these tests (scripts/services installs both).

use std::process::Stdio;

use mailroom_test_kit::free_port;
use mailroom_test_kit::waits::eventually;
use serde_json::{Value, json};
use tokio::process::{Child, Command};

/// The W3C key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// What to ask chromedriver for: headless Chromium at `binary` with the profile `profile`.
fn capabilities(screen: Screen, binary: &str, profile: &std::path::Path) -> Value {
    let mut options = json!({
        "binary": binary,
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--window-size=1280,900",
                 format!("--user-data-dir={}", profile.display())],
    });
    if let Screen::Phone = screen {
        options["mobileEmulation"] =
            json!({ "deviceMetrics": { "width": 390, "height": 844, "pixelRatio": 3.0 } });
    }
    json!({ "capabilities": { "alwaysMatch": {
        "browserName": "chrome", "goog:chromeOptions": options } } })
}

/// One browser session of one chromedriver; dropping it quits Chromium, then the driver.
pub struct Browser {
    client: reqwest::Client,
    session: String,
    port: u16,
    _driver: Child,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    /// `DELETE /session/{id}` over a plain socket (Drop cannot await): chromedriver quits
    /// Chromium before it answers. Killing the driver alone would orphan the browser. The answer
    /// is read up to its `Content-Length`: chromedriver says `Connection: close` but keeps the
    /// socket open, so reading to the end waited for the read timeout (20 s per browser).
    fn drop(&mut self) {
        use std::io::{Read, Write};
        let path = self
            .session
            .split_once(&format!(":{}", self.port))
            .map_or("", |(_, p)| p);
        let Ok(mut socket) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return;
        };
        let _ = socket.set_read_timeout(Some(std::time::Duration::from_secs(20)));
        let request =
            format!("DELETE {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        if socket.write_all(request.as_bytes()).is_ok() {
            let mut answer = Vec::new();
            let mut chunk = [0; 4096];
            while let Ok(n @ 1..) = socket.read(&mut chunk) {
                answer.extend_from_slice(&chunk[..n]);
                if http_answer_complete(&answer) {
                    break;
                }
            }
        }
    }
}

/// Whether `answer` holds an HTTP answer's head and as many body bytes as its `Content-Length`
/// says.
fn http_answer_complete(answer: &[u8]) -> bool {
    let text = String::from_utf8_lossy(answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse::<usize>().ok())
            .flatten()
    });
    length.is_none_or(|length| body.len() >= length)
}

/// The screen a browser emulates.
#[derive(Clone, Copy)]
pub enum Screen {
    /// A 1280 × 900 window.
    Desktop,
    /// A 390 px wide phone (Chromium's mobile emulation).
    Phone,
}

impl Browser {
    pub async fn start(screen: Screen) -> Browser {
        let driver_bin = std::env::var("CHROMEDRIVER").unwrap_or("/usr/bin/chromedriver".into());
        let chromium = std::env::var("CHROMIUM").unwrap_or("/usr/bin/chromium".into());
        let port = free_port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("start {driver_bin} (scripts/services installs chromium-driver): {e}")
            });
        let client = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        eventually("chromedriver to answer", || async {
            let ok = client.get(format!("{base}/status")).send().await.ok()?;
            ok.status().is_success().then_some(())
        })
        .await;
        let profile = tempfile::tempdir().unwrap();
        let caps = capabilities(screen, &chromium, profile.path());
        let created: Value = client
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = created["value"]["sessionId"].as_str().unwrap_or_else(|| {
            panic!("chromedriver made no session (is {chromium} there?): {created}")
        });
        Browser {
            client,
            session: format!("{base}/session/{session}"),
            port,
            _driver: driver,
            _profile: profile,
        }
    }

    async fn command(&self, method: reqwest::Method, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.session);
        let request = self.client.request(method, url);
        let request = if body.is_null() {
            request
        } else {
            request.json(&body)
        };
        let answer: Value = request.send().await.unwrap().json().await.unwrap();
        answer["value"].clone()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        self.command(reqwest::Method::POST, path, body).await
    }

    /// A command that must succeed: a WebDriver error (a click intercepted, say) fails the test.
    async fn act(&self, path: &str, body: Value) -> Value {
        let value = self.post(path, body).await;
        if let Some(error) = value.get("error") {
            panic!("WebDriver {path}: {error}: {}", value["message"]);
        }
        value
    }

    /// Opens `url` and waits for the page to load.
    pub async fn goto(&self, url: &str) {
        self.act("/url", json!({ "url": url })).await;
    }

    /// The current URL.
    pub async fn url(&self) -> String {
        let v = self
            .command(reqwest::Method::GET, "/url", Value::Null)
            .await;
        v.as_str().unwrap_or_default().to_owned()
    }

    /// The element `css` selects, once there is one.
    pub async fn find(&self, css: &str) -> String {
        eventually(&format!("an element {css}"), || async {
            let v = self
                .post("/element", json!({ "using": "css selector", "value": css }))
                .await;
            v[ELEMENT].as_str().map(str::to_owned)
        })
        .await
    }

    /// Whether an element `css` selects is there now.
    pub async fn has(&self, css: &str) -> bool {
        let v = self
            .post(
                "/elements",
                json!({ "using": "css selector", "value": css }),
            )
            .await;
        v.as_array().is_some_and(|a| !a.is_empty())
    }

    /// Replaces the value of the field `css` with `text`, as typing would.
    pub async fn fill(&self, css: &str, text: &str) {
        let id = self.find(css).await;
        self.post(&format!("/element/{id}/clear"), json!({})).await;
        self.post(&format!("/element/{id}/value"), json!({ "text": text }))
            .await;
    }

    pub async fn click(&self, css: &str) {
        let id = self.find(css).await;
        self.act(&format!("/element/{id}/click"), json!({})).await;
    }

    /// The visible text of the element `css` selects ("" while there is none).
    pub async fn text(&self, css: &str) -> String {
        let v = self
            .post(
                "/elements",
                json!({ "using": "css selector", "value": css }),
            )
            .await;
        let Some(id) = v.get(0).and_then(|e| e[ELEMENT].as_str()) else {
            return String::new();
        };
        let text = self
            .command(
                reqwest::Method::GET,
                &format!("/element/{id}/text"),
                Value::Null,
            )
            .await;
        text.as_str().unwrap_or_default().to_owned()
    }

    /// Waits until the text of `css` contains `wanted`; returns it.
    pub async fn wait_for_text(&self, css: &str, wanted: &str) -> String {
        eventually(&format!("{css} to show {wanted:?}"), || async {
            let text = self.text(css).await;
            text.contains(wanted).then_some(text)
        })
        .await
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page; its return value.
    pub async fn script(&self, script: &str, args: Value) -> Value {
        self.post("/execute/sync", json!({ "script": script, "args": args }))
            .await
    }

    /// The absolute URL a property of the element `css` holds (an iframe's `src`).
    pub async fn property(&self, css: &str, name: &str) -> String {
        let id = self.find(css).await;
        let path = format!("/element/{id}/property/{name}");
        let v = self.command(reqwest::Method::GET, &path, Value::Null).await;
        v.as_str().unwrap_or_default().to_owned()
    }
}
