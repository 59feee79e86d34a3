-- How a job was asked for (`native`: POST /v1/jobs; `chat`: the
-- OpenAI-compatible facade), and, for a chat job on an output-only route,
-- the client's messages its attempts send: recorded, never guessed from
-- the input. Jobs from before this column are native.
ALTER TABLE jobs ADD COLUMN kind TEXT NOT NULL DEFAULT 'native';
ALTER TABLE jobs ADD COLUMN messages TEXT;
