//! PostgreSQL's expression that appends an ended attempt to the ledger's `history` column.

/// The ledger's `history` with one more entry (the attempt that just ended, unless it was
/// `sent`), newest 20 kept (`jobs::HISTORY_KEPT`): the expression of a record's `SET`,
/// over the row `n` and the record's status, class, SMTP reply and error.
macro_rules! history_append {
    ($status:literal, $class:literal, $reply:literal, $error:literal) => {
        concat!(
            "CASE WHEN ",
            $status,
            " = 'sent' THEN n.history ELSE (
        CASE WHEN jsonb_array_length(n.history) >= 20 THEN n.history - 0
             ELSE COALESCE(n.history, '[]'::jsonb) END
        || jsonb_build_array(jsonb_build_object(
            'event', 'attempt', 'attempt', n.attempts, 'claimed_at', n.claimed_at, 'at', now(),
            'status', ",
            $status,
            "::text, 'class', ",
            $class,
            "::text, 'smtp_reply', ",
            $reply,
            "::text, 'error', ",
            $error,
            "::text))) END"
        )
    };
}
