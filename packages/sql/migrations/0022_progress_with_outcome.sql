-- 0022: progress travels with the outcome, and back out with the next claim (capability 14).
--
-- Before, a handler's checkpoint reached the database only with a heartbeat, and heartbeats
-- cover attempts older than half an interval (15 s by default): a checkpoint set after the last
-- heartbeat was lost when the attempt retried, failed or snoozed, and for short jobs that was
-- every checkpoint. And a new attempt could not see the checkpoint without an extra read.
--
-- finalize(items jsonb): an item may carry "progress" (a JSON object). It becomes the attempt's
--   progress in the same statement that closes it: retry, snooze, fail and cancel keep it (in
--   deferred, terminal or the DLQ, as they kept the heartbeat's), completion clears it as before.
--   An item without it keeps what the heartbeat wrote (attempt_state), else the job's progress
--   from before the attempt (ready.progress), as before.
--   Locks, guards and writes: 0016's, unchanged (per-attempt advisory locks in (job_id,
--   run_lease) order, applied only while the attempt is open, one closure per applied attempt).
--   The function is 0019's text (dlq_retry_once) with the three lines marked "0022"; its SET options are kept,
--   with 0018's jit = off (a CREATE OR REPLACE replaces the SET clauses too).
-- claim(...): also returns the job's progress (the ready row's, written by the previous attempt's
--   finalize, a rescue, or carried from deferred by promotion), so the handler can resume from it
--   without another read. The value is read from the row the pick already holds: no extra
--   lookup. A new result column changes the function's type, so it is dropped and created again
--   with 0021's text (unique masks of 0020, the parked-lane barrier of 0021) and settings, plus the lines marked "0022" (callers
--   select columns by name: an older worker reading this result ignores the new column).
--   Locks, guards and writes: 0016's, unchanged.

DROP FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint);

CREATE FUNCTION :AWA_SCHEMA.claim(p_queue text, p_max int, p_deadline_ms bigint, p_aging_ms bigint)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt int, max_attempts int, kind text, queue text,
               priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb,
               run_at timestamptz, created_at timestamptz, claimed_at timestamptz, deadline_at timestamptz,
               progress jsonb) -- 0022
LANGUAGE plpgsql
SET search_path = :AWA_SCHEMA, pg_catalog SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_deadline timestamptz := CASE WHEN p_deadline_ms > 0 THEN now() + p_deadline_ms * interval '1 millisecond' END;
  v_left int := p_max;
  v_prios smallint[];
  v_shards smallint[];
  v_k int;
  v_cursor bigint;
  v_n int;
  v_ordered boolean := false;
  v_pass int;
  v_busy int[] := '{}'; -- indexes into v_prios/v_shards of lanes whose claim lock was taken in pass 1
  v_saved_timeout text := current_setting('lock_timeout');
  -- the queue ring's slots that can hold rows (queue_slot_ranges), read once per call
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
BEGIN
  IF p_max <= 0 THEN
    RETURN;
  END IF;
  -- the queue's lanes; none when it is paused
  SELECT array_agg(l.priority), array_agg(l.shard) INTO v_prios, v_shards FROM lanes l
  WHERE l.queue = p_queue AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused);
  IF v_prios IS NULL THEN
    RETURN;
  END IF;
  IF cardinality(v_prios) > 1 THEN
    v_ordered := true;
    -- Several lanes: those with a claimable head, in claim order. (With one lane the order is
    -- trivial and the pick below finds out whether it has anything.)
    WITH cur AS MATERIALIZED (
      SELECT l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard) AS c
      FROM lanes l WHERE l.queue = p_queue
    )
    SELECT array_agg(o.priority ORDER BY o.n), array_agg(o.shard ORDER BY o.n) INTO v_prios, v_shards
    FROM (
      SELECT cur.priority, cur.shard,
             row_number() OVER (ORDER BY CASE WHEN p_aging_ms > 0
                                              THEN greatest(1, cur.priority - floor(extract(epoch FROM (v_now - head.run_at)) * 1000 / p_aging_ms))
                                              ELSE cur.priority END,
                                         head.run_at, cur.priority, cur.shard) AS n
      FROM cur
      CROSS JOIN LATERAL (
        SELECT r.run_at FROM ready r
        WHERE r.queue = cur.queue AND r.priority = cur.priority AND r.shard = cur.shard AND r.lane_seq >= cur.c
          AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq)
        ORDER BY r.lane_seq LIMIT 1
      ) head
    ) o;
    IF v_prios IS NULL THEN
      RETURN;
    END IF;
  END IF;

  -- Pass 1 tries each lane's claim lock. If it claimed nothing only because every claimable lane
  -- was busy (another worker mid-claim, a few ms), pass 2 waits briefly for the first of them
  -- instead of answering "empty", which would idle the worker for a whole poll interval.
  FOR v_pass IN 1 .. 2 LOOP
    EXIT WHEN v_pass = 2 AND (v_left < p_max OR cardinality(v_busy) = 0);
    FOR v_k IN 1 .. cardinality(v_prios) LOOP
      EXIT WHEN v_left <= 0;
      IF v_pass = 1 THEN
        -- = lane_key(p_queue, priority, shard), written with immutable operators so it is inlined
        -- (the SQL function is planned again on every call, as 0012 found for enqueue)
        IF NOT pg_try_advisory_xact_lock(lock_ns('claim'),
                                         hashtext(p_queue || chr(31) || v_prios[v_k]::text || chr(31) || v_shards[v_k]::text)) THEN
          -- With one lane the ordering query was skipped: wait for the busy lane only if it has
          -- a claimable head, as with several lanes (an idle queue still answers empty at once).
          CONTINUE WHEN NOT v_ordered AND NOT EXISTS (
            SELECT 1 FROM ready r
            WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k]
              AND r.lane_seq >= (SELECT coalesce(max(m.next_lane_seq), 0) FROM claim_marks m
                                 WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k])
              AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                              WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq));
          v_busy := v_busy || v_k;
          CONTINUE;
        END IF;
      ELSE
        CONTINUE WHEN NOT v_k = ANY (v_busy);
        BEGIN
          PERFORM set_config('lock_timeout', '100ms', true);
          PERFORM pg_advisory_xact_lock(lock_ns('claim'),
                                        hashtext(p_queue || chr(31) || v_prios[v_k]::text || chr(31) || v_shards[v_k]::text));
          PERFORM set_config('lock_timeout', v_saved_timeout, true);
        EXCEPTION WHEN lock_not_available THEN
          RETURN; -- still busy after 100 ms: report empty; the dispatcher polls again
        END;
      END IF;
      -- The cursor, in its own statement after the lane lock (see Guard and Mark slot above).
      -- ORDER BY … LIMIT 1 rather than max(): the same index scans, planned once instead of
      -- twice (max() is planned as an aggregate and as this query); re-planned after every
      -- prune, whose TRUNCATE invalidates cached plans.
      SELECT m.next_lane_seq INTO v_cursor FROM claim_marks m
      WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k]
      ORDER BY m.next_lane_seq DESC LIMIT 1;
      v_cursor := coalesce(v_cursor, 0);
      -- The slots that can hold this lane's rows from the cursor on, read after the cursor
      -- statement (see Slots above). Once per call: it holds for the rest of the transaction.
      IF v_lo1 IS NULL THEN
        SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_lo1, v_hi1, v_lo2, v_hi2 FROM queue_slot_ranges() s;
      END IF;
      -- Pick, mark and claim in one statement. The pick is a MATERIALIZED CTE, so its LIMIT
      -- cannot be merged away, and the rows returned are the picked rows themselves (no second
      -- lookup of `ready`); the claims rows carry the same values.
      RETURN QUERY
      WITH picked AS MATERIALIZED (
        SELECT r.slot, r.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata,
               r.tags, r.errors, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.progress, r.unique_key, r.unique_states -- 0022
        FROM ready r
        WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k] AND r.lane_seq >= v_cursor
          -- two ranges of scalar parameters: what partition pruning can use at executor start-up
          -- (it cannot use `slot = ANY (array parameter)`), so the other children are not opened
          AND (r.slot BETWEEN v_lo1 AND v_hi1 OR r.slot BETWEEN v_lo2 AND v_hi2)
          -- a tombstone lives in its ready row's slot
          AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                            AND (t.slot BETWEEN v_lo1 AND v_hi1 OR t.slot BETWEEN v_lo2 AND v_hi2))
          -- Paused, checked again in the pick's own snapshot: the check above ran in an earlier
          -- statement, and a job enqueued after a pause committed (seen here) must not be claimed.
          AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused)
          -- The lane's barrier (0021): its smallest parked position. Every parked row is at or past
          -- it, so the pick never takes a row while a smaller one of the lane is parked, and its
          -- mark never passes a parked row. Same statement, same snapshot as the pick.
          AND r.lane_seq < coalesce((SELECT p.lane_seq FROM parked p
                                     WHERE p.queue = p_queue AND p.priority = v_prios[v_k] AND p.shard = v_shards[v_k]
                                     ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
        ORDER BY r.lane_seq LIMIT v_left
      ),
      mark AS (
        INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
        SELECT ring.slot, ring.generation, p_queue, v_prios[v_k], v_shards[v_k], last.lane_seq + 1
        FROM (SELECT max(p.lane_seq) AS lane_seq FROM picked p) last,
             LATERAL (SELECT g.slot, g.generation FROM ring_rotations g WHERE g.ring = 'queue'
                      ORDER BY g.generation DESC LIMIT 1) ring
        WHERE last.lane_seq IS NOT NULL
      ),
      ins AS (
        INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at)
        SELECT p.slot, p.generation, p.job_id, p.run_lease + 1, p.attempt + 1, p.queue, p.priority, p.shard, p.lane_seq,
               v_now, v_deadline
        FROM picked p
      ),
      -- available -> running leaves a mask that holds 'available' but not 'running': the key goes
      -- (capabilities.md §4). Default masks hold both: the filter finds nothing.
      rel_unique AS (
        DELETE FROM unique_claims u USING picked p
        WHERE p.unique_key IS NOT NULL AND (p.unique_states & 6) = 2
          AND u.unique_key = p.unique_key AND u.job_id = p.job_id
      )
      SELECT p.job_id, p.run_lease + 1, p.attempt + 1, p.max_attempts, p.kind, p.queue, p.priority, p.args, p.metadata,
             p.tags, p.errors, p.run_at, p.created_at, v_now, v_deadline, p.progress /* 0022 */
      FROM picked p
      ORDER BY p.lane_seq;
      GET DIAGNOSTICS v_n = ROW_COUNT;
      EXIT WHEN v_n = 0 AND v_pass = 2;
      CONTINUE WHEN v_n = 0;
      v_left := v_left - v_n;
      -- pass 2 serves only the first lane it waited for, so the wait stays bounded
      EXIT WHEN v_pass = 2;
    END LOOP;
  END LOOP;
END
$$;

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) FROM PUBLIC;

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
    SELECT x_e.o::int AS o, x.job_id, x.run_lease, x.outcome, coalesce(x.delay_ms, 0) AS delay_ms, x.message, x.reason,
           x.stale_before, x.progress -- 0022
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x_e(v, o),
         jsonb_to_record(x_e.v) AS x(job_id bigint, run_lease bigint, outcome text, delay_ms bigint, message text, reason text,
                                     stale_before timestamptz, progress jsonb) -- 0022
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
           i.o, i.outcome AS outcome0, i.delay_ms, i.message AS message0, i.reason, c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.lane_seq,
           r.kind, r.queue, r.priority, r.shard, r.args, r.metadata, r.tags, r.errors, r.max_attempts, r.created_at, r.run_at,
           r.unique_key, r.unique_states, /* 0022: the outcome's progress first */ coalesce(i.progress, a.progress, r.progress) AS progress, a.found AS has_state,
           CASE i.outcome
             WHEN 'complete' THEN 'completed'
             WHEN 'cancel' THEN 'cancelled'
             WHEN 'fail' THEN 'failed'
             WHEN 'snooze' THEN 'scheduled'
             WHEN 'retry' THEN CASE WHEN c.attempt >= r.max_attempts THEN 'failed' ELSE 'retryable' END
           END AS new_state0
    FROM items i
    JOIN batch_claims c ON c.job_id = i.job_id AND c.run_lease = i.run_lease
    -- the claimed row by its full key: lane_seq, not run_lease, is unique per ready row (a cancelled
    -- and then retried job has two ready rows with the same lease)
    JOIN batch_ready r ON r.slot = c.slot AND r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard
                      AND r.lane_seq = c.lane_seq
    LEFT JOIN LATERAL (
      SELECT a.progress, a.heartbeat_at, true AS found FROM attempt_state a
      WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease LIMIT 1
    ) a ON true
    WHERE NOT EXISTS (SELECT 1 FROM batch_closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease)
      -- a stale rescue yields to a heartbeat that committed after its scan (we hold the attempt lock)
      AND (i.stale_before IS NULL OR a.heartbeat_at IS NULL OR a.heartbeat_at < i.stale_before)
    ORDER BY i.job_id, i.run_lease, i.o
  ),
  -- Re-entry into the unique mask (capabilities.md §4): a job whose mask omits 'running' takes
  -- its key again when its new state is in the mask; if a newer job holds it and the new state is
  -- retryable or scheduled, this one gives way (cancelled, 'superseded by duplicate <id>'), as in
  -- the simulation. Default masks hold 'running': nothing enters.
  keyed AS MATERIALIZED (
    SELECT o.*, (o.unique_key IS NOT NULL AND (o.unique_states & 4) = 0
                 AND (o.unique_states & state_bit(o.new_state0)) <> 0) AS enters
    FROM open o
  ),
  take_key AS (
    INSERT INTO unique_claims (unique_key, job_id)
    SELECT DISTINCT ON (k.unique_key) k.unique_key, k.job_id FROM keyed k WHERE k.enters ORDER BY k.unique_key, k.job_id
    ON CONFLICT (unique_key) DO NOTHING
    RETURNING job_id
  ),
  settled AS MATERIALIZED (
    SELECT k.*, CASE WHEN s.superseded THEN 'cancel' ELSE k.outcome0 END AS outcome,
           CASE WHEN s.superseded THEN 'superseded by duplicate ' || coalesce(s.holder::text, 'job') ELSE k.message0 END AS message,
           CASE WHEN s.superseded THEN 'cancelled' ELSE k.new_state0 END AS new_state
    FROM keyed k
    CROSS JOIN LATERAL (
      -- only a live state gives way; a finished job takes the key if it is free, and keeps its end
      SELECT CASE WHEN k.enters AND k.new_state0 IN ('retryable', 'scheduled') THEN NOT EXISTS (SELECT 1 FROM take_key t WHERE t.job_id = k.job_id)
                                 AND NOT EXISTS (SELECT 1 FROM unique_claims u WHERE u.unique_key = k.unique_key AND u.job_id = k.job_id)
                  ELSE false END AS superseded,
             CASE WHEN k.enters THEN (SELECT u.job_id FROM unique_claims u WHERE u.unique_key = k.unique_key) END AS holder
    ) s
  ),
  resolved AS MATERIALIZED (
    SELECT o.*,
           o.new_state = 'failed' AND dlq_enabled(o.queue) AS to_dlq,
           CASE WHEN o.outcome = 'fail' THEN 'terminal_error' ELSE coalesce(o.reason, 'max_attempts_exhausted') END AS dlq_reason,
           CASE WHEN o.outcome IN ('retry', 'fail') THEN
                  append_error(o.errors, jsonb_strip_nulls(jsonb_build_object('error', o.message, 'attempt', o.attempt, 'at', v_now,
                                         'terminal', CASE WHEN o.new_state = 'failed' THEN true END)))
                WHEN o.outcome = 'cancel' THEN
                  append_error(o.errors, jsonb_build_object('error', 'cancelled: ' || o.message, 'attempt', o.attempt, 'at', v_now))
           END AS new_errors
    FROM settled o
  ),
  -- The two plain tables keyed by job_id come first; what they did not take is not applied.
  ins_dlq AS (
    INSERT INTO dlq AS d (job_id, kind, queue, priority, args, metadata, tags, errors, progress, attempt, max_attempts,
                          original_run_lease, run_at, created_at, dlq_at, dlq_reason, unique_key, unique_states)
    SELECT DISTINCT ON (r.job_id)
           r.job_id, r.kind, r.queue, r.priority, r.args, r.metadata, r.tags, coalesce(r.new_errors, r.errors), r.progress,
           r.attempt, r.max_attempts, r.run_lease, r.run_at, r.created_at, v_now, r.dlq_reason, r.unique_key, r.unique_states
    FROM resolved r WHERE r.to_dlq
    ORDER BY r.job_id, r.run_lease DESC
    ON CONFLICT (job_id) DO UPDATE
      SET kind = excluded.kind, queue = excluded.queue, priority = excluded.priority, args = excluded.args,
          metadata = excluded.metadata, tags = excluded.tags, errors = excluded.errors, progress = excluded.progress,
          attempt = excluded.attempt, max_attempts = excluded.max_attempts, original_run_lease = excluded.original_run_lease,
          run_at = excluded.run_at, created_at = excluded.created_at, dlq_at = excluded.dlq_at,
          dlq_reason = excluded.dlq_reason, unique_key = excluded.unique_key, unique_states = excluded.unique_states
      WHERE d.original_run_lease < excluded.original_run_lease
    RETURNING d.job_id, d.original_run_lease AS run_lease
  ),
  ins_deferred AS (
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, progress, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT DISTINCT ON (r.job_id)
           r.job_id, r.new_state, r.kind, r.queue, r.priority, r.shard, r.args, r.metadata, r.tags,
           coalesce(r.new_errors, r.errors), r.progress,
           CASE WHEN r.new_state = 'scheduled' THEN r.attempt - 1 ELSE r.attempt END,
           r.run_lease, r.max_attempts, v_now + r.delay_ms * interval '1 millisecond', r.created_at, r.unique_key, r.unique_states
    FROM resolved r WHERE r.new_state IN ('retryable', 'scheduled')
    ORDER BY r.job_id, r.run_lease DESC
    ON CONFLICT (job_id) DO NOTHING
    RETURNING job_id, run_lease
  ),
  done AS (
    SELECT r.* FROM resolved r
    WHERE CASE WHEN r.to_dlq THEN EXISTS (SELECT 1 FROM ins_dlq x WHERE x.job_id = r.job_id AND x.run_lease = r.run_lease)
               WHEN r.new_state IN ('retryable', 'scheduled')
                 THEN EXISTS (SELECT 1 FROM ins_deferred x WHERE x.job_id = r.job_id AND x.run_lease = r.run_lease)
               ELSE true END
  ),
  ins_closures AS (
    INSERT INTO closures (slot, generation, job_id, run_lease, outcome, closed_at)
    SELECT r.slot, r.generation, r.job_id, r.run_lease, r.new_state, v_now FROM done r
  ),
  ins_terminal AS (
    INSERT INTO terminal (slot, generation, job_id, run_lease, lane_seq, state, attempt, finalized_at, errors, progress)
    SELECT r.slot, r.generation, r.job_id, r.run_lease, r.lane_seq, r.new_state, r.attempt, v_now, r.new_errors,
           CASE WHEN r.new_state = 'completed' THEN NULL ELSE r.progress END
    FROM done r WHERE r.new_state IN ('completed', 'failed', 'cancelled') AND NOT r.to_dlq
  ),
  -- Primary-key probes, only for attempts that had a row (read above): most attempts never
  -- heartbeat, so most batches delete nothing and probe nothing.
  del_state AS (
    DELETE FROM attempt_state a USING done r
    WHERE r.has_state AND a.job_id = r.job_id AND a.run_lease = r.run_lease
  ),
  rel_unique AS (
    DELETE FROM unique_claims u USING done r
    WHERE r.unique_key IS NOT NULL AND u.unique_key = r.unique_key AND u.job_id = r.job_id
      AND (r.unique_states & state_bit(r.new_state)) = 0
  )
  SELECT i.o, r.o IS NOT NULL, r.new_state
  FROM items i LEFT JOIN done r ON r.o = i.o
  ORDER BY i.o;
END
$$;

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.finalize(jsonb) FROM PUBLIC;
