-- 0040: maintenance that costs what it finds (issue 17). Measured with pg_stat_statements from
-- the first claim to the last completion of a 20,000-job drain (embedded PostgreSQL 17), these
-- duties of a new leader cost ~0.5 s of server time beside ~3 s for claim and finalize, and found
-- nothing to do. Each change is marked "-- 0040".
--
-- 1. prune_queue (the eight-argument form; 0039's text): the young-attempts test walks the
--    slot's claims newest first and stops at the first open one (a scalar subquery ordered by
--    claimed_at DESC, LIMIT 1: claims_claimed_at_idx scanned backwards). Same answer.
-- 2. claim_resumed (0034's text): returns at once when no attempt_state row is resumed and
--    waiting (the attempt_state_resumed partial index), before its statement over claims,
--    closures and ready is planned: 40-80 ms on a connection's first call, 16 children each.
-- 3. rescue (0036's text): the 'callback' kind returns at once when no pending callback is past
--    its timeout (the attempt_state_callback_timeout partial index), for the same reason.
--
-- The tests (PgQueueStorage.maintenanceCost.test.ts) count index scans in one transaction.
-- Locks, guards and writes: unchanged. A gate reads a snapshot taken a moment before the
-- statement it skips would have; a row committed in between is the one committed just after,
-- which the next call (a notification or the next tick) takes, as before.

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.prune_queue(p_lock_timeout_ms integer, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint, p_carry_after_ms bigint, p_force_timeout_ms integer, p_carry_rows integer, p_end_idle_ms bigint)
 RETURNS TABLE(outcome text, generation bigint, carried integer, moved integer, parked integer)
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off
AS $$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots('queue');
  v_cur record;
  v_hist record;
  v_old bigint;
  v_slot int;
  v_attempt record;
  v_open_claims claims[];
  v_open_ready ready[];
  v_kept history[];
  v_copy record;
  v_copied boolean;
  v_count bigint;
  -- below this many rows to keep, inserting them under the lock costs less than a second commit
  v_copy_ahead_rows constant int := 1000;
  v_lane_head int := greatest(1, p_carry_rows / 2);
  v_rollup jsonb;
  v_keys jsonb;
  v_children text;
  v_deadline timestamptz;
  v_forced boolean := p_force_timeout_ms > 0;
  v_timeout int := CASE WHEN p_force_timeout_ms > 0 THEN p_force_timeout_ms ELSE p_lock_timeout_ms END;
  v_moved int := 0;
  v_parked int := 0;
  v_locked boolean := false;
  v_saved_timeout text := current_setting('lock_timeout');
  v_saved_nestloop text := current_setting('enable_nestloop');
  v_saved_sort text := current_setting('enable_sort'); -- 0040
  v_young boolean; -- 0040
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'prune_queue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext('queue')) THEN
    RETURN QUERY SELECT 'Blocked:busy', NULL::bigint, 0, 0, 0;
    RETURN;
  END IF;
  SELECT * INTO v_cur FROM ring_current('queue');
  SELECT min(g.g) INTO v_old
  FROM generate_series(greatest(0, v_cur.generation - v_n + 1), v_cur.generation - 1) AS g(g)
  WHERE NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = g.g);
  IF v_old IS NULL THEN
    RETURN QUERY SELECT 'Noop', NULL::bigint, 0, 0, 0;
    RETURN;
  END IF;
  v_slot := (v_old % v_n)::int;

  -- An attempt claimed moments ago will most likely close by itself (0014).
  -- 0040: newest claim first, the first open one answers. Unordered, the EXISTS walked the
  -- window from its oldest claim, and in a slot being drained those are all closed: a probe of
  -- closures per claim of the last p_carry_after_ms (57-100 ms per prune tick in a 20,000-job
  -- drain), every tick until the drain ended. The newest claims are the open ones.
  -- A scalar subquery, not EXISTS: the planner drops an EXISTS subquery's ORDER BY and LIMIT.
  -- Sorting off while it is planned: a sort would take the anti-join's every row first (the
  -- planner picks one when the slot's child has no statistics yet).
  PERFORM set_config('enable_sort', 'off', true); -- 0040
  v_young := p_carry_after_ms > 0 AND coalesce(( -- 0040
    SELECT true FROM claims c
    WHERE c.slot = v_slot AND c.claimed_at > now() - p_carry_after_ms * interval '1 millisecond'
      AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
    ORDER BY c.claimed_at DESC LIMIT 1 -- 0040
  ), false);
  PERFORM set_config('enable_sort', v_saved_sort, true); -- 0040
  IF v_young THEN -- 0040
    RETURN QUERY SELECT 'Blocked:young_attempts', v_old, 0, 0, 0;
    RETURN;
  END IF;
  -- 0028: the open attempts' claims rows, tried FOR UPDATE NOWAIT, where each attempt's advisory
  -- lock was tried (one lock-table entry per open attempt; 100k open attempts failed): a
  -- finalizer or heartbeat holding one makes us back off; holding them, none can write for these
  -- attempts until we commit. A row lock taken in the block is released if it fails
  -- (sub-transaction), kept if it succeeds.
  BEGIN -- 0028
    PERFORM 1 FROM claims c
    WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
    ORDER BY c.job_id, c.run_lease
    FOR UPDATE OF c NOWAIT;
  EXCEPTION WHEN lock_not_available THEN -- 0028
    RETURN QUERY SELECT 'Blocked:locked_attempt', v_old, 0, 0, 0;
    RETURN;
  END;

  v_children := format('%1$I.ready_%2$s, %1$I.ready_tombstones_%2$s, %1$I.claims_%2$s, %1$I.claim_marks_%2$s, %1$I.closures_%2$s, %1$I.terminal_%2$s',
                       'awa', v_slot);
  -- Freeze the slot (SHARE: waits out writers, keeps new ones out, blocks no reader).
  BEGIN
    PERFORM set_config('lock_timeout', v_timeout || 'ms', true);
    EXECUTE 'LOCK TABLE ' || v_children || ' IN SHARE MODE';
  EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
    IF v_forced AND p_end_idle_ms > 0 THEN
      PERFORM end_idle_blockers(v_slot, p_end_idle_ms);
    END IF;
    RETURN QUERY SELECT 'Blocked:lock', v_old, 0, 0, 0;
    RETURN;
  END;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);

  -- Open attempts: claims without a closure (ours since the tried locks, or claimed after them
  -- from rows that arrived late; either way their finalizers need the slot, which is frozen).
  SELECT array_agg(c) INTO v_open_claims FROM claims c
  WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease);
  IF v_open_claims IS NOT NULL THEN
    SELECT array_agg(r) INTO v_open_ready
    FROM unnest(v_open_claims) o
    JOIN ready r ON r.slot = v_slot AND r.queue = o.queue AND r.priority = o.priority AND r.shard = o.shard AND r.lane_seq = o.lane_seq;
  END IF;

  -- The terminal rows: judged here, or already copied ahead by an earlier call (0013).
  SELECT * INTO v_copy FROM history_copies hc WHERE hc.generation = v_old;
  v_copied := FOUND;
  IF v_copied THEN
    EXECUTE format('SELECT count(*) FROM %I.terminal_%s', 'awa', v_slot) INTO v_count;
  END IF;
  IF v_copied AND v_count = v_copy.terminal_rows THEN
    v_rollup := v_copy.rollup;
    v_keys := v_copy.keys;
  ELSE
    PERFORM set_config('enable_nestloop', 'off', true);
    -- After a copy ahead the judging reads history while we hold the slot frozen: a history
    -- prune's exclusive lock may make it wait at most lock_timeout (then an error: nothing was
    -- written), never as long as that prune runs (review M6).
    IF v_copied THEN
      PERFORM set_config('lock_timeout', v_timeout || 'ms', true);
    END IF;
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
      -- 0039: = retention(w.state, w.queue, ...), with the queue's overrides joined once: the SQL
      -- function (its FROM keeps it from being inlined) ran per terminal row, ~9 us each
      SELECT w.*, w.finalized_at > now() - CASE w.state
                                             WHEN 'completed' THEN coalesce(m.completed_retention, p_completed_ms * interval '1 millisecond')
                                             WHEN 'failed' THEN coalesce(m.failed_retention, p_failed_ms * interval '1 millisecond')
                                             ELSE coalesce(m.cancelled_retention, p_cancelled_ms * interval '1 millisecond') END AS keep,
             v_copied AND EXISTS (SELECT 1 FROM history h WHERE h.job_id = w.job_id AND h.run_lease = w.run_lease
                                    AND h.state = w.state AND h.finalized_at = w.finalized_at) AS in_history
      FROM wide w
      LEFT JOIN queue_meta m ON m.queue = w.queue -- 0039
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
    PERFORM set_config('lock_timeout', v_saved_timeout, true);

    IF NOT v_copied AND v_open_claims IS NULL AND coalesce(cardinality(v_kept), 0) >= v_copy_ahead_rows THEN
      SELECT * INTO v_hist FROM ring_current('history');
      INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                           metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
      SELECT v_hist.slot, v_hist.generation, h.job_id, h.run_lease, h.state, h.attempt, h.max_attempts, h.kind, h.queue, h.priority,
             h.args, h.metadata, h.tags, h.errors, h.progress, h.run_at, h.created_at, h.finalized_at, h.unique_key, h.unique_states
      FROM unnest(v_kept) h;
      INSERT INTO history_copies (generation, slot, terminal_rows, rollup, keys)
      VALUES (v_old, v_slot, v_count, coalesce(v_rollup, '{}'), v_keys);
      RETURN QUERY SELECT 'Copied', v_old, 0, 0, 0;
      RETURN;
    END IF;
  END IF;

  -- Park ahead: when more of the residue is to be parked than one prune may carry, move it to
  -- parked now, in a transaction of its own (committed, so a prune that then fails to get its
  -- exclusive lock undoes nothing and leaves no dead tuple), and tombstone the ring rows ("moved"),
  -- under each such lane's claim lock (tried: a claimer at work makes us skip this and park under
  -- the exclusive lock instead), so no claim of the lane is in flight while its rows move. The
  -- caller calls again at once ('Parked'); the exclusive phase then only carries, at most
  -- p_carry_rows rows, instead of inserting the whole backlog while every reader waits.
  -- Writes: parked, ready_tombstones (this slot, ROW EXCLUSIVE: compatible with our own SHARE).
  WITH lanes AS MATERIALIZED (
    SELECT l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard) AS c
    FROM (SELECT DISTINCT r.queue, r.priority, r.shard FROM ready r WHERE r.slot = v_slot) l
  )
  SELECT count(*) INTO v_count FROM (
    SELECT 1 FROM lanes l
    JOIN ready r ON r.slot = v_slot AND r.queue = l.queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
    WHERE NOT EXISTS (SELECT 1 FROM ready_tombstones t
                      WHERE t.slot = v_slot AND t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                        AND t.lane_seq = r.lane_seq)
    LIMIT 2 * greatest(p_carry_rows, 1) + 1) x;
  IF v_count > 2 * greatest(p_carry_rows, 1) THEN
    FOR v_attempt IN
      SELECT DISTINCT r.queue, r.priority, r.shard FROM ready r WHERE r.slot = v_slot ORDER BY 1, 2, 3
    LOOP
      IF NOT pg_try_advisory_xact_lock(lock_ns('claim'), lane_key(v_attempt.queue, v_attempt.priority, v_attempt.shard)) THEN
        v_count := -1;
        EXIT;
      END IF;
    END LOOP;
    IF v_count > 0 THEN
      WITH lanes AS MATERIALIZED (
        SELECT l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard) AS c,
               (SELECT min(p.lane_seq) FROM parked p WHERE p.queue = l.queue AND p.priority = l.priority AND p.shard = l.shard) AS barrier,
               EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = l.queue AND m.paused) AS paused
        FROM (SELECT DISTINCT r.queue, r.priority, r.shard FROM ready r WHERE r.slot = v_slot) l
      ),
      residue AS MATERIALIZED (
        SELECT r.*, l.c, l.barrier, l.paused,
               row_number() OVER (PARTITION BY r.queue, r.priority, r.shard ORDER BY r.lane_seq) AS n
        FROM ready r JOIN lanes l ON l.queue = r.queue AND l.priority = r.priority AND l.shard = r.shard
        WHERE r.slot = v_slot AND r.lane_seq >= l.c
          AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                          WHERE t.slot = v_slot AND t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq = r.lane_seq)
      ),
      decided AS MATERIALIZED (
        SELECT x.*,
               x.candidate AND row_number() OVER (PARTITION BY x.candidate ORDER BY x.n, x.queue, x.priority, x.shard) <= p_carry_rows AS carry
        FROM (SELECT s.*, NOT s.paused AND s.n <= v_lane_head AND (s.barrier IS NULL OR s.lane_seq < s.barrier) AS candidate
              FROM residue s) x
      ),
      ins_park AS (
        INSERT INTO parked (job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags, errors, progress, attempt,
                            run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
        SELECT d.job_id, d.kind, d.queue, d.priority, d.shard, d.lane_seq, d.args, d.metadata, d.tags, d.errors, d.progress,
               d.attempt, d.run_lease, d.max_attempts, d.run_at, d.created_at, d.unique_key, d.unique_states
        FROM decided d WHERE NOT d.carry
      )
      INSERT INTO ready_tombstones (slot, generation, job_id, queue, priority, shard, lane_seq)
      SELECT v_slot, d.generation, d.job_id, d.queue, d.priority, d.shard, d.lane_seq FROM decided d WHERE NOT d.carry;
      GET DIAGNOSTICS v_parked = ROW_COUNT;
      RETURN QUERY SELECT 'Parked', v_old, 0, 0, v_parked;
      RETURN;
    END IF;
  END IF;

  -- ACCESS EXCLUSIVE. Normally never queued (a waiting request makes every later reader of the
  -- slot's children wait behind it): NOWAIT, retried about every millisecond. Forced: queued,
  -- for at most the force timeout.
  IF v_forced THEN
    -- Queued, but for the parents only: ACCESS EXCLUSIVE on the claim_marks and claims parent
    -- tables themselves (ONLY: not their children). Every reader of the slot's children locks one of
    -- these parents before any child (claim's cursor statement reads claim_marks first; the jobs
    -- view, finalize, heartbeat and rescue read claims before any other ring table), so the request
    -- waits for the readers in flight, however long, and readers that come after it queue at the
    -- parent holding no child. Waiting for the children instead would take them one by one, and a
    -- reader that locks them in another order (PostgreSQL 15 and 17 differ) would hold one child
    -- while waiting for another we hold: a deadlock whose victim may be the reader. Then the
    -- children, without waiting (the readers in flight are gone). A cycle is still possible with a
    -- session that waits for our SHARE or attempt locks while holding a parent (a claim picking
    -- this slot's residue, rescue, cancel_job): the deadlock detector breaks it, and a prune that
    -- loses answers Blocked:lock. Readers stall for the wait at most (the force timeout).
    v_deadline := clock_timestamp() + p_force_timeout_ms * interval '1 millisecond';
    BEGIN
      PERFORM set_config('lock_timeout', p_force_timeout_ms || 'ms', true);
      EXECUTE format('LOCK TABLE ONLY %1$I.claim_marks, ONLY %1$I.claims IN ACCESS EXCLUSIVE MODE', 'awa');
      LOOP
        BEGIN
          EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE NOWAIT';
          v_locked := true;
          EXIT;
        EXCEPTION WHEN lock_not_available THEN
          EXIT WHEN clock_timestamp() >= v_deadline;
        END;
        PERFORM pg_sleep(0.001);
      END LOOP;
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
      v_locked := false;
    END;
    IF NOT v_locked THEN
      IF p_end_idle_ms > 0 THEN
        PERFORM end_idle_blockers(v_slot, p_end_idle_ms);
      END IF;
      RETURN QUERY SELECT 'Blocked:lock', v_old, 0, 0, 0;
      RETURN;
    END IF;
  ELSE
    v_deadline := clock_timestamp() + p_lock_timeout_ms * interval '1 millisecond';
    LOOP
      BEGIN
        EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE NOWAIT';
        EXIT;
      EXCEPTION WHEN lock_not_available THEN
        IF clock_timestamp() >= v_deadline THEN
          RETURN QUERY SELECT 'Blocked:lock', v_old, 0, 0, 0;
          RETURN;
        END IF;
      END;
      PERFORM pg_sleep(0.001);
    END LOOP;
  END IF;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);

  -- Under the exclusive lock: only the writes.
  IF v_open_claims IS NOT NULL THEN
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_cur.slot, v_cur.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata, r.tags,
           r.errors, r.progress, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.unique_key, r.unique_states
    FROM unnest(v_open_ready) r;
    INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at,
                        key_policy, key_digest) -- 0033
    SELECT v_cur.slot, v_cur.generation, o.job_id, o.run_lease, o.attempt, o.queue, o.priority, o.shard, o.lane_seq, o.claimed_at, o.deadline_at,
           o.key_policy, o.key_digest -- 0033
    FROM unnest(v_open_claims) o;
    INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
    SELECT v_cur.slot, v_cur.generation, l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard)
    FROM (SELECT DISTINCT o.queue, o.priority, o.shard FROM unnest(v_open_claims) o) l;
  END IF;

  -- The residue: ready rows a claimer could still take (at or beyond the lane's cursor, not
  -- tombstoned). The slot is frozen, and no claim of its rows can commit before we do (they need
  -- ROW EXCLUSIVE on its claims child), so this is the residue the truncate would drop. Each row
  -- is carried (same position, current slot) or parked; rows of one lane are decided in position
  -- order, so a lane's carried rows are a prefix of its residue and lie below its new barrier.
  WITH lanes AS MATERIALIZED (
    SELECT l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard) AS c,
           (SELECT min(p.lane_seq) FROM parked p WHERE p.queue = l.queue AND p.priority = l.priority AND p.shard = l.shard) AS barrier,
           EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = l.queue AND m.paused) AS paused
    FROM (SELECT DISTINCT r.queue, r.priority, r.shard FROM ready r WHERE r.slot = v_slot) l
  ),
  residue AS MATERIALIZED (
    SELECT r.*, l.c, l.barrier, l.paused,
           row_number() OVER (PARTITION BY r.queue, r.priority, r.shard ORDER BY r.lane_seq) AS n
    FROM ready r JOIN lanes l ON l.queue = r.queue AND l.priority = r.priority AND l.shard = r.shard
    WHERE r.slot = v_slot AND r.lane_seq >= l.c
      AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                      WHERE t.slot = v_slot AND t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                        AND t.lane_seq = r.lane_seq)
  ),
  decided AS MATERIALIZED (
    SELECT x.*,
           x.candidate AND row_number() OVER (PARTITION BY x.candidate ORDER BY x.n, x.queue, x.priority, x.shard) <= p_carry_rows AS carry
    FROM (SELECT s.*, NOT s.paused AND s.n <= v_lane_head AND (s.barrier IS NULL OR s.lane_seq < s.barrier) AS candidate
          FROM residue s) x
  ),
  ins_carry AS (
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_cur.slot, v_cur.generation, d.job_id, d.kind, d.queue, d.priority, d.shard, d.lane_seq, d.args, d.metadata, d.tags,
           d.errors, d.progress, d.attempt, d.run_lease, d.max_attempts, d.run_at, d.created_at, d.unique_key, d.unique_states
    FROM decided d WHERE d.carry
  ),
  ins_park AS (
    INSERT INTO parked (job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags, errors, progress, attempt,
                        run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT d.job_id, d.kind, d.queue, d.priority, d.shard, d.lane_seq, d.args, d.metadata, d.tags, d.errors, d.progress,
           d.attempt, d.run_lease, d.max_attempts, d.run_at, d.created_at, d.unique_key, d.unique_states
    FROM decided d WHERE NOT d.carry
  ),
  -- the lane's cursor may come from a mark in this slot: keep it where it is
  ins_marks AS (
    INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
    SELECT v_cur.slot, v_cur.generation, l.queue, l.priority, l.shard, l.c
    FROM lanes l
    WHERE l.c > 0 AND EXISTS (SELECT 1 FROM decided d WHERE d.carry AND d.queue = l.queue AND d.priority = l.priority AND d.shard = l.shard)
  )
  SELECT count(*) FILTER (WHERE d.carry), count(*) FILTER (WHERE NOT d.carry) INTO v_moved, v_parked FROM decided d;

  IF v_kept IS NOT NULL THEN
    SELECT * INTO v_hist FROM ring_current('history');
    INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                         metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
    SELECT v_hist.slot, v_hist.generation, h.job_id, h.run_lease, h.state, h.attempt, h.max_attempts, h.kind, h.queue, h.priority,
           h.args, h.metadata, h.tags, h.errors, h.progress, h.run_at, h.created_at, h.finalized_at, h.unique_key, h.unique_states
    FROM unnest(v_kept) h;
  END IF;
  -- Keys are released after this commits (release_pending_keys), not under the lock.
  IF v_keys IS NOT NULL THEN
    INSERT INTO pending_key_releases (ring, generation, keys) VALUES ('queue', v_old, v_keys);
  END IF;
  EXECUTE 'TRUNCATE ' || v_children;
  INSERT INTO ring_prunes (ring, generation, slot, rollup) VALUES ('queue', v_old, v_slot, coalesce(v_rollup, '{}'));
  RETURN QUERY SELECT 'Pruned', v_old, coalesce(cardinality(v_open_claims), 0), v_moved, v_parked;
END
$$;


-- ---------------------------------------------------------------------------------------------
-- claim_resumed: 0034's text, lines marked 0040.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.claim_resumed(p_queue text, p_max int)
RETURNS TABLE (job_id bigint, run_lease bigint, kind text, queue text, priority smallint, attempt int, max_attempts int,
               args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamptz, created_at timestamptz,
               claimed_at timestamptz, progress jsonb, callback_result jsonb)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim_resumed needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  -- 0040: nothing resumed is waiting (the usual answer): return before the statement below is
  -- planned (claims, closures and ready: 16 children each, 40-80 ms on a connection's first call).
  IF NOT EXISTS (SELECT 1 FROM attempt_state a WHERE a.callback_waiting AND a.callback_state = 'resumed') THEN -- 0040
    RETURN; -- 0040
  END IF; -- 0040
  -- One statement. A writer of attempt_state holds the claims row while it writes, so a row we
  -- lock here is not being changed; one changed and committed after our snapshot (a take, a
  -- finalize deleting the row) is caught by the UPDATE, which re-checks its WHERE on the newest
  -- version of each attempt_state row.
  RETURN QUERY
  WITH locked AS MATERIALIZED (
    SELECT c.job_id, c.run_lease, c.attempt, c.claimed_at, c.slot, c.queue, c.priority, c.shard, c.lane_seq
    FROM claims c
    WHERE (c.job_id, c.run_lease) IN (SELECT a.job_id, a.run_lease FROM attempt_state a
                                      WHERE a.callback_waiting AND a.callback_state = 'resumed')
      AND c.queue = p_queue
      AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
    ORDER BY c.job_id, c.run_lease
    LIMIT p_max
    FOR NO KEY UPDATE OF c SKIP LOCKED
  ),
  taken AS (
    UPDATE attempt_state a SET callback_waiting = false, heartbeat_at = now(), callback_id = NULL,
                               callback_state = NULL, callback_timeout_at = NULL, callback_config = NULL
    FROM locked l
    WHERE a.job_id = l.job_id AND a.run_lease = l.run_lease AND a.callback_waiting AND a.callback_state = 'resumed'
    RETURNING a.job_id, a.run_lease, a.callback_result, a.progress
  )
  SELECT t.job_id, t.run_lease, r.kind, r.queue, r.priority, l.attempt, r.max_attempts, r.args, r.metadata, r.tags,
         r.errors, r.run_at, r.created_at, l.claimed_at, coalesce(t.progress, r.progress), t.callback_result
  FROM taken t
  JOIN locked l ON l.job_id = t.job_id AND l.run_lease = t.run_lease
  JOIN ready r ON r.slot = l.slot AND r.queue = l.queue AND r.priority = l.priority AND r.shard = l.shard
              AND r.lane_seq = l.lane_seq
  ORDER BY t.job_id;
END
$$;


-- ---------------------------------------------------------------------------------------------
-- rescue: 0036's text, lines marked 0040.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.rescue(p_kind text, p_staleness_ms bigint, p_limit integer)
 RETURNS TABLE(job_id bigint, run_lease bigint, state text)
 LANGUAGE plpgsql
 SET search_path TO ':AWA_SCHEMA', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_cutoff timestamptz := now() - p_staleness_ms * interval '1 millisecond';
  v_items jsonb;
  v_row record;
  v_closed bigint[] := '{}'; -- 0036: the attempts closed here, to notify the keyed ones' queues
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'rescue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF p_kind = 'stale' THEN
    WITH cand AS (
      SELECT c.job_id, c.run_lease, c.attempt FROM claims c
      LEFT JOIN attempt_state a ON a.job_id = c.job_id AND a.run_lease = c.run_lease
      WHERE c.claimed_at < v_cutoff AND (a.heartbeat_at IS NULL OR a.heartbeat_at < v_cutoff)
        AND NOT (coalesce(a.callback_waiting, false) AND a.callback_state = 'pending') -- 0034: parked, no worker heartbeats it
        AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
      ORDER BY c.claimed_at LIMIT p_limit
    )
    SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry',
             'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'heartbeat stale: worker presumed dead',
             'reason', 'stale_heartbeat', 'stale_before', v_cutoff))
      INTO v_items FROM cand;
  ELSIF p_kind = 'callback' THEN -- 0034
    -- 0040: no pending callback is past its timeout (the usual answer): return before the two
    -- statements below are planned (claims and closures, 16 children each).
    IF NOT EXISTS (SELECT 1 FROM attempt_state a -- 0040
                   WHERE a.callback_state = 'pending' AND a.callback_timeout_at < now()) THEN -- 0040
      RETURN; -- 0040
    END IF; -- 0040
    -- 0034: pending callbacks past their timeout. Lock their claims rows first (as a resolver or a
    -- callback heartbeat does), then re-read the timeout: an extension committed meanwhile wins.
    PERFORM 1 FROM claims c -- 0034
    WHERE (c.job_id, c.run_lease) IN (SELECT a.job_id, a.run_lease FROM attempt_state a -- 0034
                                      WHERE a.callback_state = 'pending' AND a.callback_timeout_at < now() -- 0034
                                      ORDER BY a.callback_timeout_at LIMIT p_limit) -- 0034
    ORDER BY c.job_id, c.run_lease -- 0034
    FOR NO KEY UPDATE OF c; -- 0034
    WITH cand AS ( -- 0034
      SELECT c.job_id, c.run_lease, c.attempt FROM attempt_state a -- 0034
      JOIN claims c ON c.job_id = a.job_id AND c.run_lease = a.run_lease -- 0034
      WHERE a.callback_state = 'pending' AND a.callback_timeout_at < now() -- 0034
        AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease) -- 0034
      ORDER BY a.callback_timeout_at LIMIT p_limit -- 0034
    ) -- 0034
    SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry', -- 0034
             'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'callback timed out', -- 0034
             'reason', 'callback_timeout')) -- 0034
      INTO v_items FROM cand; -- 0034
  ELSE
    WITH cand AS (
      SELECT c.job_id, c.run_lease, c.attempt FROM claims c
      WHERE c.deadline_at < now()
        AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
        -- 0034: a parked attempt's claim deadline is void; its callback timeout bounds it
        AND NOT EXISTS (SELECT 1 FROM attempt_state a WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease -- 0034
                          AND a.parked_at IS NOT NULL) -- 0034
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
    v_closed := v_closed || v_row.j || v_row.l; -- 0036: (job, lease) pairs, flat
    job_id := v_row.j;
    run_lease := v_row.l;
    state := v_row.s;
    RETURN NEXT;
  END LOOP;
  -- 0036: a rescued keyed attempt freed a grant: wake its queue's gated claimers (at commit).
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q.queue) -- 0036
  FROM (SELECT DISTINCT c.queue FROM generate_series(1, cardinality(v_closed), 2) AS i(i) -- 0036
        JOIN claims c ON c.job_id = v_closed[i.i] AND c.run_lease = v_closed[i.i + 1] -- 0036
        WHERE c.key_policy IS NOT NULL) q; -- 0036
END
$function$;
