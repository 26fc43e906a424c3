-- The claim ledger: one row per (job_id, kind) that a worker has ever claimed.
-- The unique key is what makes redeliveries, duplicate publishes and concurrent workers
-- send an email at most once.
--
-- MySQL/MariaDB notes: identifiers compare byte for byte (utf8mb4_bin), so `Order-1` and
-- `order-1` are different jobs as they are on PostgreSQL; times are DATETIME(6) in UTC, written
-- with UTC_TIMESTAMP(6) whatever the session's time zone (no TIMESTAMP 2038 limit).
CREATE TABLE sent_notifications (
    id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    job_id       VARCHAR(200) NOT NULL,
    kind         VARCHAR(64)  NOT NULL,
    status       VARCHAR(16)  NOT NULL,
    attempts     INT          NOT NULL DEFAULT 0,
    lease_until  DATETIME(6)  NULL,
    claim_token  BINARY(16)   NULL,
    message_id   VARCHAR(512) NOT NULL,
    smtp_reply   TEXT         NULL,
    last_error   TEXT         NULL,
    created_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    updated_at   DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    sent_at      DATETIME(6)  NULL,
    CONSTRAINT sent_notifications_status
        CHECK (status IN ('sending', 'sent', 'failed', 'uncertain', 'dead')),
    UNIQUE KEY sent_notifications_job (job_id, kind),
    -- Retention deletes old rows in batches by age.
    KEY sent_notifications_updated_at (updated_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
