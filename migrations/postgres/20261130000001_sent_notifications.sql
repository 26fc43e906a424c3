-- The claim ledger: one row per (job_id, kind) that a worker has ever claimed.
-- The unique key is what makes redeliveries, duplicate publishes and concurrent workers
-- send an email at most once.
CREATE TABLE sent_notifications (
    job_id       VARCHAR(200) NOT NULL,
    kind         VARCHAR(64)  NOT NULL,
    status       VARCHAR(16)  NOT NULL
        CHECK (status IN ('sending', 'sent', 'failed', 'uncertain', 'dead')),
    attempts     INTEGER      NOT NULL DEFAULT 0,
    lease_until  TIMESTAMPTZ,
    claim_token  UUID,
    message_id   VARCHAR(512) NOT NULL,
    smtp_reply   TEXT,
    last_error   TEXT,
    created_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    sent_at      TIMESTAMPTZ,
    CONSTRAINT sent_notifications_job UNIQUE (job_id, kind)
);

-- Retention deletes old rows in batches by age.
CREATE INDEX sent_notifications_updated_at ON sent_notifications (updated_at);
