-- The workers that run and what they did minute by minute, for the console's overview. Each
-- worker writes its own row and the current minute's bucket every few seconds and when it stops,
-- never per email, so reading the fleet needs no scrape of every process.
CREATE TABLE mailroom_workers (
    worker_id    VARCHAR(100) NOT NULL PRIMARY KEY,
    -- The exchange name the worker consumes for: workers of several namespaces may share a
    -- database, and each console shows its own.
    namespace    VARCHAR(255) NOT NULL,
    host         VARCHAR(255) NOT NULL,
    pid          INTEGER      NOT NULL,
    version      VARCHAR(100) NOT NULL,
    started_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    last_seen    TIMESTAMPTZ  NOT NULL DEFAULT now(),
    stopped_at   TIMESTAMPTZ,
    sent         BIGINT       NOT NULL DEFAULT 0,
    retried      BIGINT       NOT NULL DEFAULT 0,
    dead         BIGINT       NOT NULL DEFAULT 0,
    in_flight    INTEGER      NOT NULL DEFAULT 0,
    circuit_open BOOLEAN      NOT NULL DEFAULT FALSE
);
CREATE INDEX mailroom_workers_seen ON mailroom_workers (namespace, last_seen);

-- What each worker sent, retried and dead-lettered in each minute (of its own clock).
CREATE TABLE mailroom_worker_minutes (
    minute     TIMESTAMPTZ  NOT NULL,
    worker_id  VARCHAR(100) NOT NULL,
    namespace  VARCHAR(255) NOT NULL,
    sent       BIGINT       NOT NULL,
    retried    BIGINT       NOT NULL,
    dead       BIGINT       NOT NULL,
    PRIMARY KEY (minute, worker_id)
);
CREATE INDEX mailroom_worker_minutes_ns ON mailroom_worker_minutes (namespace, minute);
