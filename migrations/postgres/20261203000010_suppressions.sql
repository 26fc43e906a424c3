-- Addresses mailroom does not send to: hard bounces, complaints, unsubscribes, and entries an
-- operator made. `address` is normalised as the recipient search compares it: the domain in
-- lower case, the local part exactly as given (it may be case-sensitive). Compared byte for
-- byte (COLLATE "C"), whatever the database's default collation.
CREATE TABLE mailroom_suppressions (
    address    VARCHAR(1000) COLLATE "C" NOT NULL PRIMARY KEY,
    reason     VARCHAR(16)   NOT NULL
        CHECK (reason IN ('hard_bounce', 'complaint', 'unsubscribed', 'manual')),
    detail     TEXT,
    created_by VARCHAR(255)  NOT NULL,
    created_at TIMESTAMPTZ   NOT NULL DEFAULT now()
);
CREATE INDEX mailroom_suppressions_created ON mailroom_suppressions (created_at, address);
