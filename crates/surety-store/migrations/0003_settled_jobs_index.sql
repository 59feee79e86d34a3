-- Retention: the pruner's scan, oldest settled jobs first. Only settled
-- jobs are in it; a job with an attempt that may still answer never is.
CREATE INDEX jobs_settled_at
    ON jobs (updated_at_ms)
    WHERE state IN ('succeeded', 'failed', 'cancelled');
