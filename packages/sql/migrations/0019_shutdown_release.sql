-- 0019: finalize learns outcome 'release': an attempt cut off by worker shutdown goes back to
-- ready at once without using an attempt (capabilities.md §7, "Shutdown").
--
-- Before, the worker recorded such an attempt as an ordinary 'retry': backoff, one attempt used,
-- and `failed` when it was the job's last. A rolling deploy thereby failed jobs on their final
-- attempt. 'release' is 'retry' with three differences, all in this function:
--   - the new state is always 'retryable', never 'failed' (no exhaustion, no DLQ);
--   - the deferred row carries attempt - 1, so the next claim's attempt + 1 gives the same
--     attempt number again (as 'snooze' does);
--   - the delay is whatever the caller sends (the worker sends 0: promotion makes it ready at
--     its next tick).
-- Its error entry ("interrupted: worker shutdown") is appended as for 'retry', never terminal.
--
-- Locks, guards and writes are those of 0016's finalize, unchanged: the batch's per-attempt
-- advisory locks in (job_id, run_lease) order, the attempt applied only while it is open (its
-- claim present, no closure), one closure row per applied attempt (so a 'release' after a rescue
-- or cancel is Stale, like any other outcome), and the deferred row. The function is 0016's
-- text with the three CASE arms marked "0019" below; its SET options are kept, with 0018's
-- `jit = off` (CREATE OR REPLACE replaces them all).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.finalize(p_items jsonb)
RETURNS TABLE (ord int, applied boolean, state text)
LANGUAGE plpgsql
SET search_path = :AWA_SCHEMA, pg_catalog SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET enable_nestloop = off SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_ids bigint[];
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
BEGIN
  -- One statement; the locks are taken row by row in the sorted subquery's order.
  SELECT array_agg(a.job_id) INTO v_ids
  FROM (SELECT a.job_id, pg_advisory_xact_lock(attempt_key(a.job_id, a.run_lease)) AS locked
        FROM (SELECT DISTINCT i.job_id, i.run_lease FROM jsonb_to_recordset(p_items) AS i(job_id bigint, run_lease bigint)
              ORDER BY i.job_id, i.run_lease) a) a;
  -- After the locks: the batch's claims can no longer be carried (prune tries these locks), so
  -- each is in a slot of these ranges, or gone with its pruned slot (stale either way).
  SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_lo1, v_hi1, v_lo2, v_hi2 FROM queue_slot_ranges() s;

  RETURN QUERY
  WITH items AS MATERIALIZED (
    SELECT x_e.o::int AS o, x.job_id, x.run_lease, x.outcome, coalesce(x.delay_ms, 0) AS delay_ms, x.message, x.reason
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x_e(v, o),
         jsonb_to_record(x_e.v) AS x(job_id bigint, run_lease bigint, outcome text, delay_ms bigint, message text, reason text)
  ),
  batch_claims AS MATERIALIZED (
    SELECT c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.queue, c.priority, c.shard, c.lane_seq
    FROM claims c WHERE c.job_id = ANY (v_ids)
      AND (c.slot BETWEEN v_lo1 AND v_hi1 OR c.slot BETWEEN v_lo2 AND v_hi2)
  ),
  batch_ready AS MATERIALIZED (
    SELECT r.slot, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata, r.tags, r.errors,
           r.max_attempts, r.created_at, r.run_at, r.unique_key, r.unique_states, r.progress
    FROM ready r WHERE r.job_id = ANY (v_ids)
      AND (r.slot BETWEEN v_lo1 AND v_hi1 OR r.slot BETWEEN v_lo2 AND v_hi2)
  ),
  batch_closures AS MATERIALIZED (
    SELECT z.job_id, z.run_lease FROM closures z WHERE z.job_id = ANY (v_ids)
      AND (z.slot BETWEEN v_lo1 AND v_hi1 OR z.slot BETWEEN v_lo2 AND v_hi2)
  ),
  open AS (
    SELECT DISTINCT ON (i.job_id, i.run_lease)
           i.o, i.outcome, i.delay_ms, i.message, i.reason, c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.lane_seq,
           r.kind, r.queue, r.priority, r.shard, r.args, r.metadata, r.tags, r.errors, r.max_attempts, r.created_at, r.run_at,
           r.unique_key, r.unique_states, coalesce(a.progress, r.progress) AS progress, a.found AS has_state,
           CASE i.outcome
             WHEN 'complete' THEN 'completed'
             WHEN 'cancel' THEN 'cancelled'
             WHEN 'fail' THEN 'failed'
             WHEN 'snooze' THEN 'scheduled'
             WHEN 'retry' THEN CASE WHEN c.attempt >= r.max_attempts THEN 'failed' ELSE 'retryable' END
             -- 0019: shutdown's release is a retry that never exhausts
             WHEN 'release' THEN 'retryable'
           END AS new_state
    FROM items i
    JOIN batch_claims c ON c.job_id = i.job_id AND c.run_lease = i.run_lease
    -- the claimed row by its full key: lane_seq, not run_lease, is unique per ready row (a cancelled
    -- and then retried job has two ready rows with the same lease)
    JOIN batch_ready r ON r.slot = c.slot AND r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard
                      AND r.lane_seq = c.lane_seq
    LEFT JOIN LATERAL (
      SELECT a.progress, true AS found FROM attempt_state a WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease LIMIT 1
    ) a ON true
    WHERE NOT EXISTS (SELECT 1 FROM batch_closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease)
    ORDER BY i.job_id, i.run_lease, i.o
  ),
  resolved AS MATERIALIZED (
    SELECT o.*,
           o.new_state = 'failed' AND dlq_enabled(o.queue) AS to_dlq,
           CASE WHEN o.outcome = 'fail' THEN 'terminal_error' ELSE coalesce(o.reason, 'max_attempts_exhausted') END AS dlq_reason,
           -- 0019: 'release' records its error entry like 'retry' (never terminal: its state is retryable)
           CASE WHEN o.outcome IN ('retry', 'fail', 'release') THEN
                  append_error(o.errors, jsonb_strip_nulls(jsonb_build_object('error', o.message, 'attempt', o.attempt, 'at', v_now,
                                         'terminal', CASE WHEN o.new_state = 'failed' THEN true END)))
                WHEN o.outcome = 'cancel' THEN
                  append_error(o.errors, jsonb_build_object('error', 'cancelled: ' || o.message, 'attempt', o.attempt, 'at', v_now))
           END AS new_errors
    FROM open o
  ),
  ins_closures AS (
    INSERT INTO closures (slot, generation, job_id, run_lease, outcome, closed_at)
    SELECT r.slot, r.generation, r.job_id, r.run_lease, r.new_state, v_now FROM resolved r
  ),
  ins_terminal AS (
    INSERT INTO terminal (slot, generation, job_id, run_lease, lane_seq, state, attempt, finalized_at, errors, progress)
    SELECT r.slot, r.generation, r.job_id, r.run_lease, r.lane_seq, r.new_state, r.attempt, v_now, r.new_errors,
           CASE WHEN r.new_state = 'completed' THEN NULL ELSE r.progress END
    FROM resolved r WHERE r.new_state IN ('completed', 'failed', 'cancelled') AND NOT r.to_dlq
  ),
  ins_dlq AS (
    INSERT INTO dlq (job_id, kind, queue, priority, args, metadata, tags, errors, progress, attempt, max_attempts,
                     original_run_lease, run_at, created_at, dlq_at, dlq_reason, unique_key, unique_states)
    SELECT r.job_id, r.kind, r.queue, r.priority, r.args, r.metadata, r.tags, coalesce(r.new_errors, r.errors), r.progress,
           r.attempt, r.max_attempts, r.run_lease, r.run_at, r.created_at, v_now, r.dlq_reason, r.unique_key, r.unique_states
    FROM resolved r WHERE r.to_dlq
  ),
  ins_deferred AS (
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, progress, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT r.job_id, r.new_state, r.kind, r.queue, r.priority, r.shard, r.args, r.metadata, r.tags,
           coalesce(r.new_errors, r.errors), r.progress,
           -- 0019: a released attempt is not counted, as a snoozed one
           CASE WHEN r.new_state = 'scheduled' OR r.outcome = 'release' THEN r.attempt - 1 ELSE r.attempt END,
           r.run_lease, r.max_attempts, v_now + r.delay_ms * interval '1 millisecond', r.created_at, r.unique_key, r.unique_states
    FROM resolved r WHERE r.new_state IN ('retryable', 'scheduled')
  ),
  -- Primary-key probes, only for attempts that had a row (read above): most attempts never
  -- heartbeat, so most batches delete nothing and probe nothing.
  del_state AS (
    DELETE FROM attempt_state a USING resolved r
    WHERE r.has_state AND a.job_id = r.job_id AND a.run_lease = r.run_lease
  ),
  rel_unique AS (
    DELETE FROM unique_claims u USING resolved r
    WHERE r.unique_key IS NOT NULL AND u.unique_key = r.unique_key AND u.job_id = r.job_id
      AND (r.unique_states & state_bit(r.new_state)) = 0
  )
  SELECT i.o, r.o IS NOT NULL, r.new_state
  FROM items i LEFT JOIN resolved r ON r.o = i.o
  ORDER BY i.o;
END
$$;
