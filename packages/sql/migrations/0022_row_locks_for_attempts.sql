-- 0022: finalize, heartbeat and prune lock claims rows, not one advisory lock per attempt
-- (issue 13 item 4, review M4; docs/adr/0017-server-defaults.md).
--
-- A full finalize(512) held 512 advisory locks, one shared lock-table entry each, until commit
-- (586 entries in all); heartbeat(500) 500; prune one per open attempt of its slot (it failed with
-- 100k open attempts). A stock server's table holds 64 × max_connections entries for everyone:
-- twenty workers finalizing full batches at once needed ~11,700 of 6,400, and the server answered
-- "out of shared memory" to every session. Row locks live in the tuple header (a lock-only xmax,
-- no dead tuple, no lock-table entry except while a session waits for one), so:
--   finalize   FOR NO KEY UPDATE on the batch's claims rows, in (job_id, run_lease) order, in the
--              live slot ranges, re-reading the ranges until a prune did not move any in between;
--   heartbeat  FOR NO KEY UPDATE on its attempts' claims rows, same order (so a heartbeat and a
--              finalize of one attempt still take turns: no orphan attempt_state row);
--   prune      FOR UPDATE NOWAIT on its slot's open claims rows where it tried each attempt's
--              advisory lock (busy ⇒ Blocked:locked_attempt, as before).
-- The guarantees are those of the advisory locks: one finalizer per attempt at a time (the second
-- reads the first one's closure after its lock), and no carry of an attempt while its finalizer
-- or heartbeat runs. What changes: a lock-only heap update (and WAL record) per claims row locked,
-- and a finalizer waiting for a row prune holds the ring children's ACCESS SHARE, so that prune
-- gives up (Blocked:lock) instead of truncating; it tries again at the next tick.
-- Lock-table entries per call after this (PG 15, plan cached): finalize(512) 92 (74 outside the
-- fast path), heartbeat(500) 169; before: 586 and 604.

-- ---------------------------------------------------------------------------------------------
-- finalize: 0021's definition, row locks instead of per-attempt advisory locks.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.finalize(p_items jsonb)
RETURNS TABLE (ord int, applied boolean, state text)
LANGUAGE plpgsql
SET search_path = :AWA_SCHEMA, pg_catalog SET plan_cache_mode = force_generic_plan SET enable_seqscan = off SET enable_nestloop = off SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_ids bigint[];
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
  v_now_lo1 int;
  v_now_hi1 int;
  v_now_lo2 int;
  v_now_hi2 int;
BEGIN
  -- READ COMMITTED only (0019, docs/adr/0017-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'finalize needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  SELECT array_agg(DISTINCT i.job_id) INTO v_ids FROM jsonb_to_recordset(p_items) AS i(job_id bigint);
  -- The batch's claims rows, locked in (job_id, run_lease) order (0022: a row lock takes no
  -- shared lock-table entry; the per-attempt advisory lock took one per item). Prune tries the
  -- same rows (FOR UPDATE NOWAIT) before it carries or truncates, so once we hold them they stay
  -- in these slots. A prune that committed between our range read and our lock statement may
  -- have carried some, and it changed the ranges: read them again, lock in the new ranges, until
  -- they hold still. After the loop each claim is in a slot of these ranges, or gone with its
  -- pruned slot (stale either way).
  LOOP
    SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_lo1, v_hi1, v_lo2, v_hi2 FROM queue_slot_ranges() s;
    PERFORM 1 FROM claims c
    WHERE c.job_id = ANY (v_ids) AND (c.slot BETWEEN v_lo1 AND v_hi1 OR c.slot BETWEEN v_lo2 AND v_hi2)
    ORDER BY c.job_id, c.run_lease
    FOR NO KEY UPDATE OF c;
    SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_now_lo1, v_now_hi1, v_now_lo2, v_now_hi2 FROM queue_slot_ranges() s;
    EXIT WHEN v_now_lo1 = v_lo1 AND v_now_hi1 = v_hi1 AND v_now_lo2 = v_lo2 AND v_now_hi2 = v_hi2;
  END LOOP;

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
-- heartbeat: 0021's definition, row locks instead of per-attempt advisory locks.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.heartbeat(p_items jsonb)
RETURNS TABLE (job_id bigint, run_lease bigint)
LANGUAGE plpgsql
SET search_path = :AWA_SCHEMA, pg_catalog SET enable_hashjoin = off SET enable_mergejoin = off SET jit = off AS $$
#variable_conflict use_column
DECLARE
BEGIN
  -- READ COMMITTED only (0019, docs/adr/0017-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'heartbeat needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  -- The attempts' claims rows, locked in (job_id, run_lease) order as finalize locks them (0022:
  -- row locks instead of one advisory lock per attempt): a heartbeat and a finalize of the same
  -- attempt take turns, so no attempt_state row outlives its attempt. A carried claim is found
  -- wherever it is (no slot restriction); prune cannot carry one we hold.
  PERFORM 1 FROM claims c
  WHERE (c.job_id, c.run_lease) IN (SELECT i.job_id, i.run_lease FROM jsonb_to_recordset(p_items) AS i(job_id bigint, run_lease bigint))
  ORDER BY c.job_id, c.run_lease
  FOR NO KEY UPDATE OF c;
  RETURN QUERY
  WITH items AS (
    SELECT DISTINCT ON (x.job_id, x.run_lease) x.job_id, x.run_lease, x.progress,
           EXISTS (SELECT 1 FROM claims c WHERE c.job_id = x.job_id AND c.run_lease = x.run_lease)
           AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = x.job_id AND z.run_lease = x.run_lease) AS open
    FROM jsonb_to_recordset(p_items) AS x(job_id bigint, run_lease bigint, progress jsonb)
    ORDER BY x.job_id, x.run_lease
  ),
  up AS (
    INSERT INTO attempt_state AS a (job_id, run_lease, heartbeat_at, progress)
    SELECT i.job_id, i.run_lease, now(), i.progress FROM items i WHERE i.open
    ON CONFLICT (job_id, run_lease) DO UPDATE
      SET heartbeat_at = excluded.heartbeat_at, progress = coalesce(excluded.progress, a.progress)
  )
  SELECT i.job_id, i.run_lease FROM items i WHERE NOT i.open;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- prune_queue: 0021's definition, row locks instead of per-attempt advisory locks.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.prune_queue(p_lock_timeout_ms int, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
RETURNS TABLE (outcome text, generation bigint, carried int)
LANGUAGE plpgsql
SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots('queue');
  v_cur record;
  v_hist record;
  v_old bigint;
  v_slot int;
  v_open_claims claims[];
  v_open_ready ready[];
  v_kept history[];
  v_copy record;
  v_copied boolean;
  v_count bigint;
  -- below this many rows to keep, inserting them under the lock costs less than a second commit
  v_copy_ahead_rows constant int := 1000;
  v_rollup jsonb;
  v_keys jsonb;
  v_children text;
  v_deadline timestamptz;
  v_saved_timeout text := current_setting('lock_timeout');
  v_saved_nestloop text := current_setting('enable_nestloop');
BEGIN
  -- READ COMMITTED only (0019, docs/adr/0017-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'prune_queue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
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
  -- The open attempts' claims rows, tried (0022: row locks, where each attempt took one advisory
  -- lock-table entry, which failed with 100k open attempts): a finalizer or heartbeat holding one
  -- makes us back off; holding them, no finalizer can write into this slot until we commit. A
  -- row lock taken in the block is released if it fails (sub-transaction), kept if it succeeds.
  BEGIN
    PERFORM 1 FROM claims c
    WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
    FOR UPDATE OF c NOWAIT;
  EXCEPTION WHEN lock_not_available THEN
    RETURN QUERY SELECT 'Blocked:locked_attempt', v_old, 0;
    RETURN;
  END;

  v_children := format('%1$I.ready_%2$s, %1$I.ready_tombstones_%2$s, %1$I.claims_%2$s, %1$I.claim_marks_%2$s, %1$I.closures_%2$s, %1$I.terminal_%2$s',
                       ':AWA_SCHEMA', v_slot);
  -- Freeze the slot: SHARE waits for writers still inserting into it and keeps new ones out until
  -- commit, but does not conflict with the ACCESS SHARE of claimers and readers. A queued SHARE
  -- request does not hold up later readers either (only ACCESS EXCLUSIVE conflicts with them).
  BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    EXECUTE 'LOCK TABLE ' || v_children || ' IN SHARE MODE';
  EXCEPTION WHEN lock_not_available THEN
    RETURN QUERY SELECT 'Blocked:lock', v_old, 0;
    RETURN;
  END;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);

  -- Re-proof: rows committed while we waited for SHARE are visible now, and no more can come.
  IF slot_has_unclaimed(v_slot) THEN
    RETURN QUERY SELECT 'Blocked:unclaimed', v_old, 0;
    RETURN;
  END IF;

  -- Everything below up to the exclusive lock only reads: a prune that gives up writes nothing.
  -- Open attempts: claims without a closure (ours since step 3, or claimed after it from rows
  -- that arrived late; either way their finalizers need the slot, which is frozen).
  SELECT array_agg(c) INTO v_open_claims FROM claims c
  WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease);
  IF v_open_claims IS NOT NULL THEN
    SELECT array_agg(r) INTO v_open_ready
    FROM unnest(v_open_claims) o
    JOIN ready r ON r.slot = v_slot AND r.queue = o.queue AND r.priority = o.priority AND r.shard = o.shard AND r.lane_seq = o.lane_seq;
  END IF;

  -- The terminal rows: judged here, or already copied ahead by an earlier call (see below). The
  -- slot is frozen, so if it still holds as many terminal rows as the copy saw, they are the same
  -- rows (ring tables are append-only) and the copy's roll-up and keys stand.
  SELECT * INTO v_copy FROM history_copies hc WHERE hc.generation = v_old;
  v_copied := FOUND;
  IF v_copied THEN
    EXECUTE format('SELECT count(*) FROM %I.terminal_%s', ':AWA_SCHEMA', v_slot) INTO v_count;
  END IF;
  IF v_copied AND v_count = v_copy.terminal_rows THEN
    v_rollup := v_copy.rollup;
    v_keys := v_copy.keys;
  ELSE
    -- Judge: widened from their ready row when narrow; kept if inside their state's retention.
    -- After a copy ahead (rows arrived since: rare), rows already in history are neither copied
    -- again nor have their keys released (the history copy holds them).
    -- Fresh ring children have no statistics (estimates of a few rows), so the planner joins
    -- terminal to ready with a nested loop over a seq scan: O(n²), 0.56 s for 2,000 rows. A hash
    -- join is linear whatever the estimates.
    PERFORM set_config('enable_nestloop', 'off', true);
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
    judged AS MATERIALIZED (
      SELECT w.*, w.finalized_at > now() - retention(w.state, w.queue, p_completed_ms, p_failed_ms, p_cancelled_ms) AS keep,
             v_copied AND EXISTS (SELECT 1 FROM history h WHERE h.job_id = w.job_id AND h.run_lease = w.run_lease
                                    AND h.state = w.state AND h.finalized_at = w.finalized_at) AS in_history
      FROM wide w
    )
    SELECT (SELECT array_agg(ROW(0, 0, j.job_id, j.run_lease, j.state, j.attempt, j.max_attempts, j.kind, j.queue, j.priority,
                                 j.args, j.metadata, j.tags, j.errors, j.progress, j.run_at, j.created_at, j.finalized_at,
                                 j.unique_key, j.unique_states)::history)
            FROM judged j WHERE j.keep AND NOT j.in_history),
           (SELECT jsonb_object_agg(k, n) FROM (SELECT j.queue || ':' || j.state AS k, count(*) AS n FROM judged j GROUP BY 1) c),
           (SELECT jsonb_agg(jsonb_build_object('job_id', j.job_id, 'run_lease', j.run_lease, 'finalized_at', j.finalized_at,
                                                'unique_key', encode(j.unique_key, 'hex')))
            FROM judged j WHERE NOT j.keep AND NOT j.in_history AND j.unique_key IS NOT NULL),
           (SELECT count(*) FROM judged)
      INTO v_kept, v_rollup, v_keys, v_count;
    PERFORM set_config('enable_nestloop', v_saved_nestloop, true);

    -- Copy ahead: many rows to keep, and nothing left in the slot that could still add a terminal
    -- row (no open attempt). Insert them into history now and COMMIT (the caller calls again at
    -- once): under the exclusive lock the next call then only truncates, instead of inserting
    -- every row (0.9 s for 100k rows). The copy is committed, never rolled back, and recorded in
    -- history_copies, so a later call reuses it instead of copying again: no dead tuples either way.
    IF NOT v_copied AND v_open_claims IS NULL AND coalesce(cardinality(v_kept), 0) >= v_copy_ahead_rows THEN
      SELECT * INTO v_hist FROM ring_current('history');
      INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                           metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
      SELECT v_hist.slot, v_hist.generation, h.job_id, h.run_lease, h.state, h.attempt, h.max_attempts, h.kind, h.queue, h.priority,
             h.args, h.metadata, h.tags, h.errors, h.progress, h.run_at, h.created_at, h.finalized_at, h.unique_key, h.unique_states
      FROM unnest(v_kept) h;
      INSERT INTO history_copies (generation, slot, terminal_rows, rollup, keys)
      VALUES (v_old, v_slot, v_count, coalesce(v_rollup, '{}'), v_keys);
      RETURN QUERY SELECT 'Copied', v_old, 0;
      RETURN;
    END IF;
  END IF;

  -- ACCESS EXCLUSIVE, never queued: a waiting request would make every later claimer wait behind
  -- it (they all read this slot's children). NOWAIT succeeds in a moment when no reader holds the
  -- children; between tries we sleep about a millisecond, so readers come and go freely.
  v_deadline := clock_timestamp() + p_lock_timeout_ms * interval '1 millisecond';
  LOOP
    BEGIN
      EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE NOWAIT';
      EXIT;
    EXCEPTION WHEN lock_not_available THEN
      IF clock_timestamp() >= v_deadline THEN
        RETURN QUERY SELECT 'Blocked:lock', v_old, 0;
        RETURN;
      END IF;
    END;
    PERFORM pg_sleep(0.001);
  END LOOP;

  -- Under the exclusive lock: only the writes.
  IF v_open_claims IS NOT NULL THEN
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_cur.slot, v_cur.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata, r.tags,
           r.errors, r.progress, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.unique_key, r.unique_states
    FROM unnest(v_open_ready) r;
    INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at)
    SELECT v_cur.slot, v_cur.generation, o.job_id, o.run_lease, o.attempt, o.queue, o.priority, o.shard, o.lane_seq, o.claimed_at, o.deadline_at
    FROM unnest(v_open_claims) o;
    -- the lane's cursor is past every carried row (they were claimed); a mark at it keeps it there
    -- once this slot's marks are gone
    INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
    SELECT v_cur.slot, v_cur.generation, l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard)
    FROM (SELECT DISTINCT o.queue, o.priority, o.shard FROM unnest(v_open_claims) o) l;
  END IF;

  IF v_kept IS NOT NULL THEN
    SELECT * INTO v_hist FROM ring_current('history');
    INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                         metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
    SELECT v_hist.slot, v_hist.generation, h.job_id, h.run_lease, h.state, h.attempt, h.max_attempts, h.kind, h.queue, h.priority,
           h.args, h.metadata, h.tags, h.errors, h.progress, h.run_at, h.created_at, h.finalized_at, h.unique_key, h.unique_states
    FROM unnest(v_kept) h;
  END IF;

  IF v_keys IS NOT NULL THEN
    PERFORM release_keys_of(v_keys);
  END IF;
  EXECUTE 'TRUNCATE ' || v_children;
  INSERT INTO ring_prunes (ring, generation, slot, rollup) VALUES ('queue', v_old, v_slot, coalesce(v_rollup, '{}'));
  RETURN QUERY SELECT 'Pruned', v_old, coalesce(cardinality(v_open_claims), 0);
END
$$;

