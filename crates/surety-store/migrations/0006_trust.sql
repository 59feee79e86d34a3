-- What the router's own checks found, and the trust they took away.
--
-- live_results: one row per shadow call or scheduled re-check of a
-- provider on a contract (never an attempt: no job is changed by one).
-- demotions: a provider × contract the router no longer trusts, from the
-- moment a threshold of the contract was passed until a certification
-- newer than it or an admin lifts it. At most one open demotion per
-- provider × contract (the partial unique index): two replicas deciding
-- the same demotion at once record it once. Rows are kept when lifted, so
-- who lifted what, and when, stays on record.

CREATE TABLE live_results (
    id         TEXT   NOT NULL PRIMARY KEY, -- a UUIDv7: ids sort by time
    provider   TEXT   NOT NULL,
    contract   TEXT   NOT NULL,
    route      TEXT   NOT NULL,
    source     TEXT   NOT NULL CHECK (source IN ('shadow', 'recheck')),
    outcome    TEXT   NOT NULL CHECK (outcome IN ('kept', 'broke', 'disagreed', 'failed')),
    detail     TEXT   NOT NULL,
    job_id     TEXT,
    case_name  TEXT,
    input      TEXT   NOT NULL,
    expected   TEXT,
    answer     TEXT,
    at_ms      BIGINT NOT NULL
);

CREATE INDEX live_results_window ON live_results (provider, contract, id);
CREATE INDEX live_results_route ON live_results (route, at_ms);

CREATE TABLE demotions (
    id            TEXT   NOT NULL PRIMARY KEY, -- a UUIDv7
    provider      TEXT   NOT NULL,
    contract      TEXT   NOT NULL,
    reason        TEXT   NOT NULL,
    demoted_at_ms BIGINT NOT NULL,
    lifted_at_ms  BIGINT,
    lifted_by     TEXT,
    lift_reason   TEXT,
    CHECK ((lifted_at_ms IS NULL) = (lifted_by IS NULL))
);

CREATE UNIQUE INDEX demotions_one_open
    ON demotions (provider, contract)
    WHERE lifted_at_ms IS NULL;
