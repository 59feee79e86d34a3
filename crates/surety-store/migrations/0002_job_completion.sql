-- How the winning attempt's provider answered, beside the answer itself:
-- its usage and finish reason, as JSON. Written by the same compare-and-swap
-- that writes `result`; NULL for jobs that never succeeded (and for jobs
-- that succeeded before this column existed).
ALTER TABLE jobs ADD COLUMN completion TEXT;
