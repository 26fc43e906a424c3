-- Dead letters as rows: `<ns>.dead` is ingested here (a letter is acked only after its row
-- commits), and every reader (`mailroom dlq`, `/v1/dlq`) reads this table instead of the queue.
-- `body` and `properties` are the letter as it arrived, byte for byte (`properties` is the AMQP
-- basic-properties encoding, headers included), so a replay republishes it exactly. The other
-- columns are what a listing shows, filters and groups by.
CREATE TABLE mailroom_dead_letters (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- SHA-256 of exchange, routing key, properties (without the broker's redelivery headers)
    -- and body: a letter delivered twice is one row; the same job dead again is another.
    letter_key    BYTEA       NOT NULL UNIQUE,
    job_id        TEXT        NOT NULL,
    kind          TEXT        NOT NULL,
    -- The first recipient in full (searched; shown masked), and how many there are.
    recipient     TEXT,
    recipients    INTEGER     NOT NULL DEFAULT 0,
    class         TEXT        NOT NULL,
    reason        TEXT        NOT NULL,
    -- The reason without addresses, numbers and ids: letters of one class with the same
    -- normalised reason are one failure group, keyed by SHA-256 of both.
    reason_group  TEXT        NOT NULL,
    group_key     BYTEA       NOT NULL,
    attempts      BIGINT,
    failed_at     TIMESTAMPTZ,
    replays       BIGINT      NOT NULL DEFAULT 0,
    exchange      TEXT        NOT NULL,
    routing_key   TEXT        NOT NULL,
    properties    BYTEA       NOT NULL,
    body          BYTEA       NOT NULL,
    -- The size of the body as it arrived: larger than `body` only for an oversize letter, whose
    -- body is kept in part (docs/OPERATING.md, "Dead letters").
    body_size     BIGINT      NOT NULL,
    ingested_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    state         TEXT        NOT NULL DEFAULT 'dead'
                  CHECK (state IN ('dead', 'replayed', 'purged')),
    replayed_at   TIMESTAMPTZ,
    replayed_by   TEXT,
    replay_result TEXT,
    purged_at     TIMESTAMPTZ,
    purged_by     TEXT,
    -- When it left `dead` (replayed or purged): what the retention counts from.
    settled_at    TIMESTAMPTZ
);
CREATE INDEX mailroom_dead_letters_list ON mailroom_dead_letters (state, id);
CREATE INDEX mailroom_dead_letters_kind ON mailroom_dead_letters (kind, id);
CREATE INDEX mailroom_dead_letters_class ON mailroom_dead_letters (class, id);
CREATE INDEX mailroom_dead_letters_group ON mailroom_dead_letters (group_key, id);
CREATE INDEX mailroom_dead_letters_job ON mailroom_dead_letters (job_id);
CREATE INDEX mailroom_dead_letters_failed ON mailroom_dead_letters (failed_at);
CREATE INDEX mailroom_dead_letters_settled ON mailroom_dead_letters (state, settled_at);
