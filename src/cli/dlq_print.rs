//! How `mailroom dlq` prints: one aligned line per dead letter for humans, pretty JSON for
//! scripts. Rows are built as text first so columns can be sized to their widest cell.

use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::dlq::{Detail, Group, Page, Preview, Report, Row, Summary};

/// Longest reason shown in a listing; `show` has the whole text.
const MAX_REASON: usize = 160;

pub(super) fn json(value: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

pub(super) fn page(page: &Page) -> anyhow::Result<()> {
    if page.letters.is_empty() {
        eprintln!("no dead letters match");
        return Ok(());
    }
    let mut rows = vec![row(&[
        "ID",
        "JOB ID",
        "KIND",
        "TO",
        "CLASS",
        "ATT",
        "FAILED AT",
        "STATE",
        "REASON",
    ])];
    for e in &page.letters {
        rows.push(vec![
            e.id.to_string(),
            e.job_id.clone(),
            e.kind.clone(),
            e.recipient.clone(),
            e.class.clone(),
            e.attempts.map_or("-".into(), |a| a.to_string()),
            e.failed_at
                .map_or("-".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string()),
            e.state.clone(),
            one_line(&e.reason, MAX_REASON),
        ]);
    }
    print!("{}", aligned(&rows));
    if let Some(next) = &page.next {
        eprintln!("more: --cursor {next}");
    }
    Ok(())
}

pub(super) fn groups(groups: &[Group]) -> anyhow::Result<()> {
    if groups.is_empty() {
        eprintln!("no dead letters match");
        return Ok(());
    }
    let mut rows = vec![row(&[
        "COUNT",
        "CLASS",
        "FIRST SEEN",
        "LAST SEEN",
        "GROUP",
        "REASON",
    ])];
    for g in groups {
        rows.push(vec![
            g.count.to_string(),
            g.class.clone(),
            g.first_seen.format("%Y-%m-%d %H:%M:%S").to_string(),
            g.last_seen.format("%Y-%m-%d %H:%M:%S").to_string(),
            g.group.clone(),
            one_line(&g.reason, MAX_REASON),
        ]);
    }
    print!("{}", aligned(&rows));
    Ok(())
}

pub(super) fn summary(s: &Summary) -> anyhow::Result<()> {
    println!("{} dead letters", s.total);
    if s.total == 0 {
        return Ok(());
    }
    println!("\nby kind:");
    let rows: Vec<_> = s
        .by_kind
        .iter()
        .map(|(k, n)| vec![format!("  {n}"), k.clone()])
        .collect();
    print!("{}", aligned(&rows));
    println!("\nby reason:");
    let rows: Vec<_> = s
        .by_reason
        .iter()
        .map(|r| {
            vec![
                format!("  {}", r.count),
                r.class.clone(),
                one_line(&r.reason, MAX_REASON),
            ]
        })
        .collect();
    print!("{}", aligned(&rows));
    Ok(())
}

pub(super) fn details(details: &[Detail]) -> anyhow::Result<()> {
    for (i, d) in details.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{}", detail(d)?);
    }
    Ok(())
}

fn detail(d: &Detail) -> anyhow::Result<String> {
    let mut out = String::new();
    entry_lines(&mut out, d)?;
    header_lines(&mut out, d)?;
    ledger_lines(&mut out, d.notification.as_ref())?;
    writeln!(out, "job:\n{}", serde_json::to_string_pretty(&d.job)?)?;
    Ok(out)
}

/// Who the dead letter was for, and why it died.
fn entry_lines(out: &mut String, d: &Detail) -> fmt::Result {
    let e = &d.entry;
    writeln!(out, "id           {}", e.id)?;
    writeln!(out, "job id       {}", e.job_id)?;
    writeln!(out, "kind         {}", e.kind)?;
    writeln!(out, "state        {}", e.state)?;
    writeln!(out, "to           {}", e.recipient)?;
    writeln!(out, "class        {}", e.class)?;
    writeln!(out, "reason       {}", e.reason)?;
    writeln!(out, "group        {}", e.group)?;
    if let Some(at) = e.replayed_at {
        let by = e.replayed_by.as_deref().unwrap_or("?");
        writeln!(out, "replayed     {} by {by}", at.to_rfc3339())?;
    }
    if let Some(result) = &e.replay_result {
        writeln!(out, "replay       {result}")?;
    }
    if let Some(at) = e.purged_at {
        let by = e.purged_by.as_deref().unwrap_or("?");
        writeln!(out, "purged       {} by {by}", at.to_rfc3339())?;
    }
    if e.truncated {
        writeln!(
            out,
            "body         only the first bytes of {} kept (oversize)",
            e.body_size
        )?;
    }
    writeln!(out, "routing key  {}", d.routing_key)
}

/// Every header, `x-death` parsed, one line per death.
fn header_lines(out: &mut String, d: &Detail) -> fmt::Result {
    writeln!(out, "headers:")?;
    for (name, value) in d.headers.iter().filter(|(n, _)| n.as_str() != "x-death") {
        writeln!(out, "  {name}: {}", compact(value))?;
    }
    for death in &d.deaths {
        let at = death.time.map_or("?".into(), |t| t.to_rfc3339());
        writeln!(
            out,
            "  x-death: {} in queue {} (exchange {:?}, routing keys {:?}), {}×, last at {at}",
            death.reason, death.queue, death.exchange, death.routing_keys, death.count
        )?;
    }
    Ok(())
}

/// The job's ledger row, or that it has none.
fn ledger_lines(out: &mut String, row: Option<&Row>) -> fmt::Result {
    let Some(r) = row else {
        return writeln!(out, "sent_notifications: no row (never claimed)");
    };
    writeln!(out, "sent_notifications:")?;
    writeln!(out, "  status      {} (attempts: {})", r.status, r.attempts)?;
    writeln!(out, "  message id  {}", r.message_id)?;
    let none = || "-".to_string();
    writeln!(
        out,
        "  smtp reply  {}",
        r.smtp_reply.clone().unwrap_or_else(none)
    )?;
    writeln!(
        out,
        "  last error  {}",
        r.last_error.clone().unwrap_or_else(none)
    )?;
    writeln!(out, "  created     {}", r.created_at.to_rfc3339())?;
    writeln!(out, "  updated     {}", r.updated_at.to_rfc3339())
}

pub(super) fn previews(previews: &[Preview]) -> anyhow::Result<()> {
    let mut rows = vec![row(&["ID", "JOB ID", "KIND", "TO", "WOULD SEND"])];
    let (mut send, mut fail, mut sent) = (0, 0, 0);
    for p in previews {
        let outcome = match (&p.error, p.status.as_deref(), &p.subject) {
            (Some(err), _, _) => {
                fail += 1;
                format!("nothing, fails again: {}", one_line(err, MAX_REASON))
            }
            (None, Some("sent"), _) => {
                sent += 1;
                "nothing: already sent".to_string()
            }
            (None, _, subject) => {
                send += 1;
                format!("subject {:?}", subject.as_deref().unwrap_or_default())
            }
        };
        rows.push(vec![
            p.id.to_string(),
            p.job_id.clone(),
            p.kind.clone(),
            p.recipients.join(", "),
            outcome,
        ]);
    }
    print!("{}", aligned(&rows));
    println!(
        "dry run: {} selected; {send} would be sent, {fail} would fail again, {sent} already sent; nothing changed",
        previews.len()
    );
    Ok(())
}

pub(super) fn report(r: &Report) {
    let mut line = format!(
        "examined {}: moved {}, purged {}, deleted {}",
        r.examined, r.moved, r.purged, r.deleted
    );
    let skipped: usize = r.skipped.values().sum();
    if skipped > 0 {
        let why: Vec<String> = r.skipped.iter().map(|(w, n)| format!("{n} {w}")).collect();
        let _ = write!(line, ", skipped {skipped} ({})", why.join("; "));
    }
    if r.claimed_elsewhere > 0 {
        let n = r.claimed_elsewhere;
        let _ = write!(line, ", {n} left to another replay running now");
    }
    println!("{line}");
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Pads every column but the last to its widest cell.
fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                out.push_str(cell);
            } else {
                let pad = widths[c] - cell.chars().count();
                let _ = write!(out, "{cell}{}  ", " ".repeat(pad));
            }
        }
        out.push('\n');
    }
    out
}

/// Newlines folded, clipped to `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() <= max {
        return flat;
    }
    let clipped: String = flat.chars().take(max).collect();
    format!("{clipped}…")
}

fn compact(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
