-- The request a job was created from, when its dialect needs it back
-- after the job is made: a Responses job's body (`POST /v1/responses`),
-- which names the response it continues (`previous_response_id`), whether
-- it may be continued or retrieved (`store`), and what its response object
-- echoes. Written with the job, in the same statement; never changed.
ALTER TABLE jobs ADD COLUMN request TEXT;
