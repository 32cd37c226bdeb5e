-- 0003: the storage engine's functions (storage-engine.md §5, §7).
--
-- Every function runs with a fixed search_path. Lock order everywhere:
--   ring serializer → per-job → per-lane enqueue → per-lane claim → per-attempt → slot children.
-- Advisory keys are a persistent wire format: derived from the schema name and never changed.
-- Statements after a lock acquisition are separate statements, so under READ COMMITTED their
-- snapshot includes everything committed by the previous holder.

-- Namespaces of the two-key advisory locks (classid), per schema.
CREATE FUNCTION :AWA_SCHEMA.lock_ns(p_name text) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT hashtext(':AWA_SCHEMA:' || p_name) $$;

CREATE FUNCTION :AWA_SCHEMA.lane_key(p_queue text, p_priority int, p_shard int) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT hashtext(p_queue || chr(31) || p_priority || chr(31) || p_shard) $$;

-- The per-attempt lock serialises every attempt-scoped write (finalize, rescue, heartbeat,
-- cancel, prune carry). One lock-table entry per attempt in a batch: at batch 512 and stock
-- max_locks_per_transaction 64 × max_connections 100 (6,400 entries) a dozen concurrent full
-- batches still fit.
CREATE FUNCTION :AWA_SCHEMA.attempt_key(p_job_id bigint, p_run_lease bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT hashint8extended(p_job_id, hashtext(':AWA_SCHEMA:attempt') + p_run_lease) $$;

CREATE FUNCTION :AWA_SCHEMA.state_bit(p_state text) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE p_state
    WHEN 'scheduled' THEN 1 WHEN 'available' THEN 2 WHEN 'running' THEN 4
    WHEN 'waiting_external' THEN 8 WHEN 'retryable' THEN 16 WHEN 'completed' THEN 32
    WHEN 'failed' THEN 64 WHEN 'cancelled' THEN 128 WHEN 'waiting_on' THEN 256 ELSE 0 END
$$;

-- Default backoff (twin of Backoff.defaultBackoffMs): 2^attempt s + [0, 25 %) jitter, capped at
-- 24 h. Interval arithmetic only: no float-to-text conversion.
CREATE FUNCTION :AWA_SCHEMA.backoff_ms(p_attempt int, p_random float8) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE WHEN base >= 86400000 THEN 86400000::bigint
              ELSE floor(base + (least(base * 1.25, 86400000) - base) * p_random)::bigint END
  FROM (SELECT least(power(2::numeric, least(p_attempt, 40)) * 1000, 86400000) AS base) b
$$;

CREATE FUNCTION :AWA_SCHEMA.append_error(p_errors jsonb, p_entry jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  -- keep the newest 100 entries
  SELECT coalesce(jsonb_agg(e ORDER BY n), '[]'::jsonb)
  FROM jsonb_array_elements(coalesce(p_errors, '[]'::jsonb) || jsonb_build_array(p_entry)) WITH ORDINALITY AS x(e, n)
  WHERE n > jsonb_array_length(coalesce(p_errors, '[]'::jsonb)) + 1 - 100
$$;

CREATE FUNCTION :AWA_SCHEMA.ring_current(p_ring text, OUT generation bigint, OUT slot int)
LANGUAGE sql STABLE AS $$
  SELECT r.generation, r.slot FROM :AWA_SCHEMA.ring_rotations r
  WHERE r.ring = p_ring ORDER BY r.generation DESC LIMIT 1
$$;

-- The queue ring's current incarnation, with a ROW EXCLUSIVE lock on the child of p_table in its
-- slot, for a writer about to insert there. Prune needs ACCESS EXCLUSIVE on that child, so once
-- we hold the lock the incarnation cannot be truncated under us; the ledger is re-read in a new
-- statement after the lock, and if a prune committed first we move on to the new current slot.
-- Without this, rows read-then-inserted could land in an incarnation already recorded as pruned,
-- which rotation would then wait on forever.
CREATE FUNCTION :AWA_SCHEMA.lock_current_slot(p_table text, OUT o_generation bigint, OUT o_slot int)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
BEGIN
  LOOP
    SELECT r.generation, r.slot INTO o_generation, o_slot FROM ring_rotations r
    WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
    EXECUTE format('LOCK TABLE %I.%I IN ROW EXCLUSIVE MODE', ':AWA_SCHEMA', p_table || '_' || o_slot);
    EXIT WHEN NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = o_generation);
  END LOOP;
END
$$;

-- Lane cursor: the largest retained claim mark, or 0 when none is retained (then every
-- retained row of the lane is unclaimed, so "from the smallest retained position" is the same).
CREATE FUNCTION :AWA_SCHEMA.lane_cursor(p_queue text, p_priority int, p_shard int) RETURNS bigint
LANGUAGE sql STABLE AS $$
  SELECT coalesce(max(m.next_lane_seq), 0) FROM :AWA_SCHEMA.claim_marks m
  WHERE m.queue = p_queue AND m.priority = p_priority AND m.shard = p_shard
$$;

-- ---------------------------------------------------------------------------------------------
-- enqueue(rows jsonb) -> (ord, job_id, state)
-- Input: a JSON array of {kind, queue, priority, args, metadata, tags, max_attempts, run_at?,
--        unique_key? (hex), unique_states}. All-or-nothing inside the caller's transaction.
-- Locks: enqueue lock of every touched lane, blocking, in sorted lane order (no deadlock between
--        multi-lane producers); held to commit, so positions commit in lane order.
-- Writes: ready rows (available now) or deferred rows (future run_at); unique_claims; NOTIFY.
-- Errors: SQLSTATE AWU01 (unique conflict; DETAIL = key hex, HINT = holder job id).
CREATE FUNCTION :AWA_SCHEMA.enqueue(p_rows jsonb)
RETURNS TABLE (ord int, job_id bigint, state text)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_n int := jsonb_array_length(p_rows);
  v_lane record;
  v_ring record;
  v_ids bigint[];
  v_pos bigint[];
  v_n_ready int;
  v_conflict record;
BEGIN
  FOR v_lane IN
    -- byte order (C collation): the TypeScript side sorts multi-call batches the same way
    SELECT DISTINCT r.queue COLLATE "C" AS queue, r.priority
    FROM jsonb_to_recordset(p_rows) AS r(queue text, priority int, run_at timestamptz)
    WHERE r.run_at IS NULL OR r.run_at <= v_now
    ORDER BY 1, 2
  LOOP
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_lane.queue, v_lane.priority, 0));
    INSERT INTO lanes (queue, priority, shard)
    SELECT v_lane.queue, v_lane.priority, 0
    WHERE NOT EXISTS (SELECT 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = 0)
    ON CONFLICT DO NOTHING;
  END LOOP;

  -- After the lane locks: the slot is never older than the lane's previous rows.
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
  SELECT array_agg(v ORDER BY v) INTO v_ids FROM (SELECT nextval('job_id_seq') AS v FROM generate_series(1, v_n)) s;
  SELECT count(*) INTO v_n_ready FROM jsonb_to_recordset(p_rows) AS r(run_at timestamptz)
  WHERE r.run_at IS NULL OR r.run_at <= v_now;
  SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, v_n_ready)) s;

  RETURN QUERY
  WITH input AS (
    SELECT x_e.o::int AS o, v_ids[x_e.o] AS id, x.kind, x.queue, x.priority, x.args, x.metadata,
           ARRAY(SELECT jsonb_array_elements_text(x.tags)) AS tags, x.max_attempts,
           coalesce(x.run_at, v_now) AS run_at, (x.run_at IS NULL OR x.run_at <= v_now) AS ready,
           decode(x.unique_key, 'hex') AS unique_key, coalesce(x.unique_states, 0) AS unique_states
    FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS x_e(v, o), jsonb_to_record(x_e.v) AS x(kind text, queue text, priority smallint, args jsonb,
         metadata jsonb, tags jsonb, max_attempts int, run_at timestamptz, unique_key text, unique_states int)
  ),
  ranked AS (
    SELECT i.*, row_number() OVER (ORDER BY i.o) AS rank FROM input i WHERE i.ready
  ),
  ins_ready AS (
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_ring.slot, v_ring.generation, r.id, r.kind, r.queue, r.priority, 0, v_pos[r.rank], r.args, r.metadata,
           r.tags, '[]', 0, 0, r.max_attempts, r.run_at, v_now, r.unique_key, r.unique_states
    FROM ranked r
  ),
  ins_deferred AS (
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT i.id, 'scheduled', i.kind, i.queue, i.priority, 0, i.args, i.metadata, i.tags, '[]', 0, 0,
           i.max_attempts, i.run_at, v_now, i.unique_key, i.unique_states
    FROM input i WHERE NOT i.ready
  ),
  ins_unique AS (
    INSERT INTO unique_claims (unique_key, job_id)
    SELECT i.unique_key, i.id FROM input i WHERE i.unique_key IS NOT NULL ORDER BY i.o
    ON CONFLICT (unique_key) DO NOTHING
  )
  SELECT i.o, i.id, CASE WHEN i.ready THEN 'available' ELSE 'scheduled' END
  FROM input i
  ORDER BY i.o;

  -- A unique row that was not inserted lost to an existing holder (or to an earlier row of
  -- this batch): reject the whole call.
  SELECT encode(x.k, 'hex') AS key, u.job_id AS holder INTO v_conflict
  FROM (SELECT decode(r.unique_key, 'hex') AS k, v_ids[r_e.o] AS id
        FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS r_e(v, o), jsonb_to_record(r_e.v) AS r(unique_key text)
        WHERE r.unique_key IS NOT NULL) x
  JOIN unique_claims u ON u.unique_key = x.k
  WHERE u.job_id <> x.id
  LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION 'unique key % is held by job %', v_conflict.key, v_conflict.holder
      USING ERRCODE = 'AWU01', DETAIL = v_conflict.key, HINT = v_conflict.holder::text;
  END IF;

  -- Delivered on commit only; identical (channel, payload) pairs are folded by Postgres.
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q.queue)
  FROM (SELECT DISTINCT r.queue FROM jsonb_to_recordset(p_rows) AS r(queue text, run_at timestamptz)
        WHERE r.run_at IS NULL OR r.run_at <= v_now) q;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- claim(queue, max, deadline_ms, aging_ms) -> claimed job snapshots, in claim order.
-- One round trip. Paused queue ⇒ nothing.
-- Order: lanes by effective priority max(1, priority − floor(waited / aging)), then head run_at,
--        then stored priority; within a lane strictly by lane_seq.
-- Locks: claim lock of each lane, tried (pg_try_advisory_xact_lock): concurrent claimers work
--        on different lanes. A namespace distinct from the enqueue lock, so a slow producer
--        never blocks claimers.
-- Guard: the cursor is re-read in a new statement after the lock, so it includes the previous
--        claimer's mark; a claim scans only committed rows, and a committed position implies all
--        smaller positions of the lane are committed or aborted (enqueue lock held to commit).
-- Writes: claims (run_lease + 1, attempt + 1) in the ready row's slot; one claim mark per lane in
--        the current slot. Nothing is updated.
-- Indexes: lanes PK; claim_marks (lane, next_lane_seq DESC); ready PK (lane, lane_seq);
--        ready_tombstones (lane, lane_seq).
CREATE FUNCTION :AWA_SCHEMA.claim(p_queue text, p_max int, p_deadline_ms bigint, p_aging_ms bigint)
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
BEGIN
  IF p_max <= 0 OR EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused) THEN
    RETURN;
  END IF;
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
    CONTINUE WHEN NOT pg_try_advisory_xact_lock(lock_ns('claim'), lane_key(p_queue, v_lane.priority, v_lane.shard));
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
    ORDER BY c.lane_seq;
    v_left := v_left - cardinality(v_seqs);
  END LOOP;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- finalize(items jsonb) -> (ord, applied, state), one row per item in input order.
-- Input: JSON array of {job_id, run_lease, outcome: complete|retry|snooze|cancel|fail,
--        delay_ms?, message?}.
-- Locks: per-attempt advisory lock of every item, blocking, in sorted (job_id, run_lease) order.
-- Guard: claim exists and has no closure, read in a new statement after the locks. Exactly one
--        of complete/rescue/cancel wins an attempt; the others see its closure and are stale.
--        The same token twice in one call: the first item applies.
-- Writes: closures, then terminal (narrow) or deferred rows; deletes the attempt_state row if
--        any; releases the unique key when the new state is outside the job's mask.
--        No UPDATE or DELETE on ring tables.
CREATE FUNCTION :AWA_SCHEMA.finalize(p_items jsonb)
RETURNS TABLE (ord int, applied boolean, state text)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_attempt record;
BEGIN
  FOR v_attempt IN
    SELECT DISTINCT i.job_id, i.run_lease FROM jsonb_to_recordset(p_items) AS i(job_id bigint, run_lease bigint)
    ORDER BY i.job_id, i.run_lease
  LOOP
    PERFORM pg_advisory_xact_lock(attempt_key(v_attempt.job_id, v_attempt.run_lease));
  END LOOP;

  RETURN QUERY
  WITH items AS (
    SELECT x_e.o::int AS o, x.job_id, x.run_lease, x.outcome, coalesce(x.delay_ms, 0) AS delay_ms, x.message
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x_e(v, o), jsonb_to_record(x_e.v) AS x(job_id bigint, run_lease bigint, outcome text, delay_ms bigint, message text)
  ),
  open AS (
    SELECT DISTINCT ON (i.job_id, i.run_lease)
           i.o, i.outcome, i.delay_ms, i.message, c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.lane_seq,
           r.kind, r.queue, r.priority, r.shard, r.args, r.metadata, r.tags, r.errors, r.max_attempts, r.created_at,
           r.unique_key, r.unique_states, coalesce(a.progress, r.progress) AS progress,
           CASE i.outcome
             WHEN 'complete' THEN 'completed'
             WHEN 'cancel' THEN 'cancelled'
             WHEN 'fail' THEN 'failed'
             WHEN 'snooze' THEN 'scheduled'
             WHEN 'retry' THEN CASE WHEN c.attempt >= r.max_attempts THEN 'failed' ELSE 'retryable' END
           END AS new_state
    FROM items i
    JOIN claims c ON c.job_id = i.job_id AND c.run_lease = i.run_lease
    -- the claimed row by its full key: lane_seq, not run_lease, is unique per ready row (a cancelled
    -- and then retried job has two ready rows with the same lease)
    JOIN ready r ON r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard AND r.lane_seq = c.lane_seq AND r.slot = c.slot
    LEFT JOIN attempt_state a ON a.job_id = c.job_id AND a.run_lease = c.run_lease
    WHERE NOT EXISTS (SELECT 1 FROM closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease)
    ORDER BY i.job_id, i.run_lease, i.o
  ),
  resolved AS (
    SELECT o.*,
           CASE WHEN o.outcome IN ('retry', 'fail') THEN
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
    FROM resolved r WHERE r.new_state IN ('completed', 'failed', 'cancelled')
  ),
  ins_deferred AS (
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, progress, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT r.job_id, r.new_state, r.kind, r.queue, r.priority, r.shard, r.args, r.metadata, r.tags,
           coalesce(r.new_errors, r.errors), r.progress,
           CASE WHEN r.new_state = 'scheduled' THEN r.attempt - 1 ELSE r.attempt END,
           r.run_lease, r.max_attempts, v_now + r.delay_ms * interval '1 millisecond', r.created_at, r.unique_key, r.unique_states
    FROM resolved r WHERE r.new_state IN ('retryable', 'scheduled')
  ),
  del_state AS (
    DELETE FROM attempt_state a USING resolved r WHERE a.job_id = r.job_id AND a.run_lease = r.run_lease
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

-- ---------------------------------------------------------------------------------------------
-- heartbeat(items jsonb) -> tokens that are no longer open (the runtime interrupts them).
-- Input: JSON array of {job_id, run_lease, progress?}.
-- Locks: per-attempt lock, sorted: a heartbeat never resurrects state of a just-closed attempt.
-- Writes: attempt_state upsert (HOT update of heartbeat_at / progress) for open attempts only.
CREATE FUNCTION :AWA_SCHEMA.heartbeat(p_items jsonb)
RETURNS TABLE (job_id bigint, run_lease bigint)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_attempt record;
BEGIN
  FOR v_attempt IN
    SELECT DISTINCT i.job_id, i.run_lease FROM jsonb_to_recordset(p_items) AS i(job_id bigint, run_lease bigint)
    ORDER BY i.job_id, i.run_lease
  LOOP
    PERFORM pg_advisory_xact_lock(attempt_key(v_attempt.job_id, v_attempt.run_lease));
  END LOOP;
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
-- rescue(kind, staleness_ms, limit) -> rescued attempts and their new state.
-- kind 'stale': open claims older than the staleness with no heartbeat newer than it.
-- kind 'deadline': open claims whose deadline has passed.
-- Each goes through finalize() as a retry with the default backoff, so it counts as an attempt
-- and an exhausted job fails instead of retrying forever. After commit every process receives
-- a cancel notification '<job_id>:<run_lease>' and interrupts a matching handler.
CREATE FUNCTION :AWA_SCHEMA.rescue(p_kind text, p_staleness_ms bigint, p_limit int)
RETURNS TABLE (job_id bigint, run_lease bigint, state text)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
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
             'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'heartbeat stale: worker presumed dead'))
      INTO v_items FROM cand;
  ELSE
    WITH cand AS (
      SELECT c.job_id, c.run_lease, c.attempt FROM claims c
      WHERE c.deadline_at < now()
        AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
      ORDER BY c.deadline_at LIMIT p_limit
    )
    SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry',
             'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'hard deadline exceeded'))
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
-- promote(limit) -> number of deferred jobs moved to their lanes.
-- Locks: enqueue lock of each lane, TRIED in sorted order: a lane whose producer sits in a slow
--        transaction is skipped until the next tick instead of stalling all promotion.
--        Due rows are taken FOR UPDATE SKIP LOCKED (two promoters never move one row).
-- Writes: DELETE from deferred (mutable table), ready rows with fresh positions in
--        (run_at, job_id) order, keeping attempt and run_lease; NOTIFY per queue.
CREATE FUNCTION :AWA_SCHEMA.promote(p_limit int)
RETURNS int
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_lane record;
  v_q text[] := '{}';
  v_p int[] := '{}';
  v_ids bigint[];
  v_pos bigint[];
  v_ring record;
BEGIN
  FOR v_lane IN
    SELECT DISTINCT d.queue COLLATE "C" AS queue, d.priority
    FROM (SELECT d.queue, d.priority FROM deferred d
          WHERE d.state IN ('scheduled', 'retryable') AND d.run_at <= now()
          ORDER BY d.run_at, d.job_id LIMIT p_limit) d
    ORDER BY 1, 2
  LOOP
    IF pg_try_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_lane.queue, v_lane.priority, 0)) THEN
      v_q := v_q || v_lane.queue;
      v_p := v_p || v_lane.priority::int;
      INSERT INTO lanes (queue, priority, shard)
      SELECT v_lane.queue, v_lane.priority, 0
      WHERE NOT EXISTS (SELECT 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = 0)
      ON CONFLICT DO NOTHING;
    END IF;
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
  RETURN cardinality(v_ids);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- Every representation of every job, most current first per job (storage-engine.md §5.9):
--   1 deferred row, 2 open claim (running), 3 unclaimed non-tombstoned ready row (available),
--   4 newest terminal or history row. Older rows are history; nothing is ever rewritten.
-- Reads scan retained partitions: exact but "may be slow" on large rings.
CREATE VIEW :AWA_SCHEMA.job_representations AS
  SELECT d.job_id, 1 AS rank, d.state, d.kind, d.queue, d.priority, d.args, d.metadata, d.tags, d.errors, d.progress,
         d.attempt, d.max_attempts, d.run_lease, d.run_at, d.created_at, NULL::timestamptz AS finalized_at
  FROM :AWA_SCHEMA.deferred d
UNION ALL
  SELECT c.job_id, 2, 'running', r.kind, r.queue, r.priority, r.args, r.metadata, r.tags, r.errors,
         coalesce(a.progress, r.progress), c.attempt, r.max_attempts, c.run_lease, r.run_at, r.created_at, NULL
  FROM :AWA_SCHEMA.claims c
  JOIN :AWA_SCHEMA.ready r ON r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard AND r.lane_seq = c.lane_seq AND r.slot = c.slot
  LEFT JOIN :AWA_SCHEMA.attempt_state a ON a.job_id = c.job_id AND a.run_lease = c.run_lease
  WHERE NOT EXISTS (SELECT 1 FROM :AWA_SCHEMA.closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
UNION ALL
  SELECT r.job_id, 3, 'available', r.kind, r.queue, r.priority, r.args, r.metadata, r.tags, r.errors, r.progress,
         r.attempt, r.max_attempts, r.run_lease, r.run_at, r.created_at, NULL
  FROM :AWA_SCHEMA.ready r
  WHERE NOT EXISTS (SELECT 1 FROM :AWA_SCHEMA.claims c WHERE c.job_id = r.job_id AND c.lane_seq = r.lane_seq)
    AND NOT EXISTS (SELECT 1 FROM :AWA_SCHEMA.ready_tombstones t
                    WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq)
UNION ALL
  SELECT t.job_id, 4, t.state, coalesce(t.kind, r.kind), coalesce(t.queue, r.queue), coalesce(t.priority, r.priority),
         coalesce(t.args, r.args), coalesce(t.metadata, r.metadata), coalesce(t.tags, r.tags),
         coalesce(t.errors, r.errors), t.progress, t.attempt, coalesce(t.max_attempts, r.max_attempts), t.run_lease,
         coalesce(t.run_at, r.run_at), coalesce(t.created_at, r.created_at), t.finalized_at
  FROM :AWA_SCHEMA.terminal t
  LEFT JOIN :AWA_SCHEMA.ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
UNION ALL
  SELECT h.job_id, 4, h.state, h.kind, h.queue, h.priority, h.args, h.metadata, h.tags, h.errors, h.progress,
         h.attempt, h.max_attempts, h.run_lease, h.run_at, h.created_at, h.finalized_at
  FROM :AWA_SCHEMA.history h;

CREATE VIEW :AWA_SCHEMA.jobs AS
  SELECT DISTINCT ON (j.job_id) j.job_id, j.state, j.kind, j.queue, j.priority, j.args, j.metadata, j.tags, j.errors,
         j.progress, j.attempt, j.max_attempts, j.run_lease, j.run_at, j.created_at, j.finalized_at
  FROM :AWA_SCHEMA.job_representations j
  ORDER BY j.job_id, j.rank, j.run_lease DESC, j.finalized_at DESC NULLS LAST;

-- ---------------------------------------------------------------------------------------------
-- cancel_job(id, reason) -> 'cancelled', 'terminal:<state>' when it had already finished, or
-- NULL when the job does not exist.
-- Locks: per-job lock (serialises operator actions on one job); then, by representation:
--   deferred: the row is deleted (waits for a promoter holding it; then retries as ready);
--   running: finalize() with outcome cancel (per-attempt lock) + cancel notification;
--   unclaimed ready: the lane's claim lock, blocking; the cursor is re-read after it, and if
--   the row is still unclaimed a tombstone and a wide terminal row go into the row's slot.
CREATE FUNCTION :AWA_SCHEMA.cancel_job(p_job_id bigint, p_reason text)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
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
  FOR v_try IN 1 .. 5 LOOP
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

-- ---------------------------------------------------------------------------------------------
-- retry_job(id) -> resulting state ('available'), the unchanged state when it is not failed or
-- cancelled, or NULL when the job does not exist.
-- Locks: per-job lock, then the lane's enqueue lock (blocking, like an insert).
-- Writes: a new ready row (attempt 0, run_lease unchanged, errors kept) in the current slot;
--         re-acquires the unique key when the mask holds 'available' (AWU01 on conflict).
CREATE FUNCTION :AWA_SCHEMA.retry_job(p_job_id bigint)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
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
  IF v_key.unique_key IS NOT NULL AND (v_key.unique_states & state_bit('available')) <> 0 THEN
    INSERT INTO unique_claims (unique_key, job_id) VALUES (v_key.unique_key, p_job_id) ON CONFLICT DO NOTHING;
    SELECT u.job_id INTO v_holder FROM unique_claims u WHERE u.unique_key = v_key.unique_key;
    IF v_holder <> p_job_id THEN
      RAISE EXCEPTION 'unique key % is held by job %', encode(v_key.unique_key, 'hex'), v_holder
        USING ERRCODE = 'AWU01', DETAIL = encode(v_key.unique_key, 'hex'), HINT = v_holder::text;
    END IF;
  END IF;
  PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_job.queue, v_job.priority, 0));
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
-- rotate(ring, min_age_ms) -> 'Rotated' | 'SkippedIdle' | 'SkippedBusy' | 'SkippedLocked'
-- Locks: the ring serializer, tried (a busy serializer skips the tick).
-- Rule: stay while the current slot is empty (an idle ring writes nothing) or younger than
--       min_age_ms (the history ring rotates by age); enter the next slot only when its previous
--       incarnation is recorded as pruned and it has no visible rows (uncommitted rows cannot be
--       seen, which is why the ledger check is needed too).
-- Writes: one ring_rotations row; ON CONFLICT DO NOTHING means another rotator won ⇒ busy.
CREATE FUNCTION :AWA_SCHEMA.rotate(p_ring text, p_min_age_ms bigint)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots(p_ring);
  v_cur record;
  v_next int;
  v_rotated_at timestamptz;
BEGIN
  IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext(p_ring)) THEN
    RETURN 'SkippedLocked';
  END IF;
  SELECT r.generation, r.slot, r.rotated_at INTO v_cur FROM ring_rotations r
  WHERE r.ring = p_ring ORDER BY r.generation DESC LIMIT 1;
  IF p_ring = 'queue' THEN
    IF NOT EXISTS (SELECT 1 FROM ready r WHERE r.slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM terminal t WHERE t.slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM claim_marks m WHERE m.slot = v_cur.slot) THEN
      RETURN 'SkippedIdle';
    END IF;
  ELSIF NOT EXISTS (SELECT 1 FROM history h WHERE h.slot = v_cur.slot) THEN
    RETURN 'SkippedIdle';
  END IF;
  IF v_cur.rotated_at > now() - p_min_age_ms * interval '1 millisecond' THEN
    RETURN 'SkippedIdle';
  END IF;
  v_next := ((v_cur.generation + 1) % v_n)::int;
  IF v_cur.generation + 1 - v_n >= 0 AND NOT EXISTS (
       SELECT 1 FROM ring_prunes p WHERE p.ring = p_ring AND p.generation = v_cur.generation + 1 - v_n) THEN
    RETURN 'SkippedBusy';
  END IF;
  IF p_ring = 'queue' THEN
    IF EXISTS (SELECT 1 FROM ready r WHERE r.slot = v_next) OR EXISTS (SELECT 1 FROM claims c WHERE c.slot = v_next)
       OR EXISTS (SELECT 1 FROM claim_marks m WHERE m.slot = v_next) OR EXISTS (SELECT 1 FROM terminal t WHERE t.slot = v_next)
       OR EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_next) OR EXISTS (SELECT 1 FROM ready_tombstones t WHERE t.slot = v_next) THEN
      RETURN 'SkippedBusy';
    END IF;
  ELSIF EXISTS (SELECT 1 FROM history h WHERE h.slot = v_next) THEN
    RETURN 'SkippedBusy';
  END IF;
  INSERT INTO ring_rotations (ring, generation, slot) VALUES (p_ring, v_cur.generation + 1, v_next)
  ON CONFLICT DO NOTHING;
  IF NOT FOUND THEN
    RETURN 'SkippedBusy';
  END IF;
  RETURN 'Rotated';
END
$$;

-- Does the queue-ring slot hold a row a claimer could still take? (the prune proof, part a)
-- A ready row at or beyond its lane's cursor that is not tombstoned. Considers every row
-- physically in the slot, whatever its generation.
CREATE FUNCTION :AWA_SCHEMA.slot_has_unclaimed(p_slot int) RETURNS boolean
LANGUAGE sql STABLE AS $$
  -- one cursor per lane present in the slot (MATERIALIZED, so computed once), then an index
  -- probe from that cursor
  WITH cur AS MATERIALIZED (
    SELECT l.queue, l.priority, l.shard, :AWA_SCHEMA.lane_cursor(l.queue, l.priority, l.shard) AS c
    FROM (SELECT DISTINCT r.queue, r.priority, r.shard FROM :AWA_SCHEMA.ready r WHERE r.slot = p_slot) l
  )
  SELECT EXISTS (
    SELECT 1 FROM cur
    WHERE EXISTS (
      SELECT 1 FROM :AWA_SCHEMA.ready r
      WHERE r.slot = p_slot AND r.queue = cur.queue AND r.priority = cur.priority AND r.shard = cur.shard AND r.lane_seq >= cur.c
        AND NOT EXISTS (SELECT 1 FROM :AWA_SCHEMA.ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq)))
$$;

CREATE FUNCTION :AWA_SCHEMA.retention(p_state text, p_queue text, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
RETURNS interval
LANGUAGE sql STABLE AS $$
  SELECT CASE p_state
    WHEN 'completed' THEN coalesce(m.completed_retention, p_completed_ms * interval '1 millisecond')
    WHEN 'failed' THEN coalesce(m.failed_retention, p_failed_ms * interval '1 millisecond')
    ELSE coalesce(m.cancelled_retention, p_cancelled_ms * interval '1 millisecond') END
  FROM (SELECT 1) one LEFT JOIN :AWA_SCHEMA.queue_meta m ON m.queue = p_queue
$$;

-- Release unique keys held by terminal rows about to be truncated, unless the job has a newer
-- representation (an operator retry) that now holds the key. TRUNCATE fires no triggers, so
-- release is explicit. p_rows: JSON array of {job_id, run_lease, finalized_at, unique_key (hex)}.
CREATE FUNCTION :AWA_SCHEMA.release_keys_of(p_rows jsonb) RETURNS void
LANGUAGE sql AS $$
  DELETE FROM :AWA_SCHEMA.unique_claims u
  USING jsonb_to_recordset(p_rows) AS x(job_id bigint, run_lease bigint, finalized_at timestamptz, unique_key text)
  WHERE u.unique_key = decode(x.unique_key, 'hex') AND u.job_id = x.job_id
    AND NOT EXISTS (
      SELECT 1 FROM :AWA_SCHEMA.job_representations j
      WHERE j.job_id = x.job_id
        AND (j.rank < 4 OR j.run_lease > x.run_lease OR (j.run_lease = x.run_lease AND j.finalized_at > x.finalized_at)))
$$;

-- ---------------------------------------------------------------------------------------------
-- prune_queue(lock_timeout_ms, retention...) -> (outcome, generation, carried)
-- Oldest sealed incarnation per call (storage-engine.md §7.2):
--  1 ring serializer (tried) → 2 cheap proof: no claimable row → 3 try the per-attempt lock of
--  every open claim (a finalizer holding one makes us back off) → 4 ACCESS EXCLUSIVE on the
--  slot's children under a short lock_timeout (timeout ⇒ Blocked(lock); a queued request stalls
--  other sessions at most that long) → 5 re-proof over all rows → 6 carry open attempts (ready
--  row, claim, and a mark at the lane's cursor) into the current slot, so long jobs never stall
--  rotation → 7 copy terminal rows inside their retention, widened, into the history ring →
--  8 release unique keys of the rest → 9 fold counts into the ledger row → 10 TRUNCATE.
CREATE FUNCTION :AWA_SCHEMA.prune_queue(p_lock_timeout_ms int, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
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

-- ---------------------------------------------------------------------------------------------
-- prune_history(lock_timeout_ms, retention...) -> (outcome, generation, carried = 0)
-- Truncates the oldest sealed history incarnation once its newest row is older than the
-- longest retention in force; releases the unique keys its rows held.
CREATE FUNCTION :AWA_SCHEMA.prune_history(p_lock_timeout_ms int, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
RETURNS TABLE (outcome text, generation bigint, carried int)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
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
  BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    EXECUTE format('LOCK TABLE %I.history_%s IN ACCESS EXCLUSIVE MODE', ':AWA_SCHEMA', v_slot);
  EXCEPTION WHEN lock_not_available THEN
    RETURN QUERY SELECT 'Blocked:lock', v_old, 0;
    RETURN;
  END;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);
  SELECT (SELECT jsonb_object_agg(k, n) FROM (SELECT h.queue || ':' || h.state AS k, count(*) AS n FROM history h WHERE h.slot = v_slot GROUP BY 1) c),
         (SELECT jsonb_agg(jsonb_build_object('job_id', h.job_id, 'run_lease', h.run_lease, 'finalized_at', h.finalized_at,
                                              'unique_key', encode(h.unique_key, 'hex')))
          FROM history h WHERE h.slot = v_slot AND h.unique_key IS NOT NULL)
    INTO v_rollup, v_keys;
  -- Truncate first: release_keys_of must no longer see these rows as a representation of the job.
  EXECUTE format('TRUNCATE %I.history_%s', ':AWA_SCHEMA', v_slot);
  IF v_keys IS NOT NULL THEN
    PERFORM release_keys_of(v_keys);
  END IF;
  INSERT INTO ring_prunes (ring, generation, slot, rollup) VALUES ('history', v_old, v_slot, coalesce(v_rollup, '{}'));
  RETURN QUERY SELECT 'Pruned', v_old, 0;
END
$$;

-- Least privilege from the start: only the owner (and roles granted later) may call these.
DO $$
DECLARE f record;
BEGIN
  FOR f IN SELECT p.oid::regprocedure AS sig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ':AWA_SCHEMA' LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f.sig);
  END LOOP;
END
$$;
