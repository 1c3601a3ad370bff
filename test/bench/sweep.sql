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
