-- NOTIFY serialises commits: every notifying transaction queues behind one lock held until its
-- commit ends, which capped producers at a few hundred commits per second. Notify only when no
-- other publishable row is waiting: such a row means the relay is busy with it or about to be,
-- and a relay that just published polls the outbox again within milliseconds, backing off only
-- while nothing comes. Rows of the same statement (the transition table) do not count.
CREATE OR REPLACE FUNCTION mailroom_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM mailroom_outbox o
        WHERE o.published_at IS NULL AND o.parked_at IS NULL
          AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())
          AND o.id NOT IN (SELECT id FROM inserted)
    ) THEN
        PERFORM pg_notify('mailroom_outbox', '');
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER mailroom_outbox_notify ON mailroom_outbox;
CREATE TRIGGER mailroom_outbox_notify
    AFTER INSERT ON mailroom_outbox
    REFERENCING NEW TABLE AS inserted
    FOR EACH STATEMENT EXECUTE FUNCTION mailroom_outbox_notify();
