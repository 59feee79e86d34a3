-- Jobs and their attempts. The guarantees of the spec live here, in
-- constraints and indexes, so that no application code can bypass them.
-- Times are milliseconds since the Unix epoch on the database's clock.
-- One file serves SQLite and PostgreSQL alike: keep it to their common SQL.

CREATE TABLE jobs (
    id              TEXT    NOT NULL PRIMARY KEY,
    owner_id        TEXT    NOT NULL CHECK (length(owner_id) BETWEEN 1 AND 255),
    idempotency_key TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    route           TEXT    NOT NULL,
    contract        TEXT    NOT NULL,
    contract_digest TEXT    NOT NULL,
    input           TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    hedgeable       BIGINT  NOT NULL CHECK (hedgeable IN (0, 1)),
    state           TEXT    NOT NULL CHECK (state IN ('queued', 'running', 'unknown', 'succeeded', 'failed', 'cancelled')),
    version         BIGINT  NOT NULL DEFAULT 0,
    result          TEXT,
    completed_by    BIGINT,
    created_at_ms   BIGINT  NOT NULL,
    updated_at_ms   BIGINT  NOT NULL,
    -- One job per intent: the key belongs to the owner.
    UNIQUE (owner_id, idempotency_key),
    -- The target of attempts' composite foreign key (hedging policy below).
    UNIQUE (id, hedgeable),
    -- A job holds a result exactly when an attempt won it.
    CHECK ((state = 'succeeded') = (completed_by IS NOT NULL)),
    CHECK ((state = 'succeeded') = (result IS NOT NULL))
);

CREATE TABLE attempts (
    job_id              TEXT   NOT NULL,
    ordinal             BIGINT NOT NULL CHECK (ordinal >= 1),
    -- 0: the attempt; 1: the single extra hedging slot.
    slot                BIGINT NOT NULL CHECK (slot IN (0, 1)),
    hedgeable           BIGINT NOT NULL,
    provider            TEXT   NOT NULL CHECK (length(provider) BETWEEN 1 AND 255),
    state               TEXT   NOT NULL CHECK (state IN ('started', 'succeeded', 'failed', 'unknown', 'lost', 'cancelled')),
    base_version        BIGINT NOT NULL,
    started_at_ms       BIGINT NOT NULL,
    lease_expires_at_ms BIGINT NOT NULL,
    unknown_since_ms    BIGINT,
    finished_at_ms      BIGINT,
    error               TEXT,
    PRIMARY KEY (job_id, ordinal),
    -- The hedging slot exists only on jobs whose contract has no side effects.
    FOREIGN KEY (job_id, hedgeable) REFERENCES jobs (id, hedgeable),
    CHECK (slot = 0 OR hedgeable = 1)
);

-- At most one open (started or unknown) attempt per slot: no new attempt
-- while one may still be running at a provider.
CREATE UNIQUE INDEX attempts_one_open_per_slot
    ON attempts (job_id, slot)
    WHERE state IN ('started', 'unknown');

-- The reaper's scan.
CREATE INDEX attempts_started_lease
    ON attempts (lease_expires_at_ms)
    WHERE state = 'started';

-- Every lost compare-and-swap, kept for audit.
CREATE TABLE races (
    id             TEXT    NOT NULL PRIMARY KEY, -- a UUIDv7: ids sort by time
    job_id         TEXT    NOT NULL REFERENCES jobs (id),
    loser_ordinal  BIGINT  NOT NULL,
    winner_ordinal BIGINT,
    reason         TEXT    NOT NULL,
    at_ms          BIGINT  NOT NULL
);

CREATE INDEX races_job ON races (job_id);
