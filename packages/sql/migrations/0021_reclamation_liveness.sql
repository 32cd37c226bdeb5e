-- 0021: reclamation never stops (docs/adr/0018-reclamation-liveness.md; issue 14, review M1, M5, M6).
--
-- Until now prune never truncated a slot holding an unclaimed ready row: one paused queue, one
-- queue no worker serves or one slow backlog froze rotation and reclamation for every queue.
-- Prune now moves a sealed slot's residue (non-tombstoned ready rows at or beyond their lane's
-- cursor) out of the slot under its exclusive lock, then truncates as before:
--  * carried: a copy in the current slot with the same position, for at most p_carry_rows rows
--    per prune, the first half of that per lane, of queues not paused and below the lane's barrier;
--  * parked: the rest goes to `parked` (a plain table keyed like ready), outside the ring.
-- A lane's barrier is its smallest parked position. claim picks only ring rows below it, so
-- whatever is picked is smaller than every parked row of its lane: FIFO over ring ∪ parked,
-- whatever was parked or brought back when. unpark() (the leader, with promotion) brings a
-- lane's smallest parked rows back into the current slot, under the lane's claim lock, once the
-- ring holds less than half a batch of the lane's claimable rows below the barrier.
--
-- Why no claim can skip a carried or unparked row (0016's range argument): a claim reads its slot
-- ranges after its cursor statement, which holds ACCESS SHARE on every claim_marks child to
-- commit. Prune carries under ACCESS EXCLUSIVE on its slot's claim_marks child, so no carry
-- commits while a claim runs. unpark holds the lane's claim lock while it writes, so no claim of
-- the lane runs meanwhile. Either way a claim sees the ring wholly before or wholly after.
--
-- Prune cannot starve (M5): p_force_timeout_ms > 0 takes SHARE and ACCESS EXCLUSIVE queued with
-- that lock_timeout instead of NOWAIT retries (the leader does so after 3 failed ticks); when even
-- that fails, end_idle_blockers() ends sessions idle in transaction longer than p_end_idle_ms that
-- hold a lock on the slot. Running statements are never cancelled.
--
-- Unique keys (M6): both prunes record the keys of the rows they drop in pending_key_releases
-- instead of releasing them under their exclusive lock; release_pending_keys() releases them
-- after the truncate committed. prune_history computes its roll-up before its lock and never
-- reads the queue ring under it, so the two prunes cannot deadlock.
--
-- Also: cancel_job handles parked jobs and re-checks, under ROW EXCLUSIVE on the slot's children,
-- that a ring row was not carried away meanwhile; the job views show parked jobs as available;
-- promote scans past lanes whose producer holds the enqueue lock (review m5).

-- ---------------------------------------------------------------------------------------------
-- Unclaimed ready rows moved out of the ring by prune, with their lane position. Mutable, off the
-- hot path: a row is inserted when prune parks it and deleted when unpark brings it back (one dead
-- tuple per unparked row, bounded by the backlog that outlived a ring wrap).
CREATE TABLE :AWA_SCHEMA.parked (
  job_id        bigint      NOT NULL,
  kind          text        NOT NULL,
  queue         text        NOT NULL,
  priority      smallint    NOT NULL,
  shard         smallint    NOT NULL,
  lane_seq      bigint      NOT NULL,
  args          jsonb       NOT NULL,
  metadata      jsonb       NOT NULL,
  tags          text[]      NOT NULL,
  errors        jsonb       NOT NULL,
  progress      jsonb,
  attempt       int         NOT NULL,
  run_lease     bigint      NOT NULL,
  max_attempts  int         NOT NULL,
  run_at        timestamptz NOT NULL,
  created_at    timestamptz NOT NULL,
  unique_key    bytea,
  unique_states int         NOT NULL DEFAULT 0,
  parked_at     timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (queue, priority, shard, lane_seq)
);
CREATE INDEX ON :AWA_SCHEMA.parked (job_id);

-- Keys of rows a prune dropped, released after its truncate committed (release_pending_keys).
-- One insert and one delete per prune that dropped keyed rows.
CREATE TABLE :AWA_SCHEMA.pending_key_releases (
  id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  ring        text        NOT NULL,
  generation  bigint      NOT NULL,
  keys        jsonb       NOT NULL,
  recorded_at timestamptz NOT NULL DEFAULT now()
);

-- ---------------------------------------------------------------------------------------------
-- The job views gain parked rows as a live 'available' representation (rank 3), as 0006 defined
-- them otherwise.
DROP VIEW :AWA_SCHEMA.jobs;
DROP VIEW :AWA_SCHEMA.job_representations;
CREATE VIEW :AWA_SCHEMA.job_representations AS
  SELECT q.job_id, 0 AS rank, 'failed'::text AS state, q.kind, q.queue, q.priority, q.args, q.metadata, q.tags, q.errors,
         q.progress, q.attempt, q.max_attempts, q.original_run_lease AS run_lease, q.run_at, q.created_at,
         q.dlq_at AS finalized_at, q.dlq_reason
  FROM :AWA_SCHEMA.dlq q
UNION ALL
  SELECT d.job_id, 1 AS rank, d.state, d.kind, d.queue, d.priority, d.args, d.metadata, d.tags, d.errors, d.progress,
         d.attempt, d.max_attempts, d.run_lease, d.run_at, d.created_at, NULL::timestamptz AS finalized_at, NULL
  FROM :AWA_SCHEMA.deferred d
UNION ALL
  SELECT c.job_id, 2, 'running', r.kind, r.queue, r.priority, r.args, r.metadata, r.tags, r.errors,
         coalesce(a.progress, r.progress), c.attempt, r.max_attempts, c.run_lease, r.run_at, r.created_at, NULL, NULL
  FROM :AWA_SCHEMA.claims c
  JOIN :AWA_SCHEMA.ready r ON r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard AND r.lane_seq = c.lane_seq AND r.slot = c.slot
  LEFT JOIN :AWA_SCHEMA.attempt_state a ON a.job_id = c.job_id AND a.run_lease = c.run_lease
  WHERE NOT EXISTS (SELECT 1 FROM :AWA_SCHEMA.closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
UNION ALL
  SELECT r.job_id, 3, 'available', r.kind, r.queue, r.priority, r.args, r.metadata, r.tags, r.errors, r.progress,
         r.attempt, r.max_attempts, r.run_lease, r.run_at, r.created_at, NULL, NULL
  FROM :AWA_SCHEMA.ready r
  WHERE NOT EXISTS (SELECT 1 FROM :AWA_SCHEMA.claims c WHERE c.job_id = r.job_id AND c.lane_seq = r.lane_seq)
    AND NOT EXISTS (SELECT 1 FROM :AWA_SCHEMA.ready_tombstones t
                    WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq)
UNION ALL
  SELECT p.job_id, 3, 'available', p.kind, p.queue, p.priority, p.args, p.metadata, p.tags, p.errors, p.progress,
         p.attempt, p.max_attempts, p.run_lease, p.run_at, p.created_at, NULL, NULL
  FROM :AWA_SCHEMA.parked p
UNION ALL
  SELECT t.job_id, 4, t.state, coalesce(t.kind, r.kind), coalesce(t.queue, r.queue), coalesce(t.priority, r.priority),
         coalesce(t.args, r.args), coalesce(t.metadata, r.metadata), coalesce(t.tags, r.tags),
         coalesce(t.errors, r.errors), t.progress, t.attempt, coalesce(t.max_attempts, r.max_attempts), t.run_lease,
         coalesce(t.run_at, r.run_at), coalesce(t.created_at, r.created_at), t.finalized_at, NULL
  FROM :AWA_SCHEMA.terminal t
  LEFT JOIN :AWA_SCHEMA.ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
UNION ALL
  SELECT h.job_id, 4, h.state, h.kind, h.queue, h.priority, h.args, h.metadata, h.tags, h.errors, h.progress,
         h.attempt, h.max_attempts, h.run_lease, h.run_at, h.created_at, h.finalized_at, NULL
  FROM :AWA_SCHEMA.history h;

CREATE VIEW :AWA_SCHEMA.jobs AS
  SELECT DISTINCT ON (j.job_id) j.job_id, j.state, j.kind, j.queue, j.priority, j.args, j.metadata, j.tags, j.errors,
         j.progress, j.attempt, j.max_attempts, j.run_lease, j.run_at, j.created_at, j.finalized_at, j.dlq_reason
  FROM :AWA_SCHEMA.job_representations j
  ORDER BY j.job_id, j.rank, j.run_lease DESC, j.finalized_at DESC NULLS LAST;

-- ---------------------------------------------------------------------------------------------
-- end_idle_blockers(slot, idle_ms) -> sessions ended.
-- Ends sessions that are idle in transaction for longer than idle_ms and hold a lock on one of
-- the queue-ring slot's children: they do nothing, yet keep prune's exclusive lock out for as long
-- as they live (a cancel is ignored by a session waiting for a command). What
-- idle_in_transaction_session_timeout would do, narrowed to the sessions that stop reclamation.
-- Running statements are never touched. Without the right to signal a session (same role or
-- pg_signal_backend) it warns and leaves it.
CREATE FUNCTION :AWA_SCHEMA.end_idle_blockers(p_slot int, p_idle_ms bigint) RETURNS int
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
DECLARE
  v_pid int;
  v_n int := 0;
BEGIN
  FOR v_pid IN
    SELECT DISTINCT l.pid
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
      AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
      AND l.relation IN (SELECT format('%I.%I', ':AWA_SCHEMA', t || '_' || p_slot)::regclass::oid
                         FROM unnest(ARRAY['ready', 'ready_tombstones', 'claims', 'claim_marks', 'closures', 'terminal']) t)
      AND a.state IN ('idle in transaction', 'idle in transaction (aborted)')
      AND a.state_change < now() - p_idle_ms * interval '1 millisecond'
  LOOP
    BEGIN
      IF pg_terminate_backend(v_pid) THEN
        v_n := v_n + 1;
        RAISE WARNING 'awa: ended session % (idle in transaction, holding queue-ring slot % against prune)', v_pid, p_slot;
      END IF;
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE WARNING 'awa: session % is idle in transaction and blocks prune of slot %, but may not be ended by this role', v_pid, p_slot;
    END;
  END LOOP;
  RETURN v_n;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- prune_queue(lock_timeout_ms, retention..., carry_after_ms, force_timeout_ms, carry_rows,
--             end_idle_ms) -> (outcome, generation, carried, moved, parked)
-- Oldest sealed incarnation per call. As 0013/0014, except:
--  * no "Blocked:unclaimed": under the exclusive lock the residue is carried (≤ carry_rows per
--    prune, ≤ carry_rows / 2 per lane, queue not paused, below the lane's barrier) or parked;
--  * force_timeout_ms > 0: SHARE and ACCESS EXCLUSIVE are requested queued with that lock_timeout
--    (later readers queue behind the request, so a stream of short transactions cannot starve
--    it; readers stall at most that long); if that fails, end_idle_blockers(slot, end_idle_ms)
--    when end_idle_ms > 0. Otherwise ACCESS EXCLUSIVE NOWAIT retried until lock_timeout_ms, as
--    before;
--  * the copy-ahead check's read of history runs under lock_timeout, so it waits on a history
--    prune at most that long while the slot is frozen;
--  * keys of dropped rows go to pending_key_releases (released after commit by
--    release_pending_keys), not released under the lock.
-- Outcomes: Pruned, Copied / Parked (committed work ahead of the exclusive lock: the caller calls
--   again), Noop, Blocked:{busy, young_attempts,
--   locked_attempt, lock}. carried = open attempts carried (as before); moved / parked =
--   unclaimed rows carried / parked.
-- Locks: ring serializer (tried) → per-attempt (tried) → slot children SHARE → ACCESS EXCLUSIVE.
-- Writes (after ACCESS EXCLUSIVE unless Copied): ready, claims, claim_marks (current slot),
--   parked, history, pending_key_releases, ring_prunes; TRUNCATE of the slot's six children.
CREATE FUNCTION :AWA_SCHEMA.prune_queue(p_lock_timeout_ms int, p_completed_ms bigint, p_failed_ms bigint,
                                        p_cancelled_ms bigint, p_carry_after_ms bigint, p_force_timeout_ms int,
                                        p_carry_rows int, p_end_idle_ms bigint)
RETURNS TABLE (outcome text, generation bigint, carried int, moved int, parked int)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
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
BEGIN
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
  IF p_carry_after_ms > 0 AND EXISTS (
    SELECT 1 FROM claims c
    WHERE c.slot = v_slot AND c.claimed_at > now() - p_carry_after_ms * interval '1 millisecond'
      AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
  ) THEN
    RETURN QUERY SELECT 'Blocked:young_attempts', v_old, 0, 0, 0;
    RETURN;
  END IF;
  FOR v_attempt IN
    SELECT c.job_id, c.run_lease FROM claims c
    WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
    ORDER BY c.job_id, c.run_lease
  LOOP
    IF NOT pg_try_advisory_xact_lock(attempt_key(v_attempt.job_id, v_attempt.run_lease)) THEN
      RETURN QUERY SELECT 'Blocked:locked_attempt', v_old, 0, 0, 0;
      RETURN;
    END IF;
  END LOOP;

  v_children := format('%1$I.ready_%2$s, %1$I.ready_tombstones_%2$s, %1$I.claims_%2$s, %1$I.claim_marks_%2$s, %1$I.closures_%2$s, %1$I.terminal_%2$s',
                       ':AWA_SCHEMA', v_slot);
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
    EXECUTE format('SELECT count(*) FROM %I.terminal_%s', ':AWA_SCHEMA', v_slot) INTO v_count;
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
      EXECUTE format('LOCK TABLE ONLY %1$I.claim_marks, ONLY %1$I.claims IN ACCESS EXCLUSIVE MODE', ':AWA_SCHEMA');
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
    INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at)
    SELECT v_cur.slot, v_cur.generation, o.job_id, o.run_lease, o.attempt, o.queue, o.priority, o.shard, o.lane_seq, o.claimed_at, o.deadline_at
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
-- release_pending_keys(batch) -> keys looked at.
-- Releases the keys recorded by up to `batch` prunes, oldest first, each unless the job has a
-- newer representation (release_keys_of): after the truncate committed, the dropped rows no
-- longer count as one, so the rule is the one prune applied under its lock before.
-- Locks: row locks on the records (SKIP LOCKED: two callers never release one record twice) and
-- on the unique_claims rows deleted. Writes: DELETE on unique_claims and pending_key_releases.
CREATE FUNCTION :AWA_SCHEMA.release_pending_keys(p_batch int) RETURNS int
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
DECLARE
  v_row record;
  v_n int := 0;
BEGIN
  FOR v_row IN
    SELECT k.id, k.keys FROM pending_key_releases k ORDER BY k.id LIMIT p_batch FOR UPDATE SKIP LOCKED
  LOOP
    PERFORM release_keys_of(v_row.keys);
    DELETE FROM pending_key_releases k WHERE k.id = v_row.id;
    v_n := v_n + jsonb_array_length(v_row.keys);
  END LOOP;
  RETURN v_n;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- unpark(limit) -> rows moved back into the ring.
-- For each lane with parked rows whose queue is not paused (lanes found by a loose index scan of
-- parked's primary key): try its claim lock (a claimer at work: next call); in a new statement,
-- if the ring holds fewer than limit / 2 claimable rows of the lane below its barrier, move its
-- smallest parked rows (up to what is left of limit) into the ring's current slot with the same
-- positions, and wake the queue. Holding the claim lock while writing is what keeps a claim from
-- reading its slot ranges before the move and picking past the moved rows after it.
-- Locks: claim lock per lane (tried) → ROW EXCLUSIVE on the current ready child (lock_current_slot).
-- Writes: DELETE on parked, INSERT into ready (current slot), NOTIFY.
CREATE FUNCTION :AWA_SCHEMA.unpark(p_limit int) RETURNS int
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
                          AND t.shard = r.shard AND t.lane_seq = r.lane_seq)
      LIMIT greatest(1, p_limit / 2)) x;
    CONTINUE WHEN v_have >= greatest(1, p_limit / 2);
    -- A row parked ahead keeps a tombstone ("moved") in its old slot until that slot is truncated;
    -- tombstones match by lane position, whatever the slot, so a copy brought back before then
    -- would count as tombstoned and be skipped (and passed by the cursor). Bring back only the
    -- parked rows below the first one whose tombstone is still there.
    SELECT t.lane_seq INTO v_stop FROM ready_tombstones t
    WHERE t.queue = v_lane.queue AND t.priority = v_lane.priority AND t.shard = v_lane.shard AND t.lane_seq >= v_barrier
      AND EXISTS (SELECT 1 FROM parked p WHERE p.queue = t.queue AND p.priority = t.priority AND p.shard = t.shard
                                           AND p.lane_seq = t.lane_seq)
    ORDER BY t.lane_seq LIMIT 1;
    CONTINUE WHEN v_stop = v_barrier;
    SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
    WITH moved AS (
      DELETE FROM parked p
      WHERE p.queue = v_lane.queue AND p.priority = v_lane.priority AND p.shard = v_lane.shard
        AND p.lane_seq IN (SELECT q.lane_seq FROM parked q
                           WHERE q.queue = v_lane.queue AND q.priority = v_lane.priority AND q.shard = v_lane.shard
                             AND q.lane_seq < coalesce(v_stop, 9223372036854775807)
                           ORDER BY q.lane_seq LIMIT p_limit - v_moved)
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

-- ---------------------------------------------------------------------------------------------
-- prune_history: as in 0003, except that the roll-up and the key list are computed before the
-- exclusive lock (a sealed history incarnation gets no more rows), and the keys are recorded in
-- pending_key_releases instead of being released under the lock, where release_keys_of read
-- every queue-ring child (a prune_queue holding its slot exclusively could wait on it, and it on
-- that prune: a deadlock). Under the lock: TRUNCATE and the two ledger inserts only.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.prune_history(p_lock_timeout_ms int, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
RETURNS TABLE (outcome text, generation bigint, carried int)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots('history');
  v_cur record;
  v_old bigint;
  v_slot int;
  v_longest interval;
  v_rollup jsonb;
  v_keys jsonb;
  v_saved_timeout text := current_setting('lock_timeout');
BEGIN
  IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext('history')) THEN
    RETURN QUERY SELECT 'Blocked:busy', NULL::bigint, 0;
    RETURN;
  END IF;
  SELECT * INTO v_cur FROM ring_current('history');
  SELECT min(g.g) INTO v_old
  FROM generate_series(greatest(0, v_cur.generation - v_n + 1), v_cur.generation - 1) AS g(g)
  WHERE NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'history' AND p.generation = g.g);
  IF v_old IS NULL THEN
    RETURN QUERY SELECT 'Noop', NULL::bigint, 0;
    RETURN;
  END IF;
  v_slot := (v_old % v_n)::int;
  SELECT greatest(max(x), p_completed_ms * interval '1 millisecond', p_failed_ms * interval '1 millisecond',
                  p_cancelled_ms * interval '1 millisecond') INTO v_longest
  FROM (SELECT unnest(ARRAY[m.completed_retention, m.failed_retention, m.cancelled_retention]) AS x FROM queue_meta m) s;
  IF EXISTS (SELECT 1 FROM history h WHERE h.slot = v_slot AND h.finalized_at > now() - v_longest) THEN
    RETURN QUERY SELECT 'Blocked:retention', v_old, 0;
    RETURN;
  END IF;
  SELECT (SELECT jsonb_object_agg(k, n) FROM (SELECT h.queue || ':' || h.state AS k, count(*) AS n FROM history h WHERE h.slot = v_slot GROUP BY 1) c),
         (SELECT jsonb_agg(jsonb_build_object('job_id', h.job_id, 'run_lease', h.run_lease, 'finalized_at', h.finalized_at,
                                              'unique_key', encode(h.unique_key, 'hex')))
          FROM history h WHERE h.slot = v_slot AND h.unique_key IS NOT NULL)
    INTO v_rollup, v_keys;
  BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    EXECUTE format('LOCK TABLE %I.history_%s IN ACCESS EXCLUSIVE MODE', ':AWA_SCHEMA', v_slot);
  EXCEPTION WHEN lock_not_available THEN
    RETURN QUERY SELECT 'Blocked:lock', v_old, 0;
    RETURN;
  END;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);
  EXECUTE format('TRUNCATE %I.history_%s', ':AWA_SCHEMA', v_slot);
  IF v_keys IS NOT NULL THEN
    INSERT INTO pending_key_releases (ring, generation, keys) VALUES ('history', v_old, v_keys);
  END IF;
  INSERT INTO ring_prunes (ring, generation, slot, rollup) VALUES ('history', v_old, v_slot, coalesce(v_rollup, '{}'));
  RETURN QUERY SELECT 'Pruned', v_old, 0;
END
$$;
-- ---------------------------------------------------------------------------------------------
-- claim: as in 0020 (same options), plus the lane's barrier in the pick: no ring row at or past the
-- lane's smallest parked position is taken (FIFO over ring and parked rows; see the header).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.claim(p_queue text, p_max int, p_deadline_ms bigint, p_aging_ms bigint)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt int, max_attempts int, kind text, queue text,
               priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb,
               run_at timestamptz, created_at timestamptz, claimed_at timestamptz, deadline_at timestamptz)
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
               r.tags, r.errors, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.unique_key, r.unique_states
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
             p.tags, p.errors, p.run_at, p.created_at, v_now, v_deadline
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

-- ---------------------------------------------------------------------------------------------
-- promote: as in 0020, except that busy lanes no longer hide the due rows behind them (m5).
-- Locks: enqueue lock per lane, tried; due rows FOR UPDATE SKIP LOCKED. Writes: DELETE deferred,
-- INSERT ready (current slot, fresh positions), NOTIFY.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.promote(p_limit int)
RETURNS int
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_lane record;
  v_q text[] := '{}';
  v_p int[] := '{}';
  v_ids bigint[];
  v_pos bigint[];
  v_ring record;
  v_row record;
  v_def record;
  v_holder bigint;
  v_moved int;
  v_round int;
  v_found boolean;
  v_busy_q text[] := '{}';
  v_busy_p int[] := '{}';
BEGIN
  -- Lanes of the first p_limit due rows, enqueue locks tried. When every one of them is busy (a
  -- producer holds the lane in an open transaction), look further, past those lanes, instead of
  -- promoting nothing while other lanes' rows are due (review m5). Tried locks never wait, so the
  -- order across rounds does not matter.
  FOR v_round IN 1 .. 8 LOOP
    v_found := false;
    FOR v_lane IN
      SELECT DISTINCT d.queue COLLATE "C" AS queue, d.priority
      FROM (SELECT d.queue, d.priority FROM deferred d
            WHERE d.state IN ('scheduled', 'retryable') AND d.run_at <= now()
              AND (d.queue, d.priority) NOT IN (SELECT * FROM unnest(v_busy_q, v_busy_p))
            ORDER BY d.run_at, d.job_id LIMIT p_limit) d
      ORDER BY 1, 2
    LOOP
      v_found := true;
      IF pg_try_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_lane.queue, v_lane.priority, 0)) THEN
        v_q := v_q || v_lane.queue;
        v_p := v_p || v_lane.priority::int;
        INSERT INTO lanes (queue, priority, shard)
        SELECT v_lane.queue, v_lane.priority, 0
        WHERE NOT EXISTS (SELECT 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = 0)
        ON CONFLICT DO NOTHING;
      ELSE
        v_busy_q := v_busy_q || v_lane.queue;
        v_busy_p := v_busy_p || v_lane.priority::int;
      END IF;
    END LOOP;
    EXIT WHEN NOT v_found OR cardinality(v_q) > 0;
  END LOOP;
  IF cardinality(v_q) = 0 THEN
    RETURN 0;
  END IF;

  WITH due AS (
    SELECT d.job_id FROM deferred d
    WHERE d.state IN ('scheduled', 'retryable') AND d.run_at <= now()
      AND (d.queue, d.priority) IN (SELECT * FROM unnest(v_q, v_p))
    ORDER BY d.run_at, d.job_id LIMIT p_limit
    FOR UPDATE SKIP LOCKED
  )
  SELECT array_agg(due.job_id) INTO v_ids FROM due;
  IF v_ids IS NULL THEN
    RETURN 0;
  END IF;
  v_moved := cardinality(v_ids);
  -- Unique masks (capabilities.md §4), only for keyed rows whose mask treats their deferred state
  -- and 'available' differently (never the default mask, so the common path runs one probe):
  -- leaving the mask releases the key; entering it takes the key, and if a newer job holds it this
  -- one gives way, cancelled with 'superseded by duplicate <id>' (a wide terminal row).
  FOR v_row IN
    SELECT d.job_id, d.unique_key, d.unique_states FROM deferred d
    WHERE d.job_id = ANY (v_ids) AND d.unique_key IS NOT NULL
      AND ((d.unique_states & 2) <> 0) <> ((d.unique_states & state_bit(d.state)) <> 0)
    ORDER BY d.job_id
  LOOP
    IF (v_row.unique_states & 2) = 0 THEN
      DELETE FROM unique_claims u WHERE u.unique_key = v_row.unique_key AND u.job_id = v_row.job_id;
      CONTINUE;
    END IF;
    INSERT INTO unique_claims (unique_key, job_id) VALUES (v_row.unique_key, v_row.job_id) ON CONFLICT DO NOTHING;
    SELECT u.job_id INTO v_holder FROM unique_claims u WHERE u.unique_key = v_row.unique_key;
    IF v_holder <> v_row.job_id THEN
      DELETE FROM deferred d WHERE d.job_id = v_row.job_id RETURNING d.* INTO v_def;
      SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('terminal');
      INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                            kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
      VALUES (v_ring.slot, v_ring.generation, v_def.job_id, v_def.run_lease, 'cancelled', v_def.attempt, now(),
              append_error(v_def.errors, jsonb_build_object('error', 'cancelled: superseded by duplicate ' || v_holder,
                                                            'attempt', v_def.attempt, 'at', now())),
              v_def.progress, true, v_def.kind, v_def.queue, v_def.priority, v_def.args, v_def.metadata, v_def.tags,
              v_def.max_attempts, v_def.run_at, v_def.created_at, v_def.unique_key, v_def.unique_states);
      v_ids := array_remove(v_ids, v_row.job_id);
    END IF;
  END LOOP;
  IF cardinality(v_ids) = 0 THEN
    RETURN v_moved;
  END IF;
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
  SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, cardinality(v_ids))) s;

  WITH moved AS (
    DELETE FROM deferred d WHERE d.job_id = ANY (v_ids) RETURNING d.*
  ),
  ranked AS (
    SELECT m.*, row_number() OVER (ORDER BY m.run_at, m.job_id) AS rank FROM moved m
  ),
  ins AS (
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_ring.slot, v_ring.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, v_pos[r.rank], r.args, r.metadata,
           r.tags, r.errors, r.progress, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.unique_key, r.unique_states
    FROM ranked r
    RETURNING queue
  )
  SELECT array_agg(DISTINCT ins.queue) INTO v_q FROM ins;
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q) FROM unnest(v_q) AS q;
  RETURN v_moved;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- cancel_job: as in 0019, plus (0021) parked jobs: deleted under the lane's claim lock (unpark
-- takes it too), with a wide cancelled terminal row in the current slot, as for a deferred job.
-- Locks: per-job → claim lock of the lane (blocking).
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
      -- Parked (0021): out of the ring. The lane's claim lock keeps unpark away while we delete it.
      SELECT p.queue, p.priority, p.shard INTO v_row FROM parked p WHERE p.job_id = p_job_id;
      IF FOUND THEN
        PERFORM pg_advisory_xact_lock(lock_ns('claim'), lane_key(v_row.queue, v_row.priority, v_row.shard));
        DELETE FROM parked p WHERE p.job_id = p_job_id RETURNING p.* INTO v_row;
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
        CONTINUE; -- brought back into the ring meanwhile: look again
      END IF;
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

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.end_idle_blockers(int, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.prune_queue(int, bigint, bigint, bigint, bigint, int, int, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.release_pending_keys(int) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.unpark(int) FROM PUBLIC;
