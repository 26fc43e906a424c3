//! The suite's helpers, by concern: [`app`] (`TestApp`, one isolated world per test),
//! [`processes`] (workers and relays in-process or as real processes), [`database`] (the
//! suite's engine), [`broker`] (dead letters), [`cli`] (the built binary), [`api`] (the HTTP
//! API), [`console`] (the console's processes and logins) with [`browser`] (headless Chromium
//! over WebDriver), [`templates`] and [`fault_proxy`] (a TCP proxy that breaks connections); with what the
//! benchmark shares from `mailroom-test-kit` (tests/kit): the services' URLs, the SMTP recorder,
//! virtual hosts, free ports and polling. Test modules take everything from here
//! (`use crate::helpers::*`), never from each other.

mod api;
mod app;
mod broker;
mod browser;
mod cli;
mod console;
mod database;
mod fault_proxy;
mod processes;
mod templates;

pub use api::*;
pub use app::*;
pub use broker::*;
pub use browser::*;
pub use cli::*;
pub use console::*;
pub use database::*;
pub use fault_proxy::*;
pub use mailroom_test_kit::services::{amqp_url, mysql_url, postgres_url};
pub use mailroom_test_kit::smtp::SmtpServer;
pub use mailroom_test_kit::vhost::Vhost;
pub use mailroom_test_kit::waits::{PATIENCE, eventually, eventually_within};
pub use mailroom_test_kit::{ClosedPort, free_port};
pub use processes::*;
pub use templates::*;
