-- When the owner deleted the response a job is (`DELETE /v1/responses/{id}`):
-- from then on the response is not found by id, continued or listed, while
-- the job itself (its idempotency record, its attempts) stays as it was.
-- Set once, by one guarded statement; never cleared.
ALTER TABLE jobs ADD COLUMN deleted_at_ms BIGINT;
