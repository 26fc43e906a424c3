-- A group's records must probe the ledger's unique index, whatever the table's statistics say.
--
-- The worker writes the claims and records of a group in one statement (src/db/postgres/group.rs);
-- its records join the ledger with the group's keys. PostgreSQL caches a generic plan of the
-- statement per connection, and a plan made while the table was small (a new installation's
-- first minutes, a table just emptied) hashed the keys and scanned the whole table for every
-- group, until an ANALYZE replaced it: three times the CPU per email in a 20,000-job run. The
-- keys now come through this function, which tells the planner it returns one row, so every
-- plan probes `sent_notifications_job` once per key.
CREATE FUNCTION mailroom_ledger_records(
    job_ids text[], kinds text[], tokens uuid[], statuses text[], replies text[],
    errors text[], classes text[], revisions text[])
RETURNS TABLE (job_id text, kind text, token uuid, status text, reply text, error text,
               class text, revision text)
LANGUAGE plpgsql STABLE ROWS 1
AS $$
BEGIN
    RETURN QUERY
        SELECT * FROM unnest(job_ids, kinds, tokens, statuses, replies, errors, classes, revisions);
END
$$;
