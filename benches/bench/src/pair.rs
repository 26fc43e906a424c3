//! One email's ledger writes as the worker makes them, for the measurements that time or cost
//! them (the raw database limit, `ledger_cost`, `ledger_scale`): the claim of a new job, then
//! the record of its `sent`, through a [`Ledger`] (direct or grouped, as the worker's).

use std::time::{Duration, Instant};

use mailroom::db::group::Ledger;
use mailroom::db::{Claim, ClaimRequest, LedgerStatus, Record};

/// The lease of the bench's claims: longer than any measurement waits.
pub const LEASE: Duration = Duration::from_secs(120);

/// The recipient of the bench's claims, looked up in the suppression list with each claim as
/// the worker's are.
static SCREEN: std::sync::LazyLock<[String; 1]> =
    std::sync::LazyLock::new(|| ["someone@example.com".to_owned()]);

/// The claim the worker asks for a new delivery of `(job_id, kind)`.
pub fn claim_request<'a>(job_id: &'a str, kind: &'a str, message_id: &'a str) -> ClaimRequest<'a> {
    ClaimRequest {
        job_id,
        kind,
        message_id,
        token: uuid::Uuid::new_v4(),
        lease: LEASE,
        resend_uncertain: true,
        replay: false,
        recipient: Some("someone@example.com".into()),
        screen: SCREEN.as_slice(),
    }
}

/// Claims a new job and records it sent; returns how long the claim and the record took.
pub async fn claim_and_record(
    ledger: &Ledger,
    job_id: &str,
    kind: &str,
) -> anyhow::Result<(Duration, Duration)> {
    let message_id = mailroom::smtp::message_id(job_id, kind, "mailroom.bench");
    let t = Instant::now();
    let claim = ledger
        .claim(&claim_request(job_id, kind, &message_id))
        .await?;
    let claimed = t.elapsed();
    let Claim::Claimed { token, .. } = claim else {
        anyhow::bail!("the claim of a new job was refused: {claim:?}");
    };
    let record = Record {
        job_id,
        kind,
        token: Some(token),
        status: LedgerStatus::Sent,
        smtp_reply: Some("250 2.0.0 Ok: queued as 4XYZ"),
        error: None,
        class: None,
    };
    let t = Instant::now();
    let recorded = ledger.record(&record, None).await?;
    anyhow::ensure!(recorded, "the record of a held claim was refused");
    Ok((claimed, t.elapsed()))
}
