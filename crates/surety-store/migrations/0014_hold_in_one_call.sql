-- PostgreSQL only. A reservation of attempts' holds in one call: it opens
-- the budgets named and locks their rows in name order, so two
-- reservations of a budget take turns (FOR NO KEY UPDATE: the lock two
-- reservations cannot share, and that the foreign keys' FOR KEY SHARE of
-- a settlement's spend rows never waits on), then inserts every hold where no
-- budget passes its limit with the sum of these holds. The insert is a
-- statement of its own in a VOLATILE function, so under READ COMMITTED it
-- reads a snapshot taken after the locks were granted: every hold the
-- previous holder of the lock committed. It returns how many it inserted
-- (all of them or none); with `all_or_raise` none raises SQLSTATE SU429,
-- which undoes the statement that called it (a batch of new jobs with
-- their first attempts, in autocommit: the batch is then created job by
-- job). The guard is `sql.rs`'s `over` spelled over `s` (a test checks).
CREATE FUNCTION surety_hold(
    job_ids TEXT[], ordinals BIGINT[], accounts TEXT[], amounts BIGINT[],
    units TEXT[], buckets BIGINT[], names TEXT[], limits BIGINT[],
    froms BIGINT[], all_or_raise BOOLEAN
) RETURNS BIGINT LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    inserted BIGINT;
BEGIN
    IF COALESCE(cardinality(job_ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    INSERT INTO budget_accounts (account)
        SELECT b.account FROM unnest(names) AS b(account) ORDER BY b.account
        ON CONFLICT (account) DO NOTHING;
    PERFORM 1 FROM budget_accounts
        WHERE account = ANY (names) ORDER BY account FOR NO KEY UPDATE;
    INSERT INTO reservations
            (job_id, ordinal, account, amount, unit, bucket_ms, reserved_at_ms)
        SELECT i.job_id, i.ordinal, i.account, i.amount, i.unit, i.bucket_ms,
            CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)
        FROM unnest(job_ids, ordinals, accounts, amounts, units, buckets)
            AS i(job_id, ordinal, account, amount, unit, bucket_ms)
        WHERE NOT EXISTS (
            SELECT 1 FROM unnest(names, limits, froms) AS b(account, lim, from_ms)
            JOIN (SELECT a.account, SUM(a.amount) AS amount
                  FROM unnest(accounts, amounts) AS a(account, amount)
                  GROUP BY a.account) AS c ON c.account = b.account
            CROSS JOIN LATERAL (SELECT b.account, c.amount, b.lim, b.from_ms) AS s
            WHERE (s.lim >= 0 AND (COALESCE((SELECT SUM(r.amount) FROM reservations r WHERE r.account = s.account AND r.spent IS NULL), 0) + COALESCE((SELECT SUM(h.amount) FROM check_holds h WHERE h.account = s.account AND h.spent IS NULL), 0)) + s.amount + COALESCE((SELECT SUM(x.spent) FROM budget_spend x WHERE x.account = s.account AND x.bucket_ms >= s.from_ms), 0) > s.lim));
    GET DIAGNOSTICS inserted = ROW_COUNT;
    IF inserted = 0 AND all_or_raise THEN
        RAISE EXCEPTION 'a budget has no room for these holds' USING ERRCODE = 'SU429';
    END IF;
    RETURN inserted;
END
$$;
