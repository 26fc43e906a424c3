-- The relay wakes from the write-ahead log where the server allows it (src/relay/wal.rs): it
-- streams this publication from a temporary logical slot, so producers' commits need no trigger.
-- Only inserts into the outbox, only their id (PostgreSQL 15+; the whole row before): the stream
-- wakes the relay and carries no email. A role that may not create publications gets none, and
-- its relays keep NOTIFY.
--
-- The NOTIFY trigger runs in every producer's transaction (a quarter of the commit rate, measured)
-- and is disabled here only where the WAL can be followed: wal_level = logical, a migrating
-- role that may stream it (relays usually run as that role), and a server on this machine (the
-- stream has no TLS, so a relay follows it only on loopback, a Unix socket or with
-- sslmode=disable; a remote server keeps the trigger, and its operator disables it once every
-- relay says it follows the WAL). Elsewhere it stays, and relays that
-- cannot follow the WAL keep NOTIFY. A relay that cannot follow the WAL and finds the trigger
-- disabled polls, and says how to enable it again. Rows written in plain SQL, by any producer,
-- are in the WAL like any other.
DO $$
BEGIN
    BEGIN
        IF current_setting('server_version_num')::int >= 150000 THEN
            EXECUTE 'CREATE PUBLICATION mailroom_outbox_wakeup FOR TABLE mailroom_outbox (id)'
                    ' WITH (publish = ''insert'')';
        ELSE
            EXECUTE 'CREATE PUBLICATION mailroom_outbox_wakeup FOR TABLE mailroom_outbox'
                    ' WITH (publish = ''insert'')';
        END IF;
    EXCEPTION WHEN insufficient_privilege THEN
        RAISE NOTICE 'mailroom: no publication for the relay''s WAL wake-up (%); relays use NOTIFY',
            SQLERRM;
        RETURN;
    END;
    IF current_setting('wal_level') = 'logical'
       AND (inet_server_addr() IS NULL OR inet_server_addr() <<= '127.0.0.0/8'::inet
            OR inet_server_addr() = '::1'::inet)
       AND ((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)
            OR EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rds_replication'
                       AND pg_has_role(current_user, oid, 'member'))) THEN
        ALTER TABLE mailroom_outbox DISABLE TRIGGER mailroom_outbox_notify;
    END IF;
END $$;
