-- 0009: claim waits briefly for a busy lane instead of answering "empty".
--
-- Found by the fault suite: with several workers on one queue, a claim that found every
-- claimable lane locked by another claimer returned no rows, exactly as if the queue were empty,
-- and its dispatcher slept a whole poll interval (workers idle 0.6–1.5 s mid-drain). Otherwise
-- as in 0007.

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.claim(p_queue text, p_max int, p_deadline_ms bigint, p_aging_ms bigint)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt int, max_attempts int, kind text, queue text,
               priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb,
               run_at timestamptz, created_at timestamptz, claimed_at timestamptz, deadline_at timestamptz)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_left int := p_max;
  v_lane record;
  v_ring record;
  v_cursor bigint;
  v_seqs bigint[];
  v_pass int;
  v_busy int[] := '{}'; -- lanes (priority * 1000 + shard) whose claim lock was taken in pass 1
  v_saved_timeout text := current_setting('lock_timeout');
BEGIN
  IF p_max <= 0 OR EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused) THEN
    RETURN;
  END IF;
  -- Pass 1 tries each lane's claim lock. If it claimed nothing only because every claimable lane
  -- was busy (another worker mid-claim, a few ms), pass 2 waits briefly for the first of them
  -- instead of answering "empty", which would idle the worker for a whole poll interval.
  FOR v_pass IN 1 .. 2 LOOP
  EXIT WHEN v_pass = 2 AND (v_left < p_max OR cardinality(v_busy) = 0);
  FOR v_lane IN
    -- MATERIALIZED: one cursor computation per lane (inlined, it was re-evaluated per partition)
    WITH cur AS MATERIALIZED (
      SELECT l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard) AS c
      FROM lanes l WHERE l.queue = p_queue
    )
    SELECT cur.priority, cur.shard
    FROM cur
    CROSS JOIN LATERAL (
      SELECT r.run_at FROM ready r
      WHERE r.queue = cur.queue AND r.priority = cur.priority AND r.shard = cur.shard AND r.lane_seq >= cur.c
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1
    ) head
    ORDER BY CASE WHEN p_aging_ms > 0
                  THEN greatest(1, cur.priority - floor(extract(epoch FROM (v_now - head.run_at)) * 1000 / p_aging_ms))
                  ELSE cur.priority END,
             head.run_at, cur.priority, cur.shard
  LOOP
    EXIT WHEN v_left <= 0;
    IF v_pass = 1 THEN
      IF NOT pg_try_advisory_xact_lock(lock_ns('claim'), lane_key(p_queue, v_lane.priority, v_lane.shard)) THEN
        v_busy := v_busy || (v_lane.priority * 1000 + v_lane.shard);
        CONTINUE;
      END IF;
    ELSE
      CONTINUE WHEN NOT (v_lane.priority * 1000 + v_lane.shard) = ANY (v_busy);
      BEGIN
        PERFORM set_config('lock_timeout', '100ms', true);
        PERFORM pg_advisory_xact_lock(lock_ns('claim'), lane_key(p_queue, v_lane.priority, v_lane.shard));
        PERFORM set_config('lock_timeout', v_saved_timeout, true);
      EXCEPTION WHEN lock_not_available THEN
        RETURN; -- still busy after 100 ms: report empty; the dispatcher polls again
      END;
    END IF;
    v_cursor := lane_cursor(p_queue, v_lane.priority, v_lane.shard);
    -- A CTE, not a FROM-subquery, so the LIMIT cannot be merged away.
    WITH picked AS (
      SELECT r.lane_seq FROM ready r
      WHERE r.queue = p_queue AND r.priority = v_lane.priority AND r.shard = v_lane.shard AND r.lane_seq >= v_cursor
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq)
      ORDER BY r.lane_seq LIMIT v_left
    )
    SELECT array_agg(p.lane_seq ORDER BY p.lane_seq) INTO v_seqs FROM picked p;
    EXIT WHEN v_seqs IS NULL AND v_pass = 2;
    CONTINUE WHEN v_seqs IS NULL;
    -- Read after the pick, per lane: the picked rows are never in a newer slot than the mark.
    SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('claim_marks');
    INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
    VALUES (v_ring.slot, v_ring.generation, p_queue, v_lane.priority, v_lane.shard, v_seqs[cardinality(v_seqs)] + 1);
    RETURN QUERY
    WITH c AS (
      INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at)
      SELECT r.slot, r.generation, r.job_id, r.run_lease + 1, r.attempt + 1, r.queue, r.priority, r.shard, r.lane_seq, v_now,
             CASE WHEN p_deadline_ms > 0 THEN v_now + p_deadline_ms * interval '1 millisecond' END
      FROM ready r
      WHERE r.queue = p_queue AND r.priority = v_lane.priority AND r.shard = v_lane.shard AND r.lane_seq = ANY (v_seqs)
      RETURNING claims.slot, claims.job_id, claims.run_lease, claims.attempt, claims.lane_seq, claims.claimed_at, claims.deadline_at
    )
    SELECT c.job_id, c.run_lease, c.attempt, r.max_attempts, r.kind, r.queue, r.priority, r.args, r.metadata, r.tags,
           r.errors, r.run_at, r.created_at, c.claimed_at, c.deadline_at
    FROM c JOIN ready r ON r.slot = c.slot AND r.queue = p_queue AND r.priority = v_lane.priority
                       AND r.shard = v_lane.shard AND r.lane_seq = c.lane_seq
                       -- the picked positions as an index condition: under a generic plan the join
                       -- otherwise walked every already-claimed row of the lane in the slot
                       AND r.lane_seq = ANY (v_seqs)
    ORDER BY c.lane_seq;
    v_left := v_left - cardinality(v_seqs);
    -- pass 2 serves only the first lane it waited for, so the wait stays bounded
    EXIT WHEN v_pass = 2;
  END LOOP;
  END LOOP;
END
$$;

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) FROM PUBLIC;
