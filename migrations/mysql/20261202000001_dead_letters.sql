-- Dead letters as rows: `<ns>.dead` is ingested here (a letter is acked only after its row
-- commits), and every reader (`mailroom dlq`, `/v1/dlq`) reads this table instead of the queue.
-- `body` and `properties` are the letter as it arrived, byte for byte (`properties` is the AMQP
-- basic-properties encoding, headers included), so a replay republishes it exactly. The other
-- columns are what a listing shows, filters and groups by. Keys and identifiers are VARBINARY
-- (no PAD SPACE collation merges `a` and `a `, see 20261201000001_byte_exact_keys.sql); text that
-- is searched case-insensitively is utf8mb4 and lowered in the query.
CREATE TABLE mailroom_dead_letters (
    id            BIGINT        NOT NULL AUTO_INCREMENT PRIMARY KEY,
    -- SHA-256 of exchange, routing key, properties (without the broker's redelivery headers)
    -- and body: a letter delivered twice is one row; the same job dead again is another.
    letter_key    BINARY(32)    NOT NULL,
    job_id        VARBINARY(800) NOT NULL,
    kind          VARBINARY(255) NOT NULL,
    -- The first recipient in full (searched; shown masked), and how many there are.
    recipient     VARCHAR(998)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    recipients    INT           NOT NULL DEFAULT 0,
    class         VARBINARY(32) NOT NULL,
    reason        TEXT          CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The reason without addresses, numbers and ids: letters of one class with the same
    -- normalised reason are one failure group, keyed by SHA-256 of both.
    reason_group  TEXT          CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    group_key     BINARY(32)    NOT NULL,
    attempts      BIGINT        NULL,
    failed_at     DATETIME(6)   NULL,
    replays       BIGINT        NOT NULL DEFAULT 0,
    exchange      VARBINARY(1020) NOT NULL,
    routing_key   VARBINARY(1020) NOT NULL,
    properties    MEDIUMBLOB    NOT NULL,
    body          LONGBLOB      NOT NULL,
    -- The size of the body as it arrived: larger than `body` only for an oversize letter, whose
    -- body is kept in part (docs/OPERATING.md, "Dead letters").
    body_size     BIGINT        NOT NULL,
    ingested_at   DATETIME(6)   NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    state         VARBINARY(16) NOT NULL DEFAULT 'dead',
    replayed_at   DATETIME(6)   NULL,
    replayed_by   VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    replay_result TEXT          CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    purged_at     DATETIME(6)   NULL,
    purged_by     VARCHAR(255)  CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    -- When it left `dead` (replayed or purged): what the retention counts from.
    settled_at    DATETIME(6)   NULL,
    CONSTRAINT mailroom_dead_letters_state CHECK (state IN ('dead', 'replayed', 'purged')),
    UNIQUE KEY mailroom_dead_letters_key (letter_key),
    KEY mailroom_dead_letters_list (state, id),
    KEY mailroom_dead_letters_kind (kind, id),
    KEY mailroom_dead_letters_class (class, id),
    KEY mailroom_dead_letters_group (group_key, id),
    KEY mailroom_dead_letters_job (job_id),
    KEY mailroom_dead_letters_failed (failed_at),
    KEY mailroom_dead_letters_settled (state, settled_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
