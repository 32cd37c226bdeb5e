-- 0064: a completion reads its batch's closures and ready rows slot by slot (issue 17,
-- scale-out; docs/adr/0044-picks-per-slot.md, as 0063 did for the claim's pick).
--
-- finalize_completions' statement read the batch's closures (to answer a completion of an attempt
-- already closed as stale) and the ready rows of its jobs that may hold a unique key through the
-- partitioned parents, bounded to the slots holding the batch's claims by parameters. Its generic
-- plan covered all sixteen children of `closures` and `ready`: ~16 ms to plan on a stock
-- PostgreSQL 15, in every backend and again after every prune (the costliest plan of the hot
-- path once 0063 made the pick's small), and ACCESS SHARE on thirty-two children per call.
--
-- Now both are read before the statement, slot by slot, through functions that name one slot's
-- child (closures_of_<slot>, ready_rows_of_<slot>, made from one template for every queue-ring
-- slot; closures_of_slot and ready_rows_of_slot choose by slot, SQL CASEs inlined into the
-- caller's expression), and the statement reads the arrays. The ready rows are read only when
-- some claim of the batch may have a unique key (0055), as before.
--
-- Why earlier statements see what the statement would: the batch's claims rows are locked
-- (FOR NO KEY UPDATE, 0028) before either read, and every closer of an attempt (a completion, a
-- failure, rescue, cancel, prune) locks its claims row first, so no closure of these attempts can
-- commit between the reads and the statement; ready rows are never updated or deleted (a prune
-- truncates a slot, which our claims rows' locks and the lock statement's ACCESS SHARE keep out).
--
-- Locks: ACCESS SHARE on the closures (and, with keyed jobs, ready) child of each slot holding the
-- batch's claims, instead of on every child. Guards and writes: unchanged (0057's statement).
--
-- Functions: closures_of_<slot>, ready_rows_of_<slot> (new, one per queue-ring slot),
-- closures_of_slot, ready_rows_of_slot (new), finalize_completions (0057's text, lines marked
-- 0064). The claims rows' lock statement still reads through the parent: it locks rows in job
-- order across slots, the order heartbeat and prune share.

DO $do$
DECLARE
  s int;
  v_closures text := '';
  v_ready text := '';
BEGIN
  FOR s IN 0 .. :AWA_SCHEMA.ring_slots('queue') - 1 LOOP
    -- The closures of some jobs in one slot. STABLE, reads only; no SET clauses (called inside
    -- finalize_completions, whose settings apply).
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.%2$I(p_job_ids bigint[])
  RETURNS %1$I.closures[]
  LANGUAGE plpgsql STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::%1$I.closures FROM %1$I.%3$I z WHERE z.job_id = ANY (p_job_ids));
END
$function$
$f$, ':AWA_SCHEMA', 'closures_of_' || s, 'closures_' || s);
    -- The ready rows of some jobs in one slot (by job_id, its own index). As above.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.%2$I(p_job_ids bigint[])
  RETURNS %1$I.ready[]
  LANGUAGE plpgsql STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::%1$I.ready FROM %1$I.%3$I r WHERE r.job_id = ANY (p_job_ids));
END
$function$
$f$, ':AWA_SCHEMA', 'ready_rows_of_' || s, 'ready_' || s);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.%I(bigint[]) FROM PUBLIC', ':AWA_SCHEMA', 'closures_of_' || s);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.%I(bigint[]) FROM PUBLIC', ':AWA_SCHEMA', 'ready_rows_of_' || s);
    v_closures := v_closures || format(' WHEN %s THEN %I.%I(p_job_ids)', s, ':AWA_SCHEMA', 'closures_of_' || s);
    v_ready := v_ready || format(' WHEN %s THEN %I.%I(p_job_ids)', s, ':AWA_SCHEMA', 'ready_rows_of_' || s);
  END LOOP;
  -- The slot's function, by the slot (inlined, as lane_picks_in_slot in 0063).
  EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.closures_of_slot(p_slot int, p_job_ids bigint[])
  RETURNS %1$I.closures[]
  LANGUAGE sql STABLE
AS $function$ SELECT CASE p_slot%2$s END $function$
$f$, ':AWA_SCHEMA', v_closures);
  EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.ready_rows_of_slot(p_slot int, p_job_ids bigint[])
  RETURNS %1$I.ready[]
  LANGUAGE sql STABLE
AS $function$ SELECT CASE p_slot%2$s END $function$
$f$, ':AWA_SCHEMA', v_ready);
  EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.closures_of_slot(int, bigint[]) FROM PUBLIC', ':AWA_SCHEMA');
  EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.ready_rows_of_slot(int, bigint[]) FROM PUBLIC', ':AWA_SCHEMA');
END
$do$;

-- finalize_completions: 0057's text, lines marked 0064.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.finalize_completions(p_job_ids bigint[], p_run_leases bigint[], p_stale_before timestamptz[] DEFAULT NULL)
 RETURNS TABLE(ord integer, applied boolean, state text)
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
 SET enable_nestloop = off SET jit = off
AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_ids bigint[];
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
  v_now_lo1 int; -- 0028
  v_now_hi1 int; -- 0028
  v_now_lo2 int; -- 0028
  v_now_hi2 int; -- 0028
  v_claims claims[]; -- 0054: the batch's claims rows, as locked
  v_slo1 int; -- 0054: the smallest and largest slot they lie in, in each of the two ranges
  v_shi1 int; -- 0054
  v_slo2 int; -- 0054
  v_shi2 int; -- 0054
  v_unique_ids bigint[]; -- 0055: the jobs whose ready row is read (see the header)
  v_closed closures[] := '{}'; -- 0064: the batch's closures, slot by slot
  v_keyed_rows ready[] := '{}'; -- 0064: the ready rows of v_unique_ids, slot by slot
  v_s int; -- 0064: a slot holding the batch's claims
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'finalize needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF cardinality(p_job_ids) IS DISTINCT FROM cardinality(p_run_leases)
     OR cardinality(p_stale_before) > cardinality(p_job_ids) THEN
    RAISE EXCEPTION 'finalize_completions needs one run lease (and at most one stale_before) per job id (got %, %, %)',
      cardinality(p_job_ids), cardinality(p_run_leases), cardinality(p_stale_before)
      USING ERRCODE = '22023';
  END IF;
  SELECT array_agg(DISTINCT i.job_id) INTO v_ids FROM unnest(p_job_ids) AS i(job_id);
  IF v_ids IS NULL THEN
    RETURN;
  END IF;
  -- 0049: finalize's loop, written out here too (a PL/pgSQL function of its own that both call
  -- cost 36 µs per call, a quarter of a one-job call). 0028: the batch's claims rows, locked FOR NO KEY UPDATE in (job_id, run_lease) order, where
  -- each attempt took an advisory lock (one shared lock-table entry each until commit; a row lock
  -- lives in the tuple header: a lock-only xmax, no dead tuple). Prune tries the same rows (FOR
  -- UPDATE NOWAIT) before it carries or truncates, heartbeat locks them as we do, so once we hold
  -- them they stay in these slots. A prune that committed between our range read and our lock
  -- statement may have carried some, and it changed the ranges: read them again, lock in the new
  -- ranges, until they hold still. After the loop each claim is in a slot of these ranges, or
  -- gone with its pruned slot (stale either way).
  LOOP -- 0028
    SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_lo1, v_hi1, v_lo2, v_hi2 FROM queue_slot_ranges() s;
    v_claims := ARRAY(SELECT c FROM claims c -- 0054: kept, not read again below
                      WHERE c.job_id = ANY (v_ids) AND (c.slot BETWEEN v_lo1 AND v_hi1 OR c.slot BETWEEN v_lo2 AND v_hi2)
                      ORDER BY c.job_id, c.run_lease
                      FOR NO KEY UPDATE OF c);
    SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_now_lo1, v_now_hi1, v_now_lo2, v_now_hi2 FROM queue_slot_ranges() s; -- 0028
    EXIT WHEN v_now_lo1 = v_lo1 AND v_now_hi1 = v_hi1 AND v_now_lo2 = v_lo2 AND v_now_hi2 = v_hi2; -- 0028
  END LOOP;
  -- 0054: their ready rows and their closures lie in their slots (a claims row is written in its
  -- ready row's slot, carried with it, and closed in its own slot), so the statement below looks
  -- for them there only, not in every live slot: from the first to the last slot holding one of
  -- them, in each of the two ranges (the ring's order). Written as the ranges were, two ranges
  -- joined by OR: a single range is also an index condition on ready's primary key (slot is its
  -- last column), and a generic plan made while a child was empty chose a scan of that whole
  -- index over the job_id index (a drain's finalize 2-5× slower). 0055: and the jobs whose ready
  -- rows are read: those whose claim does not say the job has no unique key.
  SELECT min(c.slot) FILTER (WHERE c.slot BETWEEN v_lo1 AND v_hi1), max(c.slot) FILTER (WHERE c.slot BETWEEN v_lo1 AND v_hi1), -- 0054
         min(c.slot) FILTER (WHERE c.slot BETWEEN v_lo2 AND v_hi2), max(c.slot) FILTER (WHERE c.slot BETWEEN v_lo2 AND v_hi2), -- 0054
         array_agg(c.job_id) FILTER (WHERE c.without_unique_key IS NOT TRUE) -- 0055
    INTO v_slo1, v_shi1, v_slo2, v_shi2, v_unique_ids FROM unnest(v_claims) c; -- 0054, 0055
  -- 0064: those closures and ready rows, read slot by slot through each slot's own functions
  -- (closures_of_<slot>, ready_rows_of_<slot>; see the header) before the statement, not by the
  -- statement through the parents. Sound in earlier statements: the claims rows locked above keep
  -- every other closer of these attempts out (each locks them first), and ready rows are never
  -- changed.
  IF v_slo1 IS NOT NULL THEN -- 0064
    FOR v_s IN v_slo1 .. v_shi1 LOOP -- 0064
      v_closed := v_closed || closures_of_slot(v_s, v_ids); -- 0064
      IF v_unique_ids IS NOT NULL THEN -- 0064
        v_keyed_rows := v_keyed_rows || ready_rows_of_slot(v_s, v_unique_ids); -- 0064
      END IF; -- 0064
    END LOOP; -- 0064
  END IF; -- 0064
  IF v_slo2 IS NOT NULL THEN -- 0064
    FOR v_s IN v_slo2 .. v_shi2 LOOP -- 0064
      v_closed := v_closed || closures_of_slot(v_s, v_ids); -- 0064
      IF v_unique_ids IS NOT NULL THEN -- 0064
        v_keyed_rows := v_keyed_rows || ready_rows_of_slot(v_s, v_unique_ids); -- 0064
      END IF; -- 0064
    END LOOP; -- 0064
  END IF; -- 0064

  RETURN QUERY
  WITH items AS MATERIALIZED (
    -- 0049: the items from the arrays (a missing or shorter p_stale_before pads with NULL)
    SELECT x.o::int AS o, x.job_id, x.run_lease, x.stale_before -- 0049
    FROM unnest(p_job_ids, p_run_leases, p_stale_before) WITH ORDINALITY AS x(job_id, run_lease, stale_before, o) -- 0049
  ),
  batch_claims AS MATERIALIZED ( -- 0054: the rows locked above (claims rows are never updated)
    SELECT c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.queue, c.priority, c.shard, c.lane_seq,
           c.without_unique_key -- 0055
    FROM unnest(v_claims) c -- 0054
  ),
  batch_ready AS MATERIALIZED ( -- 0055: only the rows that may hold a unique key
    SELECT r.slot, r.job_id, r.queue, r.priority, r.shard, r.lane_seq, r.unique_key, r.unique_states
    FROM unnest(v_keyed_rows) r -- 0064: read above, slot by slot
  ),
  batch_closures AS MATERIALIZED (
    SELECT z.job_id, z.run_lease FROM unnest(v_closed) z -- 0064: read above, slot by slot
  ),
  done AS MATERIALIZED (
    SELECT DISTINCT ON (i.job_id, i.run_lease)
           i.o, c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.lane_seq, r.unique_key, r.unique_states,
           a.found AS has_state,
           -- a completion enters the unique mask when the mask omits 'running' and holds 'completed'
           (r.unique_key IS NOT NULL AND (r.unique_states & 4) = 0 AND (r.unique_states & state_bit('completed')) <> 0) AS enters
    FROM items i
    JOIN batch_claims c ON c.job_id = i.job_id AND c.run_lease = i.run_lease
    LEFT JOIN batch_ready r ON r.slot = c.slot AND r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard
                           AND r.lane_seq = c.lane_seq -- 0055: LEFT, see the WHERE
    LEFT JOIN LATERAL (
      SELECT a.heartbeat_at, true AS found FROM attempt_state a
      WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease LIMIT 1
    ) a ON true
    -- 0055: a claim without the flag needs its ready row, as before (a claims row lies in its
    -- ready row's slot, so the row is there for every claim of the batch)
    WHERE (c.without_unique_key OR r.job_id IS NOT NULL) -- 0055
      AND NOT EXISTS (SELECT 1 FROM batch_closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease)
      AND (i.stale_before IS NULL OR a.heartbeat_at IS NULL OR a.heartbeat_at < i.stale_before)
    ORDER BY i.job_id, i.run_lease, i.o
  ),
  -- a finished job takes its key if it is free, and keeps its end (as the general statement)
  take_key AS (
    INSERT INTO unique_claims (unique_key, job_id)
    SELECT DISTINCT ON (d.unique_key) d.unique_key, d.job_id FROM done d WHERE d.enters ORDER BY d.unique_key, d.job_id
    ON CONFLICT (unique_key) DO NOTHING
  ),
  -- 0057: the closure is the completed attempt's terminal record (terminal_records): no terminal row
  ins_closures AS (
    INSERT INTO closures (slot, generation, job_id, run_lease, outcome, closed_at, attempt, lane_seq) -- 0057
    SELECT d.slot, d.generation, d.job_id, d.run_lease, 'completed', v_now, d.attempt, d.lane_seq FROM done d -- 0057
  ),
  del_state AS (
    DELETE FROM attempt_state a USING done d
    WHERE d.has_state AND a.job_id = d.job_id AND a.run_lease = d.run_lease
  ),
  rel_unique AS (
    DELETE FROM unique_claims u USING done d
    WHERE d.unique_key IS NOT NULL AND u.unique_key = d.unique_key AND u.job_id = d.job_id
      AND (d.unique_states & state_bit('completed')) = 0
  )
  SELECT i.o, d.o IS NOT NULL, CASE WHEN d.o IS NOT NULL THEN 'completed' END
  FROM items i LEFT JOIN done d ON d.o = i.o
  ORDER BY i.o;
END
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.finalize_completions(bigint[], bigint[], timestamptz[]) FROM PUBLIC;
