-- Space section: bench_cycles(n) runs n claim -> complete pairs through the API (UUID keys, small
-- params, result and target_ref), committing every 1000; bench_space() measures idempo.operations.
CREATE EXTENSION pgstattuple;
SELECT idempo.create_scope('sp', retention => '1 hour') \gset
CREATE PROCEDURE bench_cycles(n int) LANGUAGE plpgsql AS $$
DECLARE k text;
BEGIN
    FOR i IN 1..n LOOP
        k := gen_random_uuid()::text;
        PERFORM idempo.claim('sp', k, params => jsonb_build_object('sku', 'A-7', 'qty', i % 1000));
        PERFORM idempo.complete('sp', k, result => jsonb_build_object('shipment_id', i),
                                target_ref => 'SHP-' || i);
        IF i % 1000 = 0 THEN COMMIT; END IF;
    END LOOP;
END $$;
CREATE FUNCTION bench_space(OUT rows bigint, OUT table_len bigint, OUT tuple_len bigint,
                            OUT dead_tuple_len bigint, OUT free_space bigint,
                            OUT pkey_bytes bigint, OUT sweep_idx_bytes bigint)
LANGUAGE sql AS $$
    SELECT s.tuple_count, s.table_len, s.tuple_len, s.dead_tuple_len, s.free_space,
           pg_relation_size('idempo.operations_pkey'), pg_relation_size('idempo.operations_sweep_at_idx')
    FROM pgstattuple('idempo.operations') s
$$;
