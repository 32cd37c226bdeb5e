-- 0010: prune copies history under the slot's lock again (reverts 0008).
--
-- 0008 moved the history copy before the ACCESS EXCLUSIVE lock, inside a subtransaction rolled
-- back when the lock timed out or the re-proof failed. The peer benchmark found the cost: every
-- rolled-back copy left its rows as dead tuples in `history` (1,535 of 4,494 in a 20 s run), and
-- the next attempt copied again. Dead tuples in a ring table break the engine's first property,
-- so the copy goes back under the lock (as in 0003): a prune of a large drained slot stalls
-- claimers for the copy's duration instead. A copy outside the lock needs a way to tell a
-- blocked attempt before writing (future work, docs/adr/0004-storage-engine.md).

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.prune_queue(p_lock_timeout_ms int, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
RETURNS TABLE (outcome text, generation bigint, carried int)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots('queue');
  v_cur record;
  v_hist record;
  v_old bigint;
  v_slot int;
  v_attempt record;
  v_carried int;
  v_rollup jsonb;
  v_keys jsonb;
  v_children text;
  v_saved_timeout text := current_setting('lock_timeout');
BEGIN
  IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext('queue')) THEN
    RETURN QUERY SELECT 'Blocked:busy', NULL::bigint, 0;
    RETURN;
  END IF;
  SELECT * INTO v_cur FROM ring_current('queue');
  SELECT min(g.g) INTO v_old
  FROM generate_series(greatest(0, v_cur.generation - v_n + 1), v_cur.generation - 1) AS g(g)
  WHERE NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = g.g);
  IF v_old IS NULL THEN
    RETURN QUERY SELECT 'Noop', NULL::bigint, 0;
    RETURN;
  END IF;
  v_slot := (v_old % v_n)::int;

  IF slot_has_unclaimed(v_slot) THEN
    RETURN QUERY SELECT 'Blocked:unclaimed', v_old, 0;
    RETURN;
  END IF;
  FOR v_attempt IN
    SELECT c.job_id, c.run_lease FROM claims c
    WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
    ORDER BY c.job_id, c.run_lease
  LOOP
    IF NOT pg_try_advisory_xact_lock(attempt_key(v_attempt.job_id, v_attempt.run_lease)) THEN
      RETURN QUERY SELECT 'Blocked:locked_attempt', v_old, 0;
      RETURN;
    END IF;
  END LOOP;

  v_children := format('%1$I.ready_%2$s, %1$I.ready_tombstones_%2$s, %1$I.claims_%2$s, %1$I.claim_marks_%2$s, %1$I.closures_%2$s, %1$I.terminal_%2$s',
                       ':AWA_SCHEMA', v_slot);
  BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE';
  EXCEPTION WHEN lock_not_available THEN
    RETURN QUERY SELECT 'Blocked:lock', v_old, 0;
    RETURN;
  END;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);

  -- Re-proof: rows committed while we waited for the lock are visible now.
  IF slot_has_unclaimed(v_slot) THEN
    RETURN QUERY SELECT 'Blocked:unclaimed', v_old, 0;
    RETURN;
  END IF;

  WITH open AS (
    SELECT c.* FROM claims c
    WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
  ),
  carry_ready AS (
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_cur.slot, v_cur.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata, r.tags,
           r.errors, r.progress, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.unique_key, r.unique_states
    FROM open o JOIN ready r ON r.slot = v_slot AND r.queue = o.queue AND r.priority = o.priority AND r.shard = o.shard AND r.lane_seq = o.lane_seq
  ),
  carry_claims AS (
    INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at)
    SELECT v_cur.slot, v_cur.generation, o.job_id, o.run_lease, o.attempt, o.queue, o.priority, o.shard, o.lane_seq, o.claimed_at, o.deadline_at
    FROM open o
  ),
  carry_marks AS (
    INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
    SELECT v_cur.slot, v_cur.generation, l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard)
    FROM (SELECT DISTINCT o.queue, o.priority, o.shard FROM open o) l
  )
  SELECT count(*) INTO v_carried FROM open;

  SELECT * INTO v_hist FROM ring_current('history');
  WITH wide AS (
    SELECT t.job_id, t.run_lease, t.state, t.attempt, coalesce(t.max_attempts, r.max_attempts) AS max_attempts,
           coalesce(t.kind, r.kind) AS kind, coalesce(t.queue, r.queue) AS queue, coalesce(t.priority, r.priority) AS priority,
           coalesce(t.args, r.args) AS args, coalesce(t.metadata, r.metadata) AS metadata, coalesce(t.tags, r.tags) AS tags,
           coalesce(t.errors, r.errors) AS errors, t.progress, coalesce(t.run_at, r.run_at) AS run_at,
           coalesce(t.created_at, r.created_at) AS created_at, t.finalized_at,
           coalesce(t.unique_key, r.unique_key) AS unique_key, coalesce(t.unique_states, r.unique_states, 0) AS unique_states
    FROM terminal t
    LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
    WHERE t.slot = v_slot
  ),
  judged AS (
    SELECT w.*, w.finalized_at > now() - retention(w.state, w.queue, p_completed_ms, p_failed_ms, p_cancelled_ms) AS keep
    FROM wide w
  ),
  to_history AS (
    INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                         metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
    SELECT v_hist.slot, v_hist.generation, j.job_id, j.run_lease, j.state, j.attempt, j.max_attempts, j.kind, j.queue, j.priority,
           j.args, j.metadata, j.tags, j.errors, j.progress, j.run_at, j.created_at, j.finalized_at, j.unique_key, j.unique_states
    FROM judged j WHERE j.keep
  )
  SELECT (SELECT jsonb_object_agg(k, n) FROM (SELECT j.queue || ':' || j.state AS k, count(*) AS n FROM judged j GROUP BY 1) c),
         (SELECT jsonb_agg(jsonb_build_object('job_id', j.job_id, 'run_lease', j.run_lease, 'finalized_at', j.finalized_at,
                                              'unique_key', encode(j.unique_key, 'hex')))
          FROM judged j WHERE NOT j.keep AND j.unique_key IS NOT NULL)
    INTO v_rollup, v_keys;

  IF v_keys IS NOT NULL THEN
    PERFORM release_keys_of(v_keys);
  END IF;
  EXECUTE 'TRUNCATE ' || v_children;
  INSERT INTO ring_prunes (ring, generation, slot, rollup) VALUES ('queue', v_old, v_slot, coalesce(v_rollup, '{}'));
  RETURN QUERY SELECT 'Pruned', v_old, v_carried;
END
$$;

