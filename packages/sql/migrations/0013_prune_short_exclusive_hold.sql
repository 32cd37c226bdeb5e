-- 0013: prune holds ACCESS EXCLUSIVE only for the writes, and never queues for it.
--
-- Claim and finalize read every child of ready/claims/closures, so while prune holds ACCESS
-- EXCLUSIVE on one slot's children every claim and completion waits; and while its request for
-- that lock merely waits in the lock queue, every later claimer queues behind it too (up to
-- lock_timeout, even when prune then gives up). In 0010 a prune of a drained 100k-row slot held the
-- lock ~1.1 s, 0.88 s of it judging terminal rows for history, 0.14 s proving the slot empty twice.
--
-- Now (docs/adr/0010-prune-short-exclusive-hold.md):
--  * the emptiness proof visits the lanes present in the slot with a loose index scan (one probe
--    per lane) instead of reading every row of the slot;
--  * prune first takes SHARE on the slot's children. SHARE conflicts with writers (ROW EXCLUSIVE)
--    but not with readers (ACCESS SHARE), so claimers are not stalled, and from then on the slot's
--    content is frozen until we commit: nothing can be inserted into it (late enqueues that read
--    the ring before the rotation, finalizers of the slot's claims) while we look at it;
--  * on the frozen slot, and without writing anything, it re-proves emptiness, collects the open
--    attempts to carry and judges the terminal rows into plpgsql arrays, the roll-up and the keys
--    to release. A prune that gives up after this has written no row, so it leaves no dead
--    tuple anywhere (0008's flaw);
--  * a slot with many rows to keep for history and no open attempt is copied ahead: the rows go to
--    history in a transaction of its own, recorded in history_copies, and the next call (at once)
--    only checks that the frozen slot still holds the same number of terminal rows;
--  * then it asks for ACCESS EXCLUSIVE with NOWAIT, retried every ~1 ms until lock_timeout has
--    passed: the request never sits in the lock queue, so it never stalls a claimer; it is granted
--    in a moment when no reader holds the slot. Under it: insert the carried rows and the judged
--    history rows from the arrays, release keys, TRUNCATE, append the ledger row.
-- PgQueueStorage.prune calls again after 'Copied'.
--
-- And the queue ring rotates by size or age (rotate_queue_when_due, used by PgQueueStorage.rotate):
-- what remains under the exclusive lock, TRUNCATE of 16 relations and the commit, costs ~20–30 ms
-- whatever the slot's size, once per rotation. rotate, retention and prune_history are unchanged.

-- ---------------------------------------------------------------------------------------------
-- slot_has_unclaimed(slot): does the queue-ring slot hold a row a claimer could still take?
-- A ready row at or beyond its lane's cursor that is not tombstoned; every row physically in the
-- slot counts, whatever its generation. The lanes present in the slot come from a loose index scan
-- of the child's primary key (queue, priority, shard, lane_seq, slot): one probe per lane, so the
-- cost follows the number of lanes, not the number of rows (0003 read every row of the slot:
-- ~70 ms for 100k rows).
-- Locks: none beyond ACCESS SHARE on the slot's ready child and the tombstone and mark children.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.slot_has_unclaimed(p_slot int) RETURNS boolean
LANGUAGE plpgsql STABLE SET search_path = :AWA_SCHEMA, pg_catalog AS $$
DECLARE
  v_found boolean;
BEGIN
  -- the child by name: a plan for one small table, and no partition pruning at run time
  EXECUTE format($q$
    WITH RECURSIVE lanes AS (
      (SELECT r.queue, r.priority, r.shard FROM %1$I.%2$I r ORDER BY r.queue, r.priority, r.shard LIMIT 1)
      UNION ALL
      SELECT n.queue, n.priority, n.shard
      FROM lanes p CROSS JOIN LATERAL (
        SELECT r.queue, r.priority, r.shard FROM %1$I.%2$I r
        WHERE (r.queue, r.priority, r.shard) > (p.queue, p.priority, p.shard)
        ORDER BY r.queue, r.priority, r.shard LIMIT 1) n
    )
    SELECT EXISTS (
      SELECT 1 FROM lanes l
      CROSS JOIN LATERAL (SELECT %1$I.lane_cursor(l.queue, l.priority, l.shard) AS c) cur
      WHERE EXISTS (
        SELECT 1 FROM %1$I.%2$I r
        WHERE r.queue = l.queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= cur.c
          AND NOT EXISTS (SELECT 1 FROM %1$I.ready_tombstones t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq = r.lane_seq)))$q$,
    ':AWA_SCHEMA', 'ready_' || p_slot) INTO v_found;
  RETURN v_found;
END
$$;

-- Copies of a queue-ring incarnation's terminal rows into history made ahead of its prune, in a
-- transaction of their own (prune_queue answers 'Copied'). Append-only: one row per incarnation
-- copied ahead, never updated; terminal_rows is how many terminal rows the slot held when copied.
CREATE TABLE :AWA_SCHEMA.history_copies (
  generation    bigint      PRIMARY KEY,
  slot          int         NOT NULL,
  terminal_rows bigint      NOT NULL,
  rollup        jsonb       NOT NULL,
  keys          jsonb,
  copied_at     timestamptz NOT NULL DEFAULT now()
);

-- ---------------------------------------------------------------------------------------------
-- prune_queue(lock_timeout_ms, retention...) -> (outcome, generation, carried)
-- Oldest sealed incarnation per call (storage-engine.md §7.2):
--  1 ring serializer (tried) → 2 cheap proof: no claimable row → 3 try the per-attempt lock of
--  every open claim (a finalizer holding one makes us back off) → 4 SHARE on the slot's six
--  children under lock_timeout: waits out writers still inserting into the slot (timeout ⇒
--  Blocked(lock)), blocks no reader, and freezes the slot's content until commit → 5 re-proof on
--  the frozen slot → 6 without writing: collect the open attempts (ready row + claim) into arrays;
--  judge the terminal rows (widened; kept if inside their state's retention) into an array, fold
--  the roll-up, list the keys to release — or, if an earlier call copied this incarnation ahead
--  and the slot still holds as many terminal rows, take its roll-up and keys → 6b copy ahead:
--  with ≥ 1,000 rows to keep and no open attempt, insert them into history, record the copy in
--  history_copies and return 'Copied' (committed; the caller calls again) → 7 ACCESS EXCLUSIVE on
--  the children, NOWAIT, retried about every millisecond until lock_timeout has passed (then
--  Blocked(lock), having written nothing) → 8 carry the open attempts (ready row, claim, a mark at
--  the lane's cursor) into the current slot → 9 insert the judged rows into the history ring's
--  current slot → 10 release the keys of the rest → 11 TRUNCATE, ledger row.
-- Locks: ring serializer (tried), per-attempt (tried), slot children SHARE then ACCESS EXCLUSIVE.
-- Guard: the slot is frozen from step 4, so what steps 5–6 saw is what is truncated; the open
--        attempts are ours (step 3) and their finalizers wait for our commit. A copy ahead is
--        trusted only while the slot's terminal row count is unchanged (append-only tables);
--        otherwise the slot is judged again, skipping rows history already holds.
-- Writes: 6b only: history, history_copies. Otherwise only after step 7: ready, claims,
--        claim_marks (current slot), history, unique_claims (delete), ring_prunes; TRUNCATE.
-- Indexes: ready PK (lane, lane_seq) for the proof; history (job_id) after a copy ahead.
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

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.slot_has_unclaimed(int) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.prune_queue(int, bigint, bigint, bigint) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- rotate_queue_when_due(min_rows, max_age_ms) -> rotate's outcomes
-- The queue ring's rotation by size or age: rotate (as rotate('queue', 0)) once the current slot
-- holds at least min_rows ready rows or is max_age_ms old; before that 'SkippedIdle', writing
-- nothing. Every rotation costs a prune later, and every prune a TRUNCATE of six tables (16
-- relations with their indexes, 28 pg_class row versions) under ACCESS EXCLUSIVE plus a commit:
-- ~20–30 ms during which no claim or completion proceeds, whatever the slot's size. At low rates a
-- one-second slot holds a few hundred rows, so rotating by size cuts those stalls and the catalog
-- churn without letting slots grow past min_rows (or max_age of traffic at low rates).
-- Locks: none of its own (the count reads the current ready child); rotate takes the serializer.
-- Counting stops at min_rows (LIMIT), so the check costs at most min_rows index-free tuple reads.
CREATE FUNCTION :AWA_SCHEMA.rotate_queue_when_due(p_min_rows int, p_max_age_ms bigint)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_cur record;
  v_rows bigint;
BEGIN
  SELECT r.generation, r.slot, r.rotated_at INTO v_cur FROM ring_rotations r
  WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
  IF v_cur.rotated_at > now() - p_max_age_ms * interval '1 millisecond' THEN
    EXECUTE format('SELECT count(*) FROM (SELECT FROM %I.%I LIMIT %s) s', ':AWA_SCHEMA', 'ready_' || v_cur.slot, p_min_rows)
      INTO v_rows;
    IF v_rows < p_min_rows THEN
      RETURN 'SkippedIdle';
    END IF;
  END IF;
  RETURN rotate('queue', 0);
END
$$;

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.rotate_queue_when_due(int, bigint) FROM PUBLIC;
