-- 0026: unpark moves a batch at a cost linear in the batch (docs/benchmarks.md, "Reclamation
-- liveness"; issue 14 property 1; ADR 0018 amended).
--
-- Before: the move was `DELETE FROM parked … WHERE lane_seq IN (SELECT … ORDER BY lane_seq LIMIT
-- n)`. Without statistics on parked (a fresh table, or one that grew by a whole backlog since
-- autovacuum's last analyze) the planner made it a nested loop that ran the subquery once per
-- parked row of the lane: the liveness benchmark spent 129 of its 146 s of drain in unpark (about
-- 2 s a call for 4,096 rows with 45,000 parked), and a 45,000-row lane took 185 s for one call on
-- the loaded machine. A queue resumed after a pause drained at ~300 jobs/s.
--
-- unpark(limit): the batch's last position is read first (`ORDER BY lane_seq OFFSET n - 1 LIMIT
--   1`, one scan of the primary key over at most the batch); the move deletes the primary-key
--   range up to it (and below v_stop, as before). The v_stop query (the first parked position
--   whose "moved" tombstone is still in the ring) looks only at the batch's range: it had the
--   same problem at size (a hash join over every tombstone and parked row of the lane, ~180 ms a
--   call at 45,000 parked). The count of the lane's claimable ring rows bounds its tombstone side
--   to the window it counts. Same rows, same order, whatever the plans.
--   Locks, guards and writes: 0021's, unchanged (claim lock per lane tried, ROW EXCLUSIVE on the
--   current ready child, DELETE on parked, INSERT into ready, NOTIFY). The lines marked "0026"
--   are the change; the rest is 0021's text, with its SET options (search_path, jit = off).

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.unpark(p_limit int) RETURNS int
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_lane record;
  v_moved int := 0;
  v_n int;
  v_cursor bigint;
  v_barrier bigint;
  v_have int;
  v_stop bigint;
  v_ring record;
  v_last bigint; -- 0026: the batch's last position
BEGIN
  FOR v_lane IN
    WITH RECURSIVE l AS (
      (SELECT p.queue, p.priority, p.shard FROM parked p ORDER BY p.queue, p.priority, p.shard LIMIT 1)
      UNION ALL
      SELECT n.queue, n.priority, n.shard
      FROM l CROSS JOIN LATERAL (
        SELECT p.queue, p.priority, p.shard FROM parked p
        WHERE (p.queue, p.priority, p.shard) > (l.queue, l.priority, l.shard)
        ORDER BY p.queue, p.priority, p.shard LIMIT 1) n
    )
    SELECT l.queue, l.priority, l.shard FROM l
    WHERE NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = l.queue AND m.paused)
  LOOP
    EXIT WHEN v_moved >= p_limit;
    CONTINUE WHEN NOT pg_try_advisory_xact_lock(lock_ns('claim'), lane_key(v_lane.queue, v_lane.priority, v_lane.shard));
    -- new statements after the lock: the previous claimer's mark is visible
    v_cursor := lane_cursor(v_lane.queue, v_lane.priority, v_lane.shard);
    SELECT min(p.lane_seq) INTO v_barrier FROM parked p
    WHERE p.queue = v_lane.queue AND p.priority = v_lane.priority AND p.shard = v_lane.shard;
    CONTINUE WHEN v_barrier IS NULL;
    SELECT count(*) INTO v_have FROM (
      SELECT 1 FROM ready r
      WHERE r.queue = v_lane.queue AND r.priority = v_lane.priority AND r.shard = v_lane.shard
        AND r.lane_seq >= v_cursor AND r.lane_seq < v_barrier
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t WHERE t.queue = r.queue AND t.priority = r.priority
                          AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          -- 0026: implied by the equality; bounds a hash join's build side to the window
                          AND t.lane_seq >= v_cursor AND t.lane_seq < v_barrier)
      LIMIT greatest(1, p_limit / 2)) x;
    CONTINUE WHEN v_have >= greatest(1, p_limit / 2);
    -- 0026: the batch's last position first (one ordered scan of the primary key over at most the
    -- batch); the tombstone check and the move below are bounded by it. The lane's parked rows
    -- cannot change meanwhile: we hold its claim lock (park ahead and cancel take it) and ACCESS
    -- SHARE on every ready child since the count above (prune's exclusive phase, which may park,
    -- needs ACCESS EXCLUSIVE).
    SELECT q.lane_seq INTO v_last FROM parked q
    WHERE q.queue = v_lane.queue AND q.priority = v_lane.priority AND q.shard = v_lane.shard
    ORDER BY q.lane_seq OFFSET p_limit - v_moved - 1 LIMIT 1; -- 0026 (NULL: fewer rows than the batch)
    -- A row parked ahead keeps a tombstone ("moved") in its old slot until that slot is truncated;
    -- tombstones match by lane position, whatever the slot, so a copy brought back before then
    -- would count as tombstoned and be skipped (and passed by the cursor). Bring back only the
    -- parked rows below the first one whose tombstone is still there.
    SELECT t.lane_seq INTO v_stop FROM ready_tombstones t
    WHERE t.queue = v_lane.queue AND t.priority = v_lane.priority AND t.shard = v_lane.shard AND t.lane_seq >= v_barrier
      AND t.lane_seq <= coalesce(v_last, 9223372036854775807) -- 0026: only the batch's range matters
      AND EXISTS (SELECT 1 FROM parked p WHERE p.queue = t.queue AND p.priority = t.priority AND p.shard = t.shard
                                           AND p.lane_seq = t.lane_seq)
    ORDER BY t.lane_seq LIMIT 1;
    CONTINUE WHEN v_stop = v_barrier;
    SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
    WITH moved AS (
      DELETE FROM parked p
      WHERE p.queue = v_lane.queue AND p.priority = v_lane.priority AND p.shard = v_lane.shard
        AND p.lane_seq < coalesce(v_stop, 9223372036854775807) -- 0026
        AND p.lane_seq <= coalesce(v_last, 9223372036854775807) -- 0026: the batch, as a key range
      RETURNING p.*
    )
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_ring.slot, v_ring.generation, m.job_id, m.kind, m.queue, m.priority, m.shard, m.lane_seq, m.args, m.metadata,
           m.tags, m.errors, m.progress, m.attempt, m.run_lease, m.max_attempts, m.run_at, m.created_at, m.unique_key,
           m.unique_states
    FROM moved m;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_moved := v_moved + v_n;
    IF v_n > 0 THEN
      PERFORM pg_notify('awa_wake_:AWA_SCHEMA', v_lane.queue);
    END IF;
  END LOOP;
  RETURN v_moved;
END
$$;
