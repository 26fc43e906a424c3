//! MySQL/MariaDB's expression that appends an ended attempt to the ledger's `history` column.

/// The ledger's `history` with one more entry (the attempt that just ended, unless it was
/// `sent`), newest 20 kept (`jobs::HISTORY_KEPT`): an assignment of a record's `SET`
/// over the row `n` and the record's status (twice), class, SMTP reply and error. It reads only
/// columns a record leaves alone, so MySQL's assignment order (left to right for one table, any
/// for a join) does not matter.
macro_rules! history_append {
    ($status:literal, $status2:literal, $class:literal, $reply:literal, $error:literal) => {
        concat!(
            "CASE WHEN ",
            $status,
            " = 'sent' THEN n.history ELSE JSON_ARRAY_APPEND(
        CASE WHEN JSON_LENGTH(n.history) >= 20 THEN JSON_REMOVE(n.history, '$[0]')
             ELSE COALESCE(n.history, '[]') END,
        '$', JSON_OBJECT(
            'event', 'attempt', 'attempt', n.attempts,
            'claimed_at', DATE_FORMAT(n.claimed_at, '%Y-%m-%dT%H:%i:%s.%fZ'),
            'at', DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%dT%H:%i:%s.%fZ'),
            'status', ",
            $status2,
            ", 'class', ",
            $class,
            ", 'smtp_reply', ",
            $reply,
            ", 'error', ",
            $error,
            ")) END"
        )
    };
}
