-- The transactional outbox: the application inserts a row here in the same transaction as its
-- business row; the relay publishes it to RabbitMQ with confirms and marks it published.
CREATE TABLE mailroom_outbox (
    id                BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id            VARCHAR(200) NOT NULL,
    kind              VARCHAR(64)  NOT NULL,
    payload           JSONB        NOT NULL,
    created_at        TIMESTAMPTZ  NOT NULL DEFAULT now(),
    published_at      TIMESTAMPTZ,
    publish_attempts  INTEGER      NOT NULL DEFAULT 0,
    last_error        TEXT,
    -- A row the broker refused is retried from this time on, so it never blocks the rows behind it.
    next_attempt_at   TIMESTAMPTZ,
    -- Set when a row kept failing; the relay leaves it alone until an operator clears it.
    parked_at         TIMESTAMPTZ,
    -- Enqueueing the same key twice is a no-op, so producers may retry their own requests.
    CONSTRAINT mailroom_outbox_job UNIQUE (job_id, kind)
);

-- The relay's scan: unpublished, unparked rows in id order.
CREATE INDEX mailroom_outbox_pending ON mailroom_outbox (id)
    WHERE published_at IS NULL AND parked_at IS NULL;
-- Retention deletes published rows by age.
CREATE INDEX mailroom_outbox_published ON mailroom_outbox (published_at)
    WHERE published_at IS NOT NULL;

-- Wake the relay at commit time (NOTIFY is delivered on commit, and only then).
CREATE FUNCTION mailroom_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('mailroom_outbox', '');
    RETURN NULL;
END $$;

CREATE TRIGGER mailroom_outbox_notify
    AFTER INSERT ON mailroom_outbox
    FOR EACH STATEMENT EXECUTE FUNCTION mailroom_outbox_notify();
