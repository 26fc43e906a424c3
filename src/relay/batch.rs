//! What the relay publishes for one claimed batch: each row checked by the one validation
//! ([`door::admit_stored`]) and turned into the bytes that were validated, or, for a row that
//! fails it (a producer that wrote raw SQL), a dead letter with the headers the worker uses
//! for class `invalid`. The batch is cut where its bytes would pass the byte bound; the rows
//! after the cut stay unpublished and are claimed by the next scan.

use lapin::BasicProperties;

use crate::broker::{self, Topology};
use crate::db::outbox::PendingRow;
use crate::door;

/// One message to publish for one row.
pub(super) struct Outgoing<'a> {
    pub row: PendingRow,
    pub exchange: &'a str,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
    /// Why the row was refused (then the message is its dead letter).
    pub refused: Option<String>,
}

/// The messages of a batch, and whether the byte bound cut it short.
pub(super) struct Plan<'a> {
    pub outgoing: Vec<Outgoing<'a>>,
    pub cut: bool,
}

/// Checks every row and keeps the longest prefix within `max_bytes` (at least one row).
pub(super) fn plan(rows: Vec<PendingRow>, topology: &Topology, max_bytes: usize) -> Plan<'_> {
    let mut outgoing: Vec<Outgoing> = rows.into_iter().map(|row| check(row, topology)).collect();
    let sizes: Vec<usize> = outgoing.iter().map(|o| o.body.len()).collect();
    let keep = within_bytes(&sizes, max_bytes);
    let cut = keep < outgoing.len();
    outgoing.truncate(keep);
    Plan { outgoing, cut }
}

/// How many of the first `sizes` fit in `max` bytes together; at least one, so a single row
/// larger than the bound still goes out (alone).
pub(super) fn within_bytes(sizes: &[usize], max: usize) -> usize {
    let mut total = 0usize;
    for (i, size) in sizes.iter().enumerate() {
        total = total.saturating_add(*size);
        if total > max && i > 0 {
            return i;
        }
    }
    sizes.len()
}

fn check(row: PendingRow, topology: &Topology) -> Outgoing<'_> {
    let verdict = door::admit_stored(&row.payload, None).and_then(|admitted| {
        let job = admitted.job();
        if job.job_id != row.job_id || job.kind != row.kind {
            let why = format!(
                "the payload's job_id/kind ({:?}, {:?}) differ from the row's columns",
                job.job_id, job.kind
            );
            return Err(crate::job::JobError::Malformed(why));
        }
        Ok(admitted.body)
    });
    match verdict {
        Ok(body) => Outgoing {
            properties: broker::job_properties(&row.job_id, &row.kind, 1),
            row,
            exchange: &topology.exchange,
            body,
            refused: None,
        },
        Err(e) => {
            let reason = format!("refused by the relay: {e}");
            Outgoing {
                body: row.payload.clone().into_bytes(),
                properties: dead_letter_properties(&row, &reason),
                row,
                exchange: &topology.dlx,
                refused: Some(reason),
            }
        }
    }
}

/// The properties of a dead letter of class `invalid`, as the worker writes them.
fn dead_letter_properties(row: &PendingRow, reason: &str) -> BasicProperties {
    broker::with_headers(
        &broker::job_properties(&row.job_id, &row.kind, 1),
        &broker::dead_letter_headers(reason, "invalid", 0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(payload: &str) -> PendingRow {
        PendingRow {
            id: 1,
            job_id: "j-1".into(),
            kind: "welcome".into(),
            payload: payload.into(),
            publish_attempts: 0,
        }
    }

    #[test]
    fn a_batch_is_cut_where_its_bytes_pass_the_bound_but_never_empty() {
        assert_eq!(within_bytes(&[40, 40, 40], 100), 2);
        assert_eq!(within_bytes(&[40, 60, 1], 100), 2);
        assert_eq!(
            within_bytes(&[500, 1], 100),
            1,
            "an oversized first row goes alone"
        );
        assert_eq!(within_bytes(&[10, 10], 100), 2);
        assert_eq!(within_bytes(&[], 100), 0);
    }

    #[test]
    fn a_valid_row_is_published_canonically_and_an_invalid_one_dead_lettered() {
        let topology = Topology::new("t", vec![]);
        let good = row(r#"{"kind": "welcome", "job_id": "j-1", "to": ["ada@example.com"]}"#);
        let bad = row(r#"{"job_id": "j-1", "kind": "welcome", "to": ["not an address"]}"#);
        let other = row(r#"{"job_id": "j-2", "kind": "welcome", "to": ["ada@example.com"]}"#);
        let plan = plan(vec![good, bad, other], &topology, usize::MAX);
        assert_eq!(plan.outgoing[0].exchange, topology.exchange);
        assert!(
            plan.outgoing[0]
                .body
                .starts_with(br#"{"job_id":"j-1","kind":"welcome""#)
        );
        assert_eq!(plan.outgoing[1].exchange, topology.dlx);
        assert!(
            plan.outgoing[1]
                .refused
                .as_deref()
                .unwrap()
                .contains("to[0]")
        );
        assert!(
            plan.outgoing[2]
                .refused
                .as_deref()
                .unwrap()
                .contains("differ")
        );
    }
}
