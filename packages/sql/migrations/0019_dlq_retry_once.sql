-- 0019: a DLQ retry racing the move to the DLQ gives one job, run once; no finalize batch is
-- aborted by one item; a stale rescue re-checks the heartbeat under the attempt lock; operator
-- retry takes the lane lock before the unique row (ADR 0016; storage-engine review M2, A4, m2,
-- m4, m8).
--
-- Before: retry_job_or_dlq looked for a dlq row *before* the per-job lock, and retry_job took any
-- job whose newest representation is 'failed', the DLQ row (rank 0) included. A retry racing
-- finalize's move to the DLQ, or a direct retry_job on a DLQ job, left the job both in the DLQ and
-- in the ring: it ran again, and its next failure on a DLQ queue violated dlq_pkey, which aborted
-- the whole finalize batch (up to 512 unrelated attempts) and then every rescue tick.
--
-- Now:
--   retry_job_or_dlq  per-job lock first, then the DLQ check in a new statement (READ COMMITTED:
--                     it sees a move that committed before the lock was granted).
--   retry_job         a job whose newest representation is its DLQ row is retried out of the DLQ
--                     (retry_from_dlq), never copied beside it.
--   retry_job, retry_from_dlq
--                     the lane's enqueue lock before the unique row, the order enqueue uses, so an
--                     operator retry and a producer of the same key cannot deadlock (review m2).
--   finalize          the dlq insert is ON CONFLICT (job_id) DO UPDATE, newest attempt wins; the
--                     deferred insert is ON CONFLICT DO NOTHING. An item whose row could not be
--                     written reports applied = false and writes nothing (no closure: its attempt
--                     stays open). Nothing in one item can raise for the batch. An item may carry
--                     stale_before: it then applies only if the attempt has no heartbeat at or
--                     after that instant (read under the attempt lock).
--   rescue            stale items carry their cutoff as stale_before (review m4: a heartbeat that
--                     commits between the candidate scan and finalize's lock saves the attempt).
--   cancel_job        retries up to 100 times instead of 5 before SQLSTATE 40001: every retry
--                     means another party moved the job (review m8).

-- ---------------------------------------------------------------------------------------------
-- retry_job_or_dlq(id) -> as retry_job / retry_from_dlq.
-- Locks: per-job lock (blocking), then whatever the delegate takes (the per-job lock again is a
--        no-op re-entry).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.retry_job_or_dlq(p_job_id bigint)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
BEGIN
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  -- a new statement after the lock: a move to the DLQ that committed before it is seen
  IF EXISTS (SELECT 1 FROM dlq d WHERE d.job_id = p_job_id) THEN
    RETURN retry_from_dlq(p_job_id, NULL, NULL, NULL);
  END IF;
  RETURN retry_job(p_job_id);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- retry_job(id) -> 'available', the unchanged state when it is not failed or cancelled, or NULL
-- when the job does not exist. A job in the DLQ is retried out of it (retry_from_dlq).
-- Locks: per-job lock, then the lane's enqueue lock (blocking, like an insert), then the unique
--        row: enqueue's order.
-- Writes: a new ready row (attempt 0, run_lease unchanged, errors kept) in the current slot;
--         re-acquires the unique key when the mask holds 'available' (AWU01 on conflict).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.retry_job(p_job_id bigint)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_job record;
  v_key record;
  v_ring record;
  v_holder bigint;
BEGIN
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  SELECT * INTO v_job FROM jobs j WHERE j.job_id = p_job_id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF v_job.dlq_reason IS NOT NULL THEN
    -- the newest representation is the DLQ row: move it out, never copy it beside the entry
    RETURN retry_from_dlq(p_job_id, NULL, NULL, NULL);
  END IF;
  IF v_job.state NOT IN ('failed', 'cancelled') THEN
    RETURN v_job.state;
  END IF;
  SELECT x.unique_key, x.unique_states INTO v_key FROM (
    SELECT coalesce(t.unique_key, r.unique_key) AS unique_key, coalesce(t.unique_states, r.unique_states) AS unique_states, t.run_lease, t.finalized_at
    FROM terminal t LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
    WHERE t.job_id = p_job_id
    UNION ALL
    SELECT h.unique_key, h.unique_states, h.run_lease, h.finalized_at FROM history h WHERE h.job_id = p_job_id
  ) x ORDER BY x.run_lease DESC, x.finalized_at DESC LIMIT 1;
  PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_job.queue, v_job.priority, 0));
  IF v_key.unique_key IS NOT NULL AND (v_key.unique_states & state_bit('available')) <> 0 THEN
    INSERT INTO unique_claims (unique_key, job_id) VALUES (v_key.unique_key, p_job_id) ON CONFLICT DO NOTHING;
    SELECT u.job_id INTO v_holder FROM unique_claims u WHERE u.unique_key = v_key.unique_key;
    IF v_holder <> p_job_id THEN
      RAISE EXCEPTION 'unique key % is held by job %', encode(v_key.unique_key, 'hex'), v_holder
        USING ERRCODE = 'AWU01', DETAIL = encode(v_key.unique_key, 'hex'), HINT = v_holder::text;
    END IF;
  END IF;
  INSERT INTO lanes (queue, priority, shard) VALUES (v_job.queue, v_job.priority, 0) ON CONFLICT DO NOTHING;
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
  INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                     errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
  VALUES (v_ring.slot, v_ring.generation, p_job_id, v_job.kind, v_job.queue, v_job.priority, 0, nextval('lane_seq'),
          v_job.args, v_job.metadata, v_job.tags, v_job.errors, v_job.progress, 0, v_job.run_lease, v_job.max_attempts,
          v_now, v_job.created_at, v_key.unique_key, coalesce(v_key.unique_states, 0));
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', v_job.queue);
  RETURN 'available';
END
$$;

-- ---------------------------------------------------------------------------------------------
-- retry_from_dlq(id, queue?, priority?, run_at?) -> 'available' | 'scheduled', NULL if not in the
-- DLQ. As in 0006, with the lane's enqueue lock taken before the unique row (enqueue's order).
-- Locks: per-job lock; then (available) the lane's enqueue lock, blocking, then the unique row,
--        then the current slot's ready child via lock_current_slot.
-- Writes: deletes the dlq row; a ready row (fresh position) or a deferred row with attempt 0 and
--        the original run lease; re-takes the unique key when the new state is in its mask
--        (AWU01 if another job holds it, and the whole call rolls back, entry included).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.retry_from_dlq(p_job_id bigint, p_queue text, p_priority int, p_run_at timestamptz)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_row dlq%ROWTYPE;
  v_queue text;
  v_priority smallint;
  v_run_at timestamptz;
  v_state text;
  v_holder bigint;
  v_ring record;
BEGIN
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  DELETE FROM dlq d WHERE d.job_id = p_job_id RETURNING d.* INTO v_row;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  v_queue := coalesce(p_queue, v_row.queue);
  v_priority := coalesce(p_priority, v_row.priority);
  v_run_at := coalesce(p_run_at, v_now);
  v_state := CASE WHEN v_run_at > v_now THEN 'scheduled' ELSE 'available' END;
  IF v_state = 'available' THEN
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_queue, v_priority, 0));
  END IF;
  IF v_row.unique_key IS NOT NULL AND (v_row.unique_states & state_bit(v_state)) <> 0 THEN
    INSERT INTO unique_claims (unique_key, job_id) VALUES (v_row.unique_key, p_job_id) ON CONFLICT DO NOTHING;
    SELECT u.job_id INTO v_holder FROM unique_claims u WHERE u.unique_key = v_row.unique_key;
    IF v_holder <> p_job_id THEN
      RAISE EXCEPTION 'unique key % is held by job %', encode(v_row.unique_key, 'hex'), v_holder
        USING ERRCODE = 'AWU01', DETAIL = encode(v_row.unique_key, 'hex'), HINT = v_holder::text;
    END IF;
  END IF;
  IF v_state = 'scheduled' THEN
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, progress, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    VALUES (p_job_id, 'scheduled', v_row.kind, v_queue, v_priority, 0, v_row.args, v_row.metadata, v_row.tags, v_row.errors,
            v_row.progress, 0, v_row.original_run_lease, v_row.max_attempts, v_run_at, v_row.created_at,
            v_row.unique_key, v_row.unique_states);
    RETURN v_state;
  END IF;
  INSERT INTO lanes (queue, priority, shard) VALUES (v_queue, v_priority, 0) ON CONFLICT DO NOTHING;
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
  INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                     errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
  VALUES (v_ring.slot, v_ring.generation, p_job_id, v_row.kind, v_queue, v_priority, 0, nextval('lane_seq'),
          v_row.args, v_row.metadata, v_row.tags, v_row.errors, v_row.progress, 0, v_row.original_run_lease,
          v_row.max_attempts, v_run_at, v_row.created_at, v_row.unique_key, v_row.unique_states);
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', v_queue);
  RETURN v_state;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- finalize(items) -> (ord, applied, state) per item, as in 0016, except:
--   * dlq insert: ON CONFLICT (job_id) DO UPDATE when the entry is older than this attempt (the
--     newest attempt wins); an entry of this or a newer attempt leaves the item not applied.
--   * deferred insert: ON CONFLICT DO NOTHING; a job already there leaves the item not applied.
--   * an item with stale_before applies only if the attempt's last heartbeat (read after the
--     attempt lock) is older than it, or absent.
-- A not-applied item writes nothing: no closure, no terminal row, no key release; its attempt
-- stays open (rescue or the owner's next write decides it). So one item can never raise for the
-- batch: the remaining constraint violations (closures, terminal) are on keys this function is the
-- only writer of, under the attempt lock.
-- Locks: attempt locks for the distinct items, sorted, in one statement; then row inserts.
-- Input item: {job_id, run_lease, outcome, delay_ms?, message?, reason?, stale_before?}.
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
           x.stale_before
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x_e(v, o),
         jsonb_to_record(x_e.v) AS x(job_id bigint, run_lease bigint, outcome text, delay_ms bigint, message text, reason text,
                                     stale_before timestamptz)
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
           r.unique_key, r.unique_states, coalesce(a.progress, r.progress) AS progress, a.found AS has_state,
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

-- ---------------------------------------------------------------------------------------------
-- rescue(kind, staleness_ms, limit), as in 0006; a stale item carries its cutoff (stale_before),
-- so finalize leaves an attempt whose heartbeat committed after the scan alone.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.rescue(p_kind text, p_staleness_ms bigint, p_limit int)
RETURNS TABLE (job_id bigint, run_lease bigint, state text)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_cutoff timestamptz := now() - p_staleness_ms * interval '1 millisecond';
  v_items jsonb;
  v_row record;
BEGIN
  IF p_kind = 'stale' THEN
    WITH cand AS (
      SELECT c.job_id, c.run_lease, c.attempt FROM claims c
      LEFT JOIN attempt_state a ON a.job_id = c.job_id AND a.run_lease = c.run_lease
      WHERE c.claimed_at < v_cutoff AND (a.heartbeat_at IS NULL OR a.heartbeat_at < v_cutoff)
        AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
      ORDER BY c.claimed_at LIMIT p_limit
    )
    SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry',
             'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'heartbeat stale: worker presumed dead',
             'reason', 'stale_heartbeat', 'stale_before', v_cutoff))
      INTO v_items FROM cand;
  ELSE
    WITH cand AS (
      SELECT c.job_id, c.run_lease, c.attempt FROM claims c
      WHERE c.deadline_at < now()
        AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
      ORDER BY c.deadline_at LIMIT p_limit
    )
    SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry',
             'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'hard deadline exceeded',
             'reason', 'deadline_exceeded'))
      INTO v_items FROM cand;
  END IF;
  IF v_items IS NULL THEN
    RETURN;
  END IF;
  FOR v_row IN
    SELECT (v_items -> (f.ord - 1) ->> 'job_id')::bigint AS j, (v_items -> (f.ord - 1) ->> 'run_lease')::bigint AS l, f.state AS s
    FROM finalize(v_items) f WHERE f.applied
  LOOP
    PERFORM pg_notify('awa_cancel_:AWA_SCHEMA', v_row.j || ':' || v_row.l);
    job_id := v_row.j;
    run_lease := v_row.l;
    state := v_row.s;
    RETURN NEXT;
  END LOOP;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- cancel_job(id, reason), as in 0003, with 100 tries instead of 5 before SQLSTATE 40001. Each
-- try that does not return means another party changed the job between our read and our write
-- (promoted, claimed, closed) under our per-job lock; five such moves in a row are possible for a
-- job that retries quickly, and drain_queue would then abort as a whole.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.cancel_job(p_job_id bigint, p_reason text)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_job record;
  v_row record;
  v_ring record;
  v_try int;
  v_state text;
BEGIN
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  FOR v_try IN 1 .. 100 LOOP
    SELECT * INTO v_job FROM jobs j WHERE j.job_id = p_job_id;
    IF NOT FOUND THEN
      RETURN NULL;
    END IF;
    IF v_job.state IN ('completed', 'failed', 'cancelled') THEN
      RETURN 'terminal:' || v_job.state;
    END IF;

    IF v_job.state IN ('scheduled', 'retryable') THEN
      DELETE FROM deferred d WHERE d.job_id = p_job_id RETURNING d.* INTO v_row;
      IF FOUND THEN
        SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('terminal');
        INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                              kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
        VALUES (v_ring.slot, v_ring.generation, p_job_id, v_row.run_lease, 'cancelled', v_row.attempt, v_now,
                append_error(v_row.errors, jsonb_build_object('error', 'cancelled: ' || p_reason, 'attempt', v_row.attempt, 'at', v_now)),
                v_row.progress, true, v_row.kind, v_row.queue, v_row.priority, v_row.args, v_row.metadata, v_row.tags,
                v_row.max_attempts, v_row.run_at, v_row.created_at, v_row.unique_key, v_row.unique_states);
        DELETE FROM unique_claims u WHERE u.unique_key = v_row.unique_key AND u.job_id = p_job_id
          AND (v_row.unique_states & state_bit('cancelled')) = 0;
        RETURN 'cancelled';
      END IF;

    ELSIF v_job.state = 'running' THEN
      SELECT f.state INTO v_state
      FROM finalize(jsonb_build_array(jsonb_build_object('job_id', p_job_id, 'run_lease', v_job.run_lease,
                                                         'outcome', 'cancel', 'message', p_reason))) f
      WHERE f.applied;
      IF FOUND THEN
        PERFORM pg_notify('awa_cancel_:AWA_SCHEMA', p_job_id || ':' || v_job.run_lease);
        RETURN v_state;
      END IF;

    ELSIF v_job.state = 'available' THEN
      SELECT r.* INTO v_row FROM ready r
      WHERE r.job_id = p_job_id AND r.run_lease = v_job.run_lease
        AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.job_id = r.job_id AND c.lane_seq = r.lane_seq)
      ORDER BY r.lane_seq DESC LIMIT 1;
      IF FOUND THEN
        PERFORM pg_advisory_xact_lock(lock_ns('claim'), lane_key(v_row.queue, v_row.priority, v_row.shard));
        -- new statement after the claim lock: sees any claim that committed before we got it
        IF v_row.lane_seq >= lane_cursor(v_row.queue, v_row.priority, v_row.shard) THEN
          INSERT INTO ready_tombstones (slot, generation, job_id, queue, priority, shard, lane_seq)
          VALUES (v_row.slot, v_row.generation, p_job_id, v_row.queue, v_row.priority, v_row.shard, v_row.lane_seq);
          INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                                kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
          VALUES (v_row.slot, v_row.generation, p_job_id, v_row.run_lease, 'cancelled', v_row.attempt, v_now,
                  append_error(v_row.errors, jsonb_build_object('error', 'cancelled: ' || p_reason, 'attempt', v_row.attempt, 'at', v_now)),
                  v_row.progress, true, v_row.kind, v_row.queue, v_row.priority, v_row.args, v_row.metadata, v_row.tags,
                  v_row.max_attempts, v_row.run_at, v_row.created_at, v_row.unique_key, v_row.unique_states);
          DELETE FROM unique_claims u WHERE u.unique_key = v_row.unique_key AND u.job_id = p_job_id
            AND (v_row.unique_states & state_bit('cancelled')) = 0;
          RETURN 'cancelled';
        END IF;
      END IF;
    END IF;
    -- The job moved on between our read and our write (promoted, claimed, finished): look again.
  END LOOP;
  RAISE EXCEPTION 'cancel_job(%): job kept changing state', p_job_id USING ERRCODE = '40001';
END
$$;
