-- What a budget holds is what its open reservations and checks' holds
-- hold, summed where it is asked (by their partial indexes), not a counter
-- on the budget's row: settling an attempt then writes no budget row, so
-- it never waits for a reservation's commit, and a reservation locks the
-- row only to take its turn (see `sql.rs`).
ALTER TABLE budget_accounts DROP COLUMN held;

CREATE INDEX check_holds_held ON check_holds (account) WHERE spent IS NULL;
