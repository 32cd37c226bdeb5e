-- 0054: finalize_completions reads each item's claim once, and its ready row and closure in the
-- claim's slot only (issue 17: the completion is a third of a drain's server time).
--
-- Until now the statement that locks the batch's claims rows (FOR NO KEY UPDATE) discarded them,
-- and the completion statement read them again; it also looked for each job's ready row and
-- closures in every live slot of the ring, by job id. A backlog spread over four slots made
-- finalize_completions(100) ~40 % dearer than one in a single slot (1.3 → 1.9 ms in one backend;
-- docs/benchmarks.md, "Completions in their claims' slots"). Now the locking statement keeps the
-- rows it locked (an array of claims rows: claims rows are never updated, so the locked version is
-- the row), and the ready rows and closures are read in the slots those rows lie in: a claims row
-- is written in its ready row's slot, prune carries it with its ready row, and its closure is
-- written in its slot by finalize and finalize_completions, the only writers of closures.
--
-- Locks, guards and writes: unchanged (0049's). The claims rows are locked in (job_id, run_lease)
-- order, read again until the slot ranges hold still; the closures are still read in the
-- completion statement, after the locks (a finalizer that held a row lock before us committed its
-- closure, which that statement's snapshot sees). An attempt is applied when its claims row is in
-- those ranges, has no closure and, for an item with a stale_before, no heartbeat since; closures,
-- narrow terminal rows, attempt_state deleted, unique keys released or entered by their mask.
--
-- Functions: finalize_completions (0049's text; lines marked 0054).

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
  -- index over the job_id index (a drain's finalize 2-5× slower).
  SELECT min(c.slot) FILTER (WHERE c.slot BETWEEN v_lo1 AND v_hi1), max(c.slot) FILTER (WHERE c.slot BETWEEN v_lo1 AND v_hi1), -- 0054
         min(c.slot) FILTER (WHERE c.slot BETWEEN v_lo2 AND v_hi2), max(c.slot) FILTER (WHERE c.slot BETWEEN v_lo2 AND v_hi2) -- 0054
    INTO v_slo1, v_shi1, v_slo2, v_shi2 FROM unnest(v_claims) c; -- 0054

  RETURN QUERY
  WITH items AS MATERIALIZED (
    -- 0049: the items from the arrays (a missing or shorter p_stale_before pads with NULL)
    SELECT x.o::int AS o, x.job_id, x.run_lease, x.stale_before -- 0049
    FROM unnest(p_job_ids, p_run_leases, p_stale_before) WITH ORDINALITY AS x(job_id, run_lease, stale_before, o) -- 0049
  ),
  batch_claims AS MATERIALIZED ( -- 0054: the rows locked above (claims rows are never updated)
    SELECT c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.queue, c.priority, c.shard, c.lane_seq
    FROM unnest(v_claims) c -- 0054
  ),
  batch_ready AS MATERIALIZED (
    SELECT r.slot, r.job_id, r.queue, r.priority, r.shard, r.lane_seq, r.unique_key, r.unique_states
    FROM ready r WHERE r.job_id = ANY (v_ids)
      AND (r.slot BETWEEN v_slo1 AND v_shi1 OR r.slot BETWEEN v_slo2 AND v_shi2) -- 0054
  ),
  batch_closures AS MATERIALIZED (
    SELECT z.job_id, z.run_lease FROM closures z WHERE z.job_id = ANY (v_ids)
      AND (z.slot BETWEEN v_slo1 AND v_shi1 OR z.slot BETWEEN v_slo2 AND v_shi2) -- 0054
  ),
  done AS MATERIALIZED (
    SELECT DISTINCT ON (i.job_id, i.run_lease)
           i.o, c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.lane_seq, r.unique_key, r.unique_states,
           a.found AS has_state,
           -- a completion enters the unique mask when the mask omits 'running' and holds 'completed'
           (r.unique_key IS NOT NULL AND (r.unique_states & 4) = 0 AND (r.unique_states & state_bit('completed')) <> 0) AS enters
    FROM items i
    JOIN batch_claims c ON c.job_id = i.job_id AND c.run_lease = i.run_lease
    JOIN batch_ready r ON r.slot = c.slot AND r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard
                      AND r.lane_seq = c.lane_seq
    LEFT JOIN LATERAL (
      SELECT a.heartbeat_at, true AS found FROM attempt_state a
      WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease LIMIT 1
    ) a ON true
    WHERE NOT EXISTS (SELECT 1 FROM batch_closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease)
      AND (i.stale_before IS NULL OR a.heartbeat_at IS NULL OR a.heartbeat_at < i.stale_before)
    ORDER BY i.job_id, i.run_lease, i.o
  ),
  -- a finished job takes its key if it is free, and keeps its end (as the general statement)
  take_key AS (
    INSERT INTO unique_claims (unique_key, job_id)
    SELECT DISTINCT ON (d.unique_key) d.unique_key, d.job_id FROM done d WHERE d.enters ORDER BY d.unique_key, d.job_id
    ON CONFLICT (unique_key) DO NOTHING
  ),
  ins_closures AS (
    INSERT INTO closures (slot, generation, job_id, run_lease, outcome, closed_at)
    SELECT d.slot, d.generation, d.job_id, d.run_lease, 'completed', v_now FROM done d
  ),
  ins_terminal AS (
    INSERT INTO terminal (slot, generation, job_id, run_lease, lane_seq, state, attempt, finalized_at, errors, progress)
    SELECT d.slot, d.generation, d.job_id, d.run_lease, d.lane_seq, 'completed', d.attempt, v_now, NULL, NULL FROM done d
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
