//! Every job findable, with its timeline: the data behind the console's Jobs page,
//! `GET /v1/jobs…` and `mailroom jobs`.
//!
//! [`search`] finds jobs by id (exact or prefix), recipient, kind, state and creation time,
//! newest first, a page at a time ([`Page::next_cursor`]). A job is found once its outbox row
//! is written (states `pending`, `published`, `parked`) or, published straight to the broker,
//! once a worker claimed it (the ledger's states). The recipient is the first `to` address,
//! normalised: kept by the claim, and generated from the payload in the outbox, so a job still
//! waiting there is found by recipient too.
//!
//! [`timeline`] tells one job's story: created, published, each attempt (claimed when, ended
//! when, with its SMTP reply or error), a replay, and `sent` or `dead`. Failed attempts come
//! from the ledger's `history` column, which the UPDATE recording a failure appends to (newest
//! [`HISTORY_KEPT`] kept); the last attempt from the row itself.
//!
//! Addresses (the recipient, and any quoted in replies and errors) are masked unless revealed.

mod query;
mod timeline;

pub use query::{FilterError, Found, Page, STATES, Search, SearchError, search};
pub use timeline::{Event, Timeline, timeline};

/// How many failed attempts a job's `history` keeps (the SQL of both engines says 20 too):
/// a job retried more often shows its newest 20 and its attempt count.
pub const HISTORY_KEPT: usize = 20;
