-- What the provider called an attempt's answer (`chatcmpl-…`, `msg_…`,
-- Gemini's `responseId`), written as soon as it was read, before the rest
-- of the answer; and the questions the reconciler asked a provider about
-- an unknown attempt (did it do the work?), each with its answer. A
-- question is only ever added; `asked_at_ms` on the attempt is when the
-- last was, which the reconciler's scan reads.
ALTER TABLE attempts ADD COLUMN provider_response_id TEXT;
ALTER TABLE attempts ADD COLUMN asked_at_ms BIGINT;

CREATE TABLE reconciliations (
    job_id   TEXT   NOT NULL,
    ordinal  BIGINT NOT NULL,
    n        BIGINT NOT NULL CHECK (n >= 1),
    provider TEXT   NOT NULL,
    asked_at_ms BIGINT NOT NULL,
    asked_by TEXT   NOT NULL CHECK (asked_by = 'id' OR asked_by = 'metadata'),
    outcome  TEXT   NOT NULL CHECK (outcome = 'answered' OR outcome = 'ended' OR outcome = 'running'
                                    OR outcome = 'not_found' OR outcome = 'error'),
    detail   TEXT   NOT NULL,
    PRIMARY KEY (job_id, ordinal, n),
    FOREIGN KEY (job_id, ordinal) REFERENCES attempts (job_id, ordinal)
);

-- The reconciler's scan: the unknown attempts, by provider, least
-- recently asked first. Unknowns are few; the index holds only them.
CREATE INDEX attempts_unknown_asked
    ON attempts (provider, asked_at_ms)
    WHERE state = 'unknown';
