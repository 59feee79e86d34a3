-- SQLite only (PostgreSQL's migrator skips this folder). SQLite checks
-- `x IN (a, b, c)` of more than two values by building a temporary b-tree
-- of the values, every time a row is written: `jobs` and `attempts` did
-- it for their state's CHECK and `jobs` for `jobs_settled_at`'s WHERE, so
-- each write of a job's state opened and freed one or two (a job's four
-- writes, six). The same rules as comparisons joined by OR are checked in
-- place. SQLite cannot alter a CHECK: the tables are rebuilt, their rows
-- copied as they are, the way SQLite documents (foreign keys off during
-- the migration, then checked before it commits).

CREATE TABLE jobs_rebuilt (
    id              TEXT    NOT NULL PRIMARY KEY,
    owner_id        TEXT    NOT NULL CHECK (length(owner_id) BETWEEN 1 AND 255),
    idempotency_key TEXT    NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 255),
    route           TEXT    NOT NULL,
    contract        TEXT    NOT NULL,
    contract_digest TEXT    NOT NULL,
    input           TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL,
    hedgeable       BIGINT  NOT NULL CHECK (hedgeable IN (0, 1)),
    state           TEXT    NOT NULL CHECK (state = 'queued' OR state = 'running' OR state = 'unknown'
                                            OR state = 'succeeded' OR state = 'failed' OR state = 'cancelled'),
    version         BIGINT  NOT NULL DEFAULT 0,
    result          TEXT,
    completed_by    BIGINT,
    created_at_ms   BIGINT  NOT NULL,
    updated_at_ms   BIGINT  NOT NULL,
    completion      TEXT,
    kind            TEXT    NOT NULL DEFAULT 'native',
    messages        TEXT,
    UNIQUE (owner_id, idempotency_key),
    UNIQUE (id, hedgeable),
    CHECK ((state = 'succeeded') = (completed_by IS NOT NULL)),
    CHECK ((state = 'succeeded') = (result IS NOT NULL))
);
INSERT INTO jobs_rebuilt (id, owner_id, idempotency_key, route, contract, contract_digest, input,
    fingerprint, hedgeable, state, version, result, completed_by, created_at_ms, updated_at_ms,
    completion, kind, messages)
SELECT id, owner_id, idempotency_key, route, contract, contract_digest, input,
    fingerprint, hedgeable, state, version, result, completed_by, created_at_ms, updated_at_ms,
    completion, kind, messages
FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_rebuilt RENAME TO jobs;
CREATE INDEX jobs_settled_at
    ON jobs (updated_at_ms)
    WHERE state = 'succeeded' OR state = 'failed' OR state = 'cancelled';
CREATE INDEX jobs_attention
    ON jobs (state, updated_at_ms)
    WHERE state IN ('unknown', 'failed');

CREATE TABLE attempts_rebuilt (
    job_id              TEXT   NOT NULL,
    ordinal             BIGINT NOT NULL CHECK (ordinal >= 1),
    slot                BIGINT NOT NULL CHECK (slot IN (0, 1)),
    hedgeable           BIGINT NOT NULL,
    provider            TEXT   NOT NULL CHECK (length(provider) BETWEEN 1 AND 255),
    state               TEXT   NOT NULL CHECK (state = 'started' OR state = 'succeeded' OR state = 'failed'
                                               OR state = 'unknown' OR state = 'lost' OR state = 'cancelled'),
    base_version        BIGINT NOT NULL,
    started_at_ms       BIGINT NOT NULL,
    lease_expires_at_ms BIGINT NOT NULL,
    unknown_since_ms    BIGINT,
    finished_at_ms      BIGINT,
    error               TEXT,
    PRIMARY KEY (job_id, ordinal),
    FOREIGN KEY (job_id, hedgeable) REFERENCES jobs (id, hedgeable),
    CHECK (slot = 0 OR hedgeable = 1)
);
INSERT INTO attempts_rebuilt (job_id, ordinal, slot, hedgeable, provider, state, base_version,
    started_at_ms, lease_expires_at_ms, unknown_since_ms, finished_at_ms, error)
SELECT job_id, ordinal, slot, hedgeable, provider, state, base_version,
    started_at_ms, lease_expires_at_ms, unknown_since_ms, finished_at_ms, error
FROM attempts;
DROP TABLE attempts;
ALTER TABLE attempts_rebuilt RENAME TO attempts;
CREATE UNIQUE INDEX attempts_one_open_per_slot
    ON attempts (job_id, slot)
    WHERE state IN ('started', 'unknown');
CREATE INDEX attempts_started_lease
    ON attempts (lease_expires_at_ms)
    WHERE state = 'started';

CREATE TABLE live_results_rebuilt (
    id         TEXT   NOT NULL PRIMARY KEY,
    provider   TEXT   NOT NULL,
    contract   TEXT   NOT NULL,
    route      TEXT   NOT NULL,
    source     TEXT   NOT NULL CHECK (source IN ('shadow', 'recheck')),
    outcome    TEXT   NOT NULL CHECK (outcome = 'kept' OR outcome = 'broke' OR outcome = 'disagreed'
                                      OR outcome = 'failed'),
    detail     TEXT   NOT NULL,
    job_id     TEXT,
    case_name  TEXT,
    input      TEXT   NOT NULL,
    expected   TEXT,
    answer     TEXT,
    at_ms      BIGINT NOT NULL
);
INSERT INTO live_results_rebuilt (id, provider, contract, route, source, outcome, detail, job_id,
    case_name, input, expected, answer, at_ms)
SELECT id, provider, contract, route, source, outcome, detail, job_id,
    case_name, input, expected, answer, at_ms
FROM live_results;
DROP TABLE live_results;
ALTER TABLE live_results_rebuilt RENAME TO live_results;
CREATE INDEX live_results_window ON live_results (provider, contract, id);
CREATE INDEX live_results_route ON live_results (route, at_ms);
