-- Secrets mailroom's own processes share, created on first use: `replay_key` seals the copies
-- that `mailroom dlq replay` publishes, so a worker honours the replay marker only on those
-- (a copy from any other publisher gets no replay privileges). MAILROOM_REPLAY_KEY, when set,
-- takes the place of the stored key. Readable by whoever can read the ledger.
CREATE TABLE mailroom_secrets (
    name       VARCHAR(64)  NOT NULL PRIMARY KEY,
    value      VARCHAR(255) NOT NULL,
    created_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
) ENGINE = InnoDB DEFAULT CHARSET = ascii COLLATE = ascii_bin;
