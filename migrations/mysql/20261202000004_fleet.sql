-- The workers that run and what they did minute by minute, for the console's overview. Each
-- worker writes its own row and the current minute's bucket every few seconds and when it stops,
-- never per email, so reading the fleet needs no scrape of every process.
CREATE TABLE mailroom_workers (
    worker_id    VARBINARY(100) NOT NULL PRIMARY KEY,
    -- The exchange name the worker consumes for: workers of several namespaces may share a
    -- database, and each console shows its own.
    namespace    VARBINARY(255) NOT NULL,
    host         VARCHAR(255)   NOT NULL,
    pid          INT            NOT NULL,
    version      VARCHAR(100)   NOT NULL,
    started_at   DATETIME(6)    NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    last_seen    DATETIME(6)    NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    stopped_at   DATETIME(6)    NULL,
    sent         BIGINT         NOT NULL DEFAULT 0,
    retried      BIGINT         NOT NULL DEFAULT 0,
    dead         BIGINT         NOT NULL DEFAULT 0,
    in_flight    INT            NOT NULL DEFAULT 0,
    circuit_open BOOLEAN        NOT NULL DEFAULT FALSE,
    KEY mailroom_workers_seen (namespace, last_seen)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- What each worker sent, retried and dead-lettered in each minute (of its own clock).
CREATE TABLE mailroom_worker_minutes (
    minute     DATETIME(6)    NOT NULL,
    worker_id  VARBINARY(100) NOT NULL,
    namespace  VARBINARY(255) NOT NULL,
    sent       BIGINT         NOT NULL,
    retried    BIGINT         NOT NULL,
    dead       BIGINT         NOT NULL,
    PRIMARY KEY (minute, worker_id),
    KEY mailroom_worker_minutes_ns (namespace, minute)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
