-- A replay claims each dead row before it publishes it, so two replays at once (two operators,
-- the CLI and the console) never publish one row twice: the claim is a single UPDATE that sets
-- `claim_token` only where no live claim is held, and the mark after the publish requires that
-- token. A replay that crashes mid-way leaves its claims behind; `claimed_until` makes them
-- expire, and the rows are replayable again (docs/OPERATING.md, "Dead letters").
ALTER TABLE mailroom_dead_letters
    ADD COLUMN claim_token   VARBINARY(64) NULL,
    ADD COLUMN claimed_until DATETIME(6)   NULL;
