-- The transactional outbox: the application inserts a row here in the same transaction as its
-- business row; the relay publishes it to RabbitMQ with confirms and marks it published.
-- MySQL has no LISTEN/NOTIFY: the relay polls, adaptively (fast while rows keep coming).
CREATE TABLE mailroom_outbox (
    id                BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    job_id            VARCHAR(200) NOT NULL,
    kind              VARCHAR(64)  NOT NULL,
    payload           JSON         NOT NULL,
    created_at        DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    published_at      DATETIME(6)  NULL,
    publish_attempts  INT          NOT NULL DEFAULT 0,
    last_error        TEXT         NULL,
    -- A row the broker refused is retried from this time on, so it never blocks the rows behind it.
    next_attempt_at   DATETIME(6)  NULL,
    -- Set when a row kept failing; the relay leaves it alone until an operator clears it.
    parked_at         DATETIME(6)  NULL,
    -- Enqueueing the same key twice is a no-op, so producers may retry their own requests.
    UNIQUE KEY mailroom_outbox_job (job_id, kind),
    -- The relay's scan (unpublished, unparked rows in id order) and retention (by published_at).
    KEY mailroom_outbox_pending (published_at, parked_at, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
