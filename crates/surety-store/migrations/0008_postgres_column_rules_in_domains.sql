-- PostgreSQL only (SQLite's list of migrations, in `src/sqlite.rs`, leaves
-- it out). The same rules, checked where they cost PostgreSQL less.
--
-- PostgreSQL reads a table's CHECK constraints back from their text form
-- (and plans them) for every statement that writes a row: a job's two
-- statements write four rows, and `cargo xtask profile router` on
-- PostgreSQL found that parsing (`ExecConstraints` -> `stringToNode`) at 18 %
-- of the server's CPU per job. A domain's CHECK is parsed and planned once
-- per connection, in the server's type cache. So the rules on one column
-- move to domains; the rules that tie columns of a row together stay
-- CHECKs of their tables.
--
-- Changing a column's type to a domain checks every row it holds against
-- the domain's rule (the same rule as the CHECK it replaces, so none
-- fails), and rebuilds the column's indexes: a pause of the table's size
-- once, at the upgrade.

CREATE DOMAIN surety_name AS TEXT CHECK (length(VALUE) BETWEEN 1 AND 255);
CREATE DOMAIN surety_flag AS BIGINT CHECK (VALUE IN (0, 1));
CREATE DOMAIN surety_ordinal AS BIGINT CHECK (VALUE >= 1);
CREATE DOMAIN surety_job_state AS TEXT
    CHECK (VALUE IN ('queued', 'running', 'unknown', 'succeeded', 'failed', 'cancelled'));
CREATE DOMAIN surety_attempt_state AS TEXT
    CHECK (VALUE IN ('started', 'succeeded', 'failed', 'unknown', 'lost', 'cancelled'));

ALTER TABLE jobs
    DROP CONSTRAINT jobs_owner_id_check,
    DROP CONSTRAINT jobs_idempotency_key_check,
    DROP CONSTRAINT jobs_hedgeable_check,
    DROP CONSTRAINT jobs_state_check;
ALTER TABLE attempts
    DROP CONSTRAINT attempts_ordinal_check,
    DROP CONSTRAINT attempts_slot_check,
    DROP CONSTRAINT attempts_provider_check,
    DROP CONSTRAINT attempts_state_check;

-- An attempt's `hedgeable` is its job's (the foreign key), so it takes the
-- same domain: the key's two sides keep one type.
ALTER TABLE jobs
    ALTER COLUMN owner_id TYPE surety_name,
    ALTER COLUMN idempotency_key TYPE surety_name,
    ALTER COLUMN hedgeable TYPE surety_flag,
    ALTER COLUMN state TYPE surety_job_state;
ALTER TABLE attempts
    ALTER COLUMN ordinal TYPE surety_ordinal,
    ALTER COLUMN slot TYPE surety_flag,
    ALTER COLUMN hedgeable TYPE surety_flag,
    ALTER COLUMN provider TYPE surety_name,
    ALTER COLUMN state TYPE surety_attempt_state;
