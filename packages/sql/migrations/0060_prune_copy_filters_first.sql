-- 0060: prune copies a slot's kept rows without judging a wide copy of every row first (issue 17:
-- what keeping completed jobs costs a drain, docs/benchmarks.md "The history copy's floor").
--
-- With the default retention every completed job is copied into history once, when its slot is
-- pruned: in a steady drain the copy-ahead statement (0048) is a fifth or more of the server's
-- time. It judged every terminal row of the slot into a MATERIALIZED CTE that carried the row's
-- whole payload (args, metadata, tags, errors: ~8 MB for 20,000 rows, past the default work_mem),
-- then read it four times: for the insert, the rollup, the keys to release and the count. Measured
-- in one backend on a drained 20,000-job slot (Debian's 15, stock settings, jit off as in the
-- function, four interleaved rounds): 141-155 ms with a day's retention and 52-55 ms with none,
-- where a bare INSERT … SELECT of the same rows into history takes ~98 ms (its heap ~47 ms, each
-- of its two indexes ~25 ms).
--
-- When no queue has a retention of its own (queue_meta's three retention columns all NULL, the
-- usual case), a row's fate depends on its state and finalized_at only, which the terminal record
-- carries, so the statement filters before it joins: the kept rows go from their join with the
-- ready rows straight into history (RETURNING their queue and state for the rollup), and only the
-- dropped rows are joined again, narrow, for the rollup and the keys to release. Same rows: 121-131
-- ms with a day's retention, 22 ms with none. With a queue's own retention the row's queue decides
-- its fate, so the statement is 0048's, unchanged (the ELSE branch).
--
-- The override test is a statement of its own before the copy: a queue's retention set in between
-- is applied from the next prune on, as if it had been set just after this one. The copy, its
-- counts and its keys stay one statement and one snapshot (no row can be both copied and released).
--
-- Locks, guards and writes: as 0058's prune_queue. The copy-ahead statement writes history (the
-- kept rows) as before and reads terminal, closures, ready and queue_meta of the frozen slot (SHARE
-- on its children, held since before the branch); history_copies and the 'Copied' answer as before.
--
-- Functions: prune_queue with 8 arguments (0058's text, lines marked 0060).

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
  -- 0048: below this many terminal rows, judging into an array and inserting under the lock costs
  -- less than a second commit; from it on, a slot with no open attempt is copied ahead in one statement
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
  v_all_closed boolean; -- 0044: every claim of the slot has its closure
  v_copied_rows bigint; -- 0048: history rows the one-statement copy wrote
  v_newest record; -- 0048: the slot's newest claim in the carry window
  v_saved_seqscan text := current_setting('enable_seqscan'); -- 0048
  v_saved_mergejoin text := current_setting('enable_mergejoin'); -- 0058
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

  -- 0048: the cheap answer first. A slot still being drained (its backlog sealed by a rotation)
  -- has its newest claim open and young: that alone is the answer the test below would reach
  -- (newest first), without counting the slot's claims and closures (two scans of up to every
  -- row, 45-80 ms a tick for a 100,000-job slot). Index probes only, newest first: the children's
  -- statistics may be those of an empty table, and a scan or sort of a large one is what this avoids.
  IF p_carry_after_ms > 0 THEN -- 0048
    PERFORM set_config('enable_seqscan', 'off', true); -- 0048
    PERFORM set_config('enable_sort', 'off', true); -- 0048: the claimed_at index, newest first
    -- 0053: the newest claim span's last claim (a span's claims share its time; of one call's
    -- claims, the last position is the one a worker reaches last)
    SELECT o.job_id, o.run_lease INTO v_newest -- 0053
    FROM claim_spans s -- 0053
    CROSS JOIN LATERAL (SELECT c.job_id, c.run_lease FROM ready r -- 0053
                        JOIN claims c ON c.job_id = r.job_id AND c.run_lease = r.run_lease + 1 AND c.slot = v_slot -- 0053
                        WHERE r.slot = v_slot AND r.queue = s.queue AND r.priority = s.priority AND r.shard = s.shard -- 0053
                          AND r.lane_seq BETWEEN s.first_lane_seq AND s.last_lane_seq -- 0053
                        ORDER BY r.lane_seq DESC LIMIT 1) o -- 0053
    WHERE s.slot = v_slot AND s.claimed_at > now() - p_carry_after_ms * interval '1 millisecond' -- 0053
    ORDER BY s.claimed_at DESC LIMIT 1; -- 0053
    v_young := FOUND AND NOT EXISTS (SELECT 1 FROM closures z -- 0048
                                     WHERE z.slot = v_slot AND z.job_id = v_newest.job_id AND z.run_lease = v_newest.run_lease);
    PERFORM set_config('enable_seqscan', v_saved_seqscan, true); -- 0048
    PERFORM set_config('enable_sort', v_saved_sort, true); -- 0048
    IF v_young THEN -- 0048
      RETURN QUERY SELECT 'Blocked:young_attempts', v_old, 0, 0, 0;
      RETURN;
    END IF;
  END IF; -- 0048

  -- 0044: are all the slot's attempts closed? Counted, not anti-joined (see the header): when
  -- they are, there is nothing young to wait for and nothing to lock, and the two anti-joins
  -- below (each a probe of closures per claim, 20-80 ms for a 20,000-claim slot) are skipped.
  SELECT (SELECT count(*) FROM claims c WHERE c.slot = v_slot) = (SELECT count(*) FROM closures z WHERE z.slot = v_slot) -- 0044
    INTO v_all_closed; -- 0044
  IF NOT v_all_closed THEN -- 0044
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
    SELECT true FROM claim_spans s -- 0053: the claims by their spans, newest span first
    CROSS JOIN LATERAL (SELECT 1 FROM ready r -- 0053
                        JOIN claims c ON c.job_id = r.job_id AND c.run_lease = r.run_lease + 1 AND c.slot = v_slot -- 0053
                        WHERE r.slot = v_slot AND r.queue = s.queue AND r.priority = s.priority AND r.shard = s.shard -- 0053
                          AND r.lane_seq BETWEEN s.first_lane_seq AND s.last_lane_seq -- 0053
                          AND c.claimed_at > now() - p_carry_after_ms * interval '1 millisecond' -- 0053
                          AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
                        ORDER BY r.lane_seq DESC LIMIT 1) o -- 0053
    WHERE s.slot = v_slot AND s.claimed_at > now() - p_carry_after_ms * interval '1 millisecond' -- 0053
    ORDER BY s.claimed_at DESC LIMIT 1 -- 0040
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
  END IF; -- 0044

  v_children := format('%1$I.ready_%2$s, %1$I.ready_tombstones_%2$s, %1$I.claims_%2$s, %1$I.claim_marks_%2$s, %1$I.closures_%2$s, %1$I.terminal_%2$s, %1$I.claim_spans_%2$s', -- 0053
                       ':AWA_SCHEMA', v_slot); -- 0053: the schema's name (0039-0048 spelled the default one)
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
  -- 0044: counted again first (the slot is frozen now: the counts hold until we commit); the
  -- anti-join only when some attempt is open.
  SELECT (SELECT count(*) FROM claims c WHERE c.slot = v_slot) = (SELECT count(*) FROM closures z WHERE z.slot = v_slot) -- 0044
    INTO v_all_closed; -- 0044
  IF NOT v_all_closed THEN -- 0044
  SELECT array_agg(c) INTO v_open_claims FROM claims c
  WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease);
  END IF; -- 0044
  IF v_open_claims IS NOT NULL THEN
    SELECT array_agg(r) INTO v_open_ready
    FROM unnest(v_open_claims) o
    JOIN ready r ON r.slot = v_slot AND r.queue = o.queue AND r.priority = o.priority AND r.shard = o.shard AND r.lane_seq = o.lane_seq;
  END IF;

  -- The terminal rows: judged here, or already copied ahead by an earlier call (0013).
  SELECT * INTO v_copy FROM history_copies hc WHERE hc.generation = v_old;
  v_copied := FOUND;
  IF v_copied THEN
    SELECT count(*) INTO v_count FROM terminal_records t WHERE t.slot = v_slot; -- 0057
  END IF;
  IF v_copied AND v_count = v_copy.terminal_rows THEN
    v_rollup := v_copy.rollup;
    v_keys := v_copy.keys;
  -- 0048: a large slot with no open attempt, not copied yet: judged and copied in one statement
  ELSIF NOT v_copied AND v_open_claims IS NULL -- 0048
        AND (SELECT count(*) FROM (SELECT FROM terminal_records t WHERE t.slot = v_slot LIMIT v_copy_ahead_rows) s) >= v_copy_ahead_rows THEN -- 0048, 0057
    PERFORM set_config('enable_nestloop', 'off', true); -- 0048
    PERFORM set_config('enable_mergejoin', 'off', true); -- 0058: the ready rows joined by hash, not both sides sorted
    SELECT * INTO v_hist FROM ring_current('history'); -- 0048
    -- 0060: with no queue's own retention (the usual case), a row's fate is its state and
    -- finalized_at alone: the kept rows go straight from their join to history (no wide row is
    -- kept aside for the counts), and only the dropped rows are joined again, narrow, for the
    -- rollup and their keys. Both in one statement (one snapshot: the same rows and the same now()
    -- decide the copy, the counts and the keys). A queue's own retention needs the row's queue
    -- before its fate: judged as 0048 did, below.
    IF NOT EXISTS (SELECT 1 FROM queue_meta m -- 0060
                   WHERE m.completed_retention IS NOT NULL OR m.failed_retention IS NOT NULL OR m.cancelled_retention IS NOT NULL) THEN -- 0060
    WITH copied AS ( -- 0060: the kept rows, filtered before their join
      INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                           metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
      SELECT v_hist.slot, v_hist.generation, t.job_id, t.run_lease, t.state, t.attempt, coalesce(t.max_attempts, r.max_attempts), -- 0060
             coalesce(t.kind, r.kind), coalesce(t.queue, r.queue), coalesce(t.priority, r.priority), -- 0060
             coalesce(t.args, r.args), coalesce(t.metadata, r.metadata), coalesce(t.tags, r.tags), -- 0060
             coalesce(t.errors, r.errors), t.progress, coalesce(t.run_at, r.run_at), coalesce(t.created_at, r.created_at), -- 0060
             t.finalized_at, coalesce(t.unique_key, r.unique_key), coalesce(t.unique_states, r.unique_states, 0) -- 0060
      FROM terminal_records t -- 0060
      LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq -- 0060
      WHERE t.slot = v_slot -- 0060
        AND t.finalized_at > now() - CASE t.state WHEN 'completed' THEN p_completed_ms * interval '1 millisecond' -- 0060
                                                  WHEN 'failed' THEN p_failed_ms * interval '1 millisecond' -- 0060
                                                  ELSE p_cancelled_ms * interval '1 millisecond' END -- 0060
      RETURNING queue, state -- 0060
    ),
    dropped AS MATERIALIZED ( -- 0060: the others, narrow: their queue for the rollup, their keys to release
      SELECT t.job_id, t.run_lease, t.state, t.finalized_at, coalesce(t.queue, r.queue) AS queue, -- 0060
             coalesce(t.unique_key, r.unique_key) AS unique_key -- 0060
      FROM terminal_records t -- 0060
      LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq -- 0060
      WHERE t.slot = v_slot -- 0060
        AND NOT t.finalized_at > now() - CASE t.state WHEN 'completed' THEN p_completed_ms * interval '1 millisecond' -- 0060
                                                      WHEN 'failed' THEN p_failed_ms * interval '1 millisecond' -- 0060
                                                      ELSE p_cancelled_ms * interval '1 millisecond' END -- 0060
    ),
    counted AS MATERIALIZED ( -- 0060: rows per queue and state, kept and dropped together
      SELECT g.k, sum(g.n)::bigint AS n -- 0060
      FROM (SELECT c.queue || ':' || c.state AS k, count(*) AS n FROM copied c GROUP BY 1 -- 0060
            UNION ALL -- 0060
            SELECT d.queue || ':' || d.state, count(*) FROM dropped d GROUP BY 1) g -- 0060
      GROUP BY g.k -- 0060
    )
    SELECT (SELECT count(*) FROM copied), -- 0060
           (SELECT jsonb_object_agg(c.k, c.n) FROM counted c), -- 0060
           (SELECT jsonb_agg(jsonb_build_object('job_id', d.job_id, 'run_lease', d.run_lease, 'finalized_at', d.finalized_at, -- 0060
                                                'unique_key', encode(d.unique_key, 'hex'))) -- 0060
            FROM dropped d WHERE d.unique_key IS NOT NULL), -- 0060
           (SELECT coalesce(sum(c.n), 0)::bigint FROM counted c) -- 0060
      INTO v_copied_rows, v_rollup, v_keys, v_count; -- 0060
    ELSE -- 0060
      WITH judged AS MATERIALIZED ( -- 0048: 0039's wide and judged, in one step (nothing is in history yet)
        SELECT t.job_id, t.run_lease, t.state, t.attempt, coalesce(t.max_attempts, r.max_attempts) AS max_attempts,
               coalesce(t.kind, r.kind) AS kind, coalesce(t.queue, r.queue) AS queue, coalesce(t.priority, r.priority) AS priority,
               coalesce(t.args, r.args) AS args, coalesce(t.metadata, r.metadata) AS metadata, coalesce(t.tags, r.tags) AS tags,
               coalesce(t.errors, r.errors) AS errors, t.progress, coalesce(t.run_at, r.run_at) AS run_at,
               coalesce(t.created_at, r.created_at) AS created_at, t.finalized_at,
               coalesce(t.unique_key, r.unique_key) AS unique_key, coalesce(t.unique_states, r.unique_states, 0) AS unique_states,
               t.finalized_at > now() - CASE t.state
                                          WHEN 'completed' THEN coalesce(m.completed_retention, p_completed_ms * interval '1 millisecond')
                                          WHEN 'failed' THEN coalesce(m.failed_retention, p_failed_ms * interval '1 millisecond')
                                          ELSE coalesce(m.cancelled_retention, p_cancelled_ms * interval '1 millisecond') END AS keep
        FROM terminal_records t -- 0057
        LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
        LEFT JOIN queue_meta m ON m.queue = coalesce(t.queue, r.queue)
        WHERE t.slot = v_slot
      ),
      copied AS ( -- 0048: the kept rows, straight from the judging
        INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                             metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
        SELECT v_hist.slot, v_hist.generation, j.job_id, j.run_lease, j.state, j.attempt, j.max_attempts, j.kind, j.queue, j.priority,
               j.args, j.metadata, j.tags, j.errors, j.progress, j.run_at, j.created_at, j.finalized_at, j.unique_key, j.unique_states
        FROM judged j WHERE j.keep
        RETURNING 1
      )
      SELECT (SELECT count(*) FROM copied),
             (SELECT jsonb_object_agg(k, n) FROM (SELECT j.queue || ':' || j.state AS k, count(*) AS n FROM judged j GROUP BY 1) c),
             (SELECT jsonb_agg(jsonb_build_object('job_id', j.job_id, 'run_lease', j.run_lease, 'finalized_at', j.finalized_at,
                                                  'unique_key', encode(j.unique_key, 'hex')))
              FROM judged j WHERE NOT j.keep AND j.unique_key IS NOT NULL),
             (SELECT count(*) FROM judged)
        INTO v_copied_rows, v_rollup, v_keys, v_count; -- 0048
    END IF; -- 0060
    PERFORM set_config('enable_nestloop', v_saved_nestloop, true); -- 0048
    PERFORM set_config('enable_mergejoin', v_saved_mergejoin, true); -- 0058
    IF v_copied_rows > 0 THEN -- 0048: recorded and committed, as 0013's copy ahead
      INSERT INTO history_copies (generation, slot, terminal_rows, rollup, keys)
      VALUES (v_old, v_slot, v_count, coalesce(v_rollup, '{}'), v_keys);
      RETURN QUERY SELECT 'Copied', v_old, 0, 0, 0;
      RETURN;
    END IF;
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
      FROM terminal_records t -- 0057
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

    -- 0048: 0013's copy ahead from this array is the branch above now (this one judges only
    -- slots of fewer than v_copy_ahead_rows terminal rows, open attempts, or rows after a copy)
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
    FROM ready_lanes_in_slot(v_slot) l -- 0058
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
      SELECT l.queue, l.priority, l.shard FROM ready_lanes_in_slot(v_slot) l ORDER BY 1, 2, 3 -- 0058
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
        FROM ready_lanes_in_slot(v_slot) l -- 0058
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
    -- Queued, but for the parents only: ACCESS EXCLUSIVE on the claim_marks, claim_spans and claims
    -- parent tables themselves (ONLY: not their children), in that order (0053). Every reader of the
    -- slot's children locks one of these parents before any child (claim's cursor statement reads
    -- claim_marks first; rescue reads claim_spans first (0053); the jobs view, finalize and heartbeat
    -- read claims before any other ring table), so the request
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
      EXECUTE format('LOCK TABLE ONLY %1$I.claim_marks, ONLY %1$I.claim_spans, ONLY %1$I.claims IN ACCESS EXCLUSIVE MODE', ':AWA_SCHEMA'); -- 0053
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
    -- 0053: their spans in the current slot, one per lane and claim time (a call's claims share it)
    INSERT INTO claim_spans (slot, generation, queue, priority, shard, first_lane_seq, last_lane_seq, claimed_at, deadline_at) -- 0053
    SELECT v_cur.slot, v_cur.generation, o.queue, o.priority, o.shard, min(o.lane_seq), max(o.lane_seq), o.claimed_at, o.deadline_at -- 0053
    FROM unnest(v_open_claims) o -- 0053
    GROUP BY o.queue, o.priority, o.shard, o.claimed_at, o.deadline_at; -- 0053
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
    FROM ready_lanes_in_slot(v_slot) l -- 0058
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
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.prune_queue(int, bigint, bigint, bigint, bigint, int, int, bigint) FROM PUBLIC;

