-- Secrets mailroom's own processes share, created on first use: `replay_key` seals the copies
-- that `mailroom dlq replay` publishes, so a worker honours the replay marker only on those
-- (a copy from any other publisher gets no replay privileges). MAILROOM_REPLAY_KEY, when set,
-- takes the place of the stored key. Readable by whoever can read the ledger.
CREATE TABLE mailroom_secrets (
    name       TEXT        NOT NULL PRIMARY KEY,
    value      TEXT        NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
