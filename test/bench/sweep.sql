-- bench_sweep(batch): calls idempo.sweep(batch) until it returns zeros, committing after each call,
-- and logs the totals and times in bench_sweep_log.  Set idempo.clock_offset in the session first.
CREATE TABLE bench_sweep_log (
    id serial, started timestamptz, finished timestamptz,
    lease_expired bigint, moved_to_review bigint, purged bigint, calls int
);
CREATE PROCEDURE bench_sweep(batch int) LANGUAGE plpgsql AS $$
DECLARE
    r  record;
    t0 timestamptz := clock_timestamp();
    le bigint := 0; mr bigint := 0; pu bigint := 0; n int := 0;
BEGIN
    LOOP
        SELECT * INTO r FROM idempo.sweep(batch);
        n := n + 1; le := le + r.lease_expired; mr := mr + r.moved_to_review; pu := pu + r.purged;
        COMMIT;
        EXIT WHEN r.lease_expired + r.moved_to_review + r.purged = 0;
    END LOOP;
    INSERT INTO bench_sweep_log (started, finished, lease_expired, moved_to_review, purged, calls)
    VALUES (t0, clock_timestamp(), le, mr, pu, n);
END $$;

-- bench_review_floor(batch): the row changes of moving every due row to review, as bare SQL with
-- none of idempo's decisions, for comparison with bench_sweep: lock a batch of due rows (SKIP
-- LOCKED, in sweep_at order), insert a review holding each row, set the rows in review, commit.
CREATE PROCEDURE bench_review_floor(batch int) LANGUAGE plpgsql AS $$
DECLARE
    t0 timestamptz := clock_timestamp();
    due_at timestamptz := now() + interval '2 hours';
    tids tid[];
    n bigint := 0; calls int := 0;
BEGIN
    LOOP
        tids := ARRAY(SELECT o.ctid FROM idempo.operations o WHERE o.sweep_at <= due_at
                      ORDER BY o.sweep_at LIMIT batch FOR UPDATE SKIP LOCKED);
        EXIT WHEN cardinality(tids) = 0;
        INSERT INTO idempo.reviews (scope, key, reason, opened_at, operation)
        SELECT o.scope, o.key, 'retention_expired', due_at, o FROM idempo.operations o
        WHERE o.ctid = ANY (tids);
        UPDATE idempo.operations o SET status = 'in_review', sweep_at = NULL, lease_expires_at = NULL
        WHERE o.ctid = ANY (tids);
        n := n + cardinality(tids); calls := calls + 1;
        COMMIT;
    END LOOP;
    INSERT INTO bench_sweep_log (started, finished, lease_expired, moved_to_review, purged, calls)
    VALUES (t0, clock_timestamp(), 0, n, 0, calls);
END $$;
