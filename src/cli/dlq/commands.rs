//! The `mailroom dlq` subcommands, each one call into [`crate::dlq`] and a print.

use anyhow::Context;

use super::super::dlq_print as print;
use super::{GroupsArgs, IngestArgs, ListArgs, PurgeArgs, ReplayArgs, ShowArgs};
use crate::broker::Topology;
use crate::db::Database;
use crate::dlq::seal;
use crate::dlq::{Cursor, DeadLetters, Detail, Replayer, Report, Selection, default_actor, ingest};

/// The table of `url`, on a small pool; a database that is down or refuses the login is told
/// in one line at once.
async fn open(url: &crate::config::SecretUrl) -> anyhow::Result<DeadLetters> {
    let db = Database::connect(url, 2, crate::db::OnAcquire::Ping).await?;
    Ok(DeadLetters::new(db))
}

/// Runs `f` on the table, then closes the pool.
async fn with_table<T>(
    dlq: DeadLetters,
    f: impl AsyncFnOnce(&DeadLetters) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let result = f(&dlq).await;
    dlq.database().close().await;
    result
}

pub(super) async fn list(a: &ListArgs) -> anyhow::Result<()> {
    let filter = a.filter.filter();
    let cursor = a
        .cursor
        .as_deref()
        .map(str::parse::<Cursor>)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--cursor: {e}"))?;
    let dlq = open(&a.db.database_url).await?;
    if a.summary {
        let summary = with_table(dlq, async |d| d.summary(&filter).await).await?;
        return if a.json {
            print::json(&summary)
        } else {
            print::summary(&summary)
        };
    }
    let page = with_table(dlq, async |d| d.list(&filter, cursor, a.limit).await).await?;
    if a.json {
        print::json(&page)
    } else {
        print::page(&page)
    }
}

pub(super) async fn groups(a: &GroupsArgs) -> anyhow::Result<()> {
    let filter = a.filter.filter();
    let dlq = open(&a.db.database_url).await?;
    let groups = with_table(dlq, async |d| d.groups(&filter).await).await?;
    if a.json {
        print::json(&groups)
    } else {
        print::groups(&groups)
    }
}

pub(super) async fn show(a: &ShowArgs) -> anyhow::Result<()> {
    let dlq = open(&a.db.database_url).await?;
    let mut details = with_table(dlq, async |d| d.show(&a.id).await).await?;
    if details.is_empty() {
        anyhow::bail!("no dead letter with row id or job id {:?}", a.id);
    }
    if !a.reveal {
        details = details.into_iter().map(Detail::masked).collect();
    }
    if a.json {
        print::json(&details)
    } else {
        print::details(&details)
    }
}

pub(super) async fn replay(a: &ReplayArgs) -> anyhow::Result<()> {
    let selection = Selection::one_of(a.select.args())?;
    let Some(urls) = &a.amqp_url else {
        anyhow::bail!("replaying needs AMQP_URL (or --amqp-url): the broker to publish to");
    };
    let dlq = open(&a.db.database_url).await?;
    let by = a.by.clone().unwrap_or_else(default_actor);
    let topology = Topology::new(&a.namespace, a.retry_delays.0.clone());
    let report = with_table(dlq, async |d| {
        let key = seal::resolve(a.replay_key.as_ref(), d.database()).await?;
        let mut replayer = Replayer::connect(urls, &topology, "mailroom dlq replay", key).await?;
        let report = d.replay(&selection, &mut replayer, &by).await;
        replayer.close().await;
        report
    })
    .await?;
    finish(&selection, &report, a.json)
}

pub(super) async fn dry_run(a: &ReplayArgs) -> anyhow::Result<()> {
    let selection = Selection::one_of(a.select.args())?;
    let (_, templates) = crate::startup::load_templates(&a.templates)?;
    let dlq = open(&a.db.database_url).await?;
    let previews = with_table(dlq, async |d| d.dry_run(&selection, &templates).await).await?;
    if a.json {
        print::json(&previews)
    } else {
        print::previews(&previews)
    }
}

pub(super) async fn purge(a: &PurgeArgs) -> anyhow::Result<()> {
    let selection = Selection::one_of(a.select.args())?;
    if !a.yes {
        let what = if a.delete { "deletes" } else { "marks purged" };
        anyhow::bail!("purge {what} the selected dead letters; add --yes to confirm");
    }
    let by = a.by.clone().unwrap_or_else(default_actor);
    let dlq = open(&a.db.database_url).await?;
    let report = with_table(dlq, async |d| d.purge(&selection, &by, a.delete).await).await?;
    finish(&selection, &report, a.json)
}

pub(super) async fn ingest(a: &IngestArgs) -> anyhow::Result<()> {
    let dlq = open(&a.db.database_url).await?;
    let broker = a.broker.config();
    let (drained, expired) = with_table(dlq, async |d| {
        let drained = ingest::drain(&broker.amqp_url, &broker.topology(), d.database()).await?;
        let expired = d.expire(a.retention.dead_letter_retention).await?;
        anyhow::Ok((drained, expired))
    })
    .await
    .context("ingesting the dead-letter queue")?;
    if a.json {
        print::json(&serde_json::json!({
            "ingested": drained.ingested,
            "duplicates": drained.duplicates,
            "expired": expired,
        }))
    } else {
        println!(
            "ingested {} dead letters ({} already stored); deleted {expired} past the retention",
            drained.ingested, drained.duplicates
        );
        Ok(())
    }
}

/// Prints the counts; an early stop, a row left dead or an unknown id exits ≠ 0.
fn finish(selection: &Selection, report: &Report, json: bool) -> anyhow::Result<()> {
    if json {
        print::json(report)?;
    } else {
        print::report(report);
    }
    if let Some(why) = &report.interrupted {
        anyhow::bail!("stopped early: {why}; the rows not reached stay dead");
    }
    let left = report.selected_left();
    if left > 0 {
        anyhow::bail!("{left} selected dead letters stay dead (see the counts above)");
    }
    if report.found_none_of(selection) {
        anyhow::bail!("no dead letter with those ids is dead");
    }
    Ok(())
}
