-- Budgets: what each attempt reserved of a budget before its provider was
-- called, in the transaction that wrote the attempt, and what it cost once
-- it ended. A budget is an account: `held` is what its open reservations
-- hold (every reserving transaction locks this row first, so the check
-- that follows reads every spend committed before it), `budget_spend` what
-- was spent, per bucket of its period (a day, a month, a slice of a
-- rolling window, or one bucket for a total). A reservation is settled
-- once: its `spent` is NULL while it is held.
CREATE TABLE budget_accounts (
    account TEXT   PRIMARY KEY,
    held    BIGINT NOT NULL CHECK (held >= 0)
);

CREATE TABLE budget_spend (
    account   TEXT   NOT NULL REFERENCES budget_accounts (account),
    bucket_ms BIGINT NOT NULL,
    spent     BIGINT NOT NULL CHECK (spent >= 0),
    PRIMARY KEY (account, bucket_ms)
);

CREATE TABLE reservations (
    job_id     TEXT   NOT NULL,
    ordinal    BIGINT NOT NULL,
    account    TEXT   NOT NULL REFERENCES budget_accounts (account),
    unit       TEXT   NOT NULL CHECK (unit = 'micros' OR unit = 'tokens'),
    amount     BIGINT NOT NULL CHECK (amount >= 0),
    bucket_ms  BIGINT NOT NULL,
    reserved_at_ms BIGINT NOT NULL,
    spent      BIGINT CHECK (spent >= 0),
    settled_at_ms BIGINT,
    CHECK ((spent IS NULL) = (settled_at_ms IS NULL)),
    PRIMARY KEY (job_id, ordinal, account),
    FOREIGN KEY (job_id, ordinal) REFERENCES attempts (job_id, ordinal)
);

-- What a budget's open reservations hold, by attempt (the status read and
-- what unknown attempts hold): the held ones only.
CREATE INDEX reservations_held ON reservations (account) WHERE spent IS NULL;

-- The router's own checks (shadow calls, re-checks) reserve of an operator
-- budget by the same rule, each call by its own id, with no attempt row:
-- held while the call is out, settled as it ends.
CREATE TABLE check_holds (
    id         TEXT   NOT NULL,
    account    TEXT   NOT NULL REFERENCES budget_accounts (account),
    unit       TEXT   NOT NULL CHECK (unit = 'micros' OR unit = 'tokens'),
    amount     BIGINT NOT NULL CHECK (amount >= 0),
    bucket_ms  BIGINT NOT NULL,
    reserved_at_ms BIGINT NOT NULL,
    spent      BIGINT CHECK (spent >= 0),
    settled_at_ms BIGINT,
    CHECK ((spent IS NULL) = (settled_at_ms IS NULL)),
    PRIMARY KEY (id, account)
);
