-- The operator's attention queue: jobs `unknown` (oldest first) and
-- `failed` (newest first), of one owner or of all.
CREATE INDEX jobs_attention
    ON jobs (state, updated_at_ms)
    WHERE state IN ('unknown', 'failed');
