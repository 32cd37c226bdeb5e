-- 0018: run on the PostgreSQL users have (issue 13; docs/adr/0021-server-defaults.md).
--
-- 1. JIT off in every PL/pgSQL function. Stock PostgreSQL (Debian's 15, JIT compiled in) JIT-
--    compiles any plan that costs more than jit_above_cost (100,000). finalize's plan costs
--    ~2×10¹⁰: enable_nestloop = off (0015) only adds a huge constant to the nested loops it cannot
--    avoid (its attempt_state probe), so every call compiled 365 functions with inlining and
--    optimisation: 9 s per finalize(50) instead of 15 ms. The plans of our functions are small
--    and run for milliseconds; no JIT compile ever pays for itself there. A SET clause on the
--    function applies while its statements are planned (cached generic plans keep the flag they
--    were planned with), so the session's jit no longer matters. SQL-language helpers get no SET
--    clause: it would stop their inlining; inlined, they are planned inside their caller, and the
--    others are only called from our PL/pgSQL functions or from trivial queries.
-- 2. A duplicate is an outcome, not an ERROR. enqueue_one, enqueue_batch and enqueue(jsonb)
--    inserted their rows, then the unique key, and raised SQLSTATE AWU01 when the key was held:
--    the server logged an ERROR (with STATEMENT and CONTEXT) per duplicate, the aborted ready row
--    left a dead tuple in a ring child (review m1), and the caller's transaction was aborted. Now
--    the key is inserted first (after the lane lock, so the lock order is unchanged); when it is
--    held, nothing else is written and the call returns state 'duplicate' with the holder's id.
--    A batch that loses a key deletes the keys it had just inserted (rows of its own transaction,
--    in the mutable unique_claims table; no ring row was written) and returns the first lost key.
--    The TypeScript layer turns 'duplicate' into the same typed UniqueConflict as before.
--    cron_fire no longer needs a sub-transaction to catch the conflict; cron_trigger returns the
--    state too. (Operator retries, retry_job and retry_from_dlq, still raise AWU01: rare, and an
--    operator asked for that one job.)
-- 3. Enqueue outside READ COMMITTED is diverted to `deferred` (docs/adr/0015). Every guard that
--    places a ready row in a live ring slot re-reads the ledger in a new statement after a lock,
--    which is only fresh under READ COMMITTED. Under REPEATABLE READ or SERIALIZABLE every
--    statement sees the transaction's first snapshot, so the row could land in a slot already
--    recorded as pruned: never claimable, and rotation stuck for good (review C1a). The enqueue
--    functions run in the caller's transaction and must not refuse it, so there they write the
--    job to `deferred` ('scheduled', run_at = now() unless a later run_at was asked for), which
--    involves no ring; the leader's promote, at READ COMMITTED, gives it a lane position within
--    one promote tick. No lane lock is taken for a diverted job (it has no position yet).
-- 4. No function of ours is executable by PUBLIC: 0012's enqueue_one, enqueue_batch and
--    enqueue_ready_slot never had EXECUTE revoked. Revoked here for every function in the schema.
-- A catalog test (packages/sql/test/Catalog.test.ts) checks all of this for every function, so a
-- later migration cannot forget it: CREATE OR REPLACE replaces the SET clauses too, so a new
-- definition must spell out `SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off`.

-- ---------------------------------------------------------------------------------------------
-- enqueue_one(kind, queue, priority, args, metadata, tags, max_attempts, run_at, unique_key,
--             unique_states) -> (job_id, state)
-- One job, as enqueue(jsonb) with a one-row array. tags: a JSON array of strings or NULL (none).
-- Locks: the lane's enqueue lock (blocking) when the job is available now; held to commit, so
--        positions commit in lane order. None for a future run_at or a diverted job (deferred).
-- Writes: unique_claims first (when a key is given); then a ready row (available now, READ
--        COMMITTED) or a deferred row (future run_at, or any other isolation level); NOTIFY (on
--        commit) for a ready row.
-- Outcome: state 'available' or 'scheduled' with the new job's id; or state 'duplicate' with the
--        id of the job holding the key (NULL if the holder is not visible to this snapshot), and
--        nothing written.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.enqueue_one(p_kind text, p_queue text, p_priority int, p_args jsonb,
                                                   p_metadata jsonb, p_tags jsonb, p_max_attempts int,
                                                   p_run_at timestamptz, p_unique_key bytea, p_unique_states int,
                                                   OUT job_id bigint, OUT state text)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_id bigint := nextval('job_id_seq');
  v_tags text[];
  v_generation bigint;
  v_slot int;
  v_ready boolean := (p_run_at IS NULL OR p_run_at <= v_now)
                     AND current_setting('transaction_isolation') = 'read committed';
BEGIN
  IF p_tags IS NULL OR jsonb_array_length(p_tags) = 0 THEN
    v_tags := '{}';
  ELSE
    v_tags := ARRAY(SELECT jsonb_array_elements_text(p_tags));
  END IF;
  IF v_ready THEN
    -- = lane_key(p_queue, p_priority, 0), written with immutable operators so it is inlined
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'),
                                  hashtext(p_queue || chr(31) || p_priority::text || chr(31) || '0'));
    PERFORM 1 FROM lanes l WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = 0;
    IF NOT FOUND THEN
      INSERT INTO lanes (queue, priority, shard) VALUES (p_queue, p_priority, 0) ON CONFLICT DO NOTHING;
    END IF;
  END IF;
  IF p_unique_key IS NOT NULL THEN
    INSERT INTO unique_claims (unique_key, job_id) VALUES (p_unique_key, v_id) ON CONFLICT (unique_key) DO NOTHING;
    IF NOT FOUND THEN
      SELECT u.job_id INTO job_id FROM unique_claims u WHERE u.unique_key = p_unique_key;
      state := 'duplicate';
      RETURN;
    END IF;
  END IF;
  IF v_ready THEN
    -- After the lane lock: the slot is never older than the lane's previous rows. As
    -- enqueue_ready_slot, inline (one function call less per job).
    LOOP
      SELECT r.generation, r.slot INTO v_generation, v_slot FROM ring_rotations r
      WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
      CASE v_slot
        WHEN 0 THEN LOCK TABLE :AWA_SCHEMA.ready_0 IN ROW EXCLUSIVE MODE;
        WHEN 1 THEN LOCK TABLE :AWA_SCHEMA.ready_1 IN ROW EXCLUSIVE MODE;
        WHEN 2 THEN LOCK TABLE :AWA_SCHEMA.ready_2 IN ROW EXCLUSIVE MODE;
        WHEN 3 THEN LOCK TABLE :AWA_SCHEMA.ready_3 IN ROW EXCLUSIVE MODE;
        WHEN 4 THEN LOCK TABLE :AWA_SCHEMA.ready_4 IN ROW EXCLUSIVE MODE;
        WHEN 5 THEN LOCK TABLE :AWA_SCHEMA.ready_5 IN ROW EXCLUSIVE MODE;
        WHEN 6 THEN LOCK TABLE :AWA_SCHEMA.ready_6 IN ROW EXCLUSIVE MODE;
        WHEN 7 THEN LOCK TABLE :AWA_SCHEMA.ready_7 IN ROW EXCLUSIVE MODE;
        WHEN 8 THEN LOCK TABLE :AWA_SCHEMA.ready_8 IN ROW EXCLUSIVE MODE;
        WHEN 9 THEN LOCK TABLE :AWA_SCHEMA.ready_9 IN ROW EXCLUSIVE MODE;
        WHEN 10 THEN LOCK TABLE :AWA_SCHEMA.ready_10 IN ROW EXCLUSIVE MODE;
        WHEN 11 THEN LOCK TABLE :AWA_SCHEMA.ready_11 IN ROW EXCLUSIVE MODE;
        WHEN 12 THEN LOCK TABLE :AWA_SCHEMA.ready_12 IN ROW EXCLUSIVE MODE;
        WHEN 13 THEN LOCK TABLE :AWA_SCHEMA.ready_13 IN ROW EXCLUSIVE MODE;
        WHEN 14 THEN LOCK TABLE :AWA_SCHEMA.ready_14 IN ROW EXCLUSIVE MODE;
        WHEN 15 THEN LOCK TABLE :AWA_SCHEMA.ready_15 IN ROW EXCLUSIVE MODE;
        -- a ring installed with more slots than 0002's 16
        ELSE EXECUTE format('LOCK TABLE %I.%I IN ROW EXCLUSIVE MODE', ':AWA_SCHEMA', 'ready_' || v_slot);
      END CASE;
      EXIT WHEN NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = v_generation);
    END LOOP;
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    VALUES (v_slot, v_generation, v_id, p_kind, p_queue, p_priority, 0, nextval('lane_seq'), p_args,
            p_metadata, v_tags, '[]', 0, 0, p_max_attempts, coalesce(p_run_at, v_now), v_now, p_unique_key,
            coalesce(p_unique_states, 0));
    state := 'available';
    -- Delivered on commit only.
    PERFORM pg_notify('awa_wake_:AWA_SCHEMA', p_queue);
  ELSE
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    VALUES (v_id, 'scheduled', p_kind, p_queue, p_priority, 0, p_args, p_metadata, v_tags, '[]', 0, 0,
            p_max_attempts, coalesce(p_run_at, v_now), v_now, p_unique_key, coalesce(p_unique_states, 0));
    state := 'scheduled';
  END IF;
  job_id := v_id;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- enqueue_batch(headers, args, header_of, keys) -> (job_ids, scheduled_headers, conflict_key,
--                                                  conflict_holder)
-- Input: as 0012 (headers, a JSON array of {kind, queue, priority, metadata, tags, max_attempts,
--        run_at?, unique_states}; args, one JSON element per job; header_of, each job's header
--        index or NULL when all use header 0; keys, each job's unique key (hex) or null, or NULL).
--        Rows sharing a lane must be in FIFO order in `args`. All-or-nothing.
-- Output: job ids in input order; the indexes of the headers whose jobs were deferred (a future
--        run_at by the database clock; every header outside READ COMMITTED), NULL when none was.
--        On a unique conflict (also between two rows of the batch): job_ids and scheduled_headers
--        NULL, conflict_key = the first lost key (hex, input order), conflict_holder = its holder
--        (NULL if not visible to this snapshot); nothing stays written.
-- Locks: enqueue lock of every lane with jobs available now, blocking, in sorted lane order
--        (queue in C collation, then priority: the TypeScript side sorts multi-call batches the
--        same way); held to commit, so positions commit in lane order.
-- Writes: unique_claims first; then ready rows (available now) or deferred rows; NOTIFY.
DROP FUNCTION :AWA_SCHEMA.enqueue_batch(jsonb, jsonb, int[], jsonb);
CREATE FUNCTION :AWA_SCHEMA.enqueue_batch(p_headers jsonb, p_args jsonb, p_header_of int[], p_keys jsonb,
                                          OUT job_ids bigint[], OUT scheduled_headers int[],
                                          OUT conflict_key text, OUT conflict_holder bigint)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_n int := jsonb_array_length(p_args);
  -- outside READ COMMITTED every job goes to deferred (see the header of this migration)
  v_divert boolean := current_setting('transaction_isolation') <> 'read committed';
  v_lane record;
  v_slot int;
  v_generation bigint;
  v_pos bigint[];
  v_n_ready int;
  v_h record;
  v_keys int;
  v_inserted int;
BEGIN
  SELECT array_agg(e.o::int - 1 ORDER BY e.o) FILTER (WHERE v_divert OR x.run_at > v_now) INTO scheduled_headers
  FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o), jsonb_to_record(e.v) AS x(run_at timestamptz);

  FOR v_lane IN
    SELECT DISTINCT x.queue COLLATE "C" AS queue, x.priority
    FROM jsonb_to_recordset(p_headers) AS x(queue text, priority int, run_at timestamptz)
    WHERE NOT v_divert AND (x.run_at IS NULL OR x.run_at <= v_now)
    ORDER BY 1, 2
  LOOP
    -- = lane_key(queue, priority, 0), written with immutable operators so it is inlined
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'),
                                  hashtext(v_lane.queue || chr(31) || v_lane.priority::text || chr(31) || '0'));
    PERFORM 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = 0;
    IF NOT FOUND THEN
      INSERT INTO lanes (queue, priority, shard) VALUES (v_lane.queue, v_lane.priority, 0) ON CONFLICT DO NOTHING;
    END IF;
  END LOOP;

  SELECT array_agg(v ORDER BY v) INTO job_ids FROM (SELECT nextval('job_id_seq') AS v FROM generate_series(1, v_n)) s;

  IF p_keys IS NOT NULL THEN
    WITH ins AS (
      INSERT INTO unique_claims (unique_key, job_id)
      SELECT decode(k.v, 'hex'), job_ids[k.o] FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS k(v, o)
      WHERE k.v IS NOT NULL ORDER BY k.o
      ON CONFLICT (unique_key) DO NOTHING
      RETURNING 1
    )
    SELECT count(*) INTO v_inserted FROM ins;
    SELECT count(*) INTO v_keys FROM jsonb_array_elements_text(p_keys) AS k(v) WHERE k.v IS NOT NULL;
    IF v_inserted < v_keys THEN
      -- A key that was not inserted lost to an existing holder (or to an earlier row of this
      -- batch): the whole call is rejected. The holder is read before our own keys are removed.
      SELECT k.v, u.job_id INTO conflict_key, conflict_holder
      FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS k(v, o)
      LEFT JOIN unique_claims u ON u.unique_key = decode(k.v, 'hex')
      WHERE k.v IS NOT NULL AND u.job_id IS DISTINCT FROM job_ids[k.o]
      ORDER BY k.o LIMIT 1;
      DELETE FROM unique_claims u WHERE u.job_id = ANY (job_ids);
      job_ids := NULL;
      scheduled_headers := NULL;
      RETURN;
    END IF;
  END IF;

  IF scheduled_headers IS NULL THEN
    -- Every job is available now: positions in input order.
    -- After the lane locks: the slot is never older than the lane's previous rows.
    SELECT o_generation, o_slot INTO v_generation, v_slot FROM enqueue_ready_slot();
    SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, v_n)) s;
    IF p_header_of IS NULL AND jsonb_array_length(p_headers) = 1 THEN
      -- One header (an insertMany): its fields are constants of the insert, no join per row.
      SELECT x.kind, x.queue, x.priority, x.metadata, ARRAY(SELECT jsonb_array_elements_text(x.tags)) AS tags,
             x.max_attempts, coalesce(x.run_at, v_now) AS run_at, coalesce(x.unique_states, 0) AS unique_states
      INTO v_h FROM jsonb_to_record(p_headers -> 0) AS x(kind text, queue text, priority smallint, metadata jsonb,
                                                         tags jsonb, max_attempts int, run_at timestamptz,
                                                         unique_states int);
      INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                         errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT v_slot, v_generation, job_ids[a.o], v_h.kind, v_h.queue, v_h.priority, 0, v_pos[a.o], a.v,
             v_h.metadata, v_h.tags, '[]', 0, 0, v_h.max_attempts, v_h.run_at, v_now,
             CASE WHEN p_keys IS NOT NULL THEN decode(p_keys ->> (a.o::int - 1), 'hex') END, v_h.unique_states
      FROM jsonb_array_elements(p_args) WITH ORDINALITY AS a(v, o);
    ELSE
      INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                         errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT v_slot, v_generation, job_ids[a.o], h.kind, h.queue, h.priority, 0, v_pos[a.o], a.v,
             h.metadata, h.tags, '[]', 0, 0, h.max_attempts, h.run_at, v_now,
             CASE WHEN p_keys IS NOT NULL THEN decode(p_keys ->> (a.o::int - 1), 'hex') END, h.unique_states
      FROM jsonb_array_elements(p_args) WITH ORDINALITY AS a(v, o)
      JOIN (SELECT e.o::int - 1 AS i, x.kind, x.queue, x.priority, x.metadata,
                   ARRAY(SELECT jsonb_array_elements_text(x.tags)) AS tags, x.max_attempts,
                   coalesce(x.run_at, v_now) AS run_at, coalesce(x.unique_states, 0) AS unique_states
            FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o),
                 jsonb_to_record(e.v) AS x(kind text, queue text, priority smallint, metadata jsonb, tags jsonb,
                                           max_attempts int, run_at timestamptz, unique_states int)) h
        ON h.i = coalesce(p_header_of[a.o], 0);
    END IF;
  ELSE
    -- Some jobs are deferred: positions go to the available ones, in input order.
    SELECT count(*) INTO v_n_ready FROM generate_series(1, v_n) AS g(o)
    WHERE NOT (coalesce(p_header_of[g.o], 0) = ANY (scheduled_headers));
    IF v_n_ready > 0 THEN
      SELECT o_generation, o_slot INTO v_generation, v_slot FROM enqueue_ready_slot();
      SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, v_n_ready)) s;
    END IF;
    WITH h AS MATERIALIZED (
      SELECT e.o::int - 1 AS i, x.kind, x.queue, x.priority, x.metadata,
             ARRAY(SELECT jsonb_array_elements_text(x.tags)) AS tags, x.max_attempts,
             coalesce(x.run_at, v_now) AS run_at, coalesce(x.unique_states, 0) AS unique_states,
             NOT (e.o::int - 1 = ANY (scheduled_headers)) AS ready
      FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o),
           jsonb_to_record(e.v) AS x(kind text, queue text, priority smallint, metadata jsonb, tags jsonb,
                                     max_attempts int, run_at timestamptz, unique_states int)
    ),
    j AS MATERIALIZED (
      SELECT a.o, a.v AS args, h.kind, h.queue, h.priority, h.metadata, h.tags, h.max_attempts, h.run_at,
             h.unique_states, h.ready,
             CASE WHEN p_keys IS NOT NULL THEN decode(p_keys ->> (a.o::int - 1), 'hex') END AS k
      FROM jsonb_array_elements(p_args) WITH ORDINALITY AS a(v, o)
      JOIN h ON h.i = coalesce(p_header_of[a.o], 0)
    ),
    ranked AS (
      SELECT j.*, row_number() OVER (ORDER BY j.o) AS rank FROM j WHERE j.ready
    ),
    ins_ready AS (
      INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                         errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT v_slot, v_generation, job_ids[r.o], r.kind, r.queue, r.priority, 0, v_pos[r.rank], r.args,
             r.metadata, r.tags, '[]', 0, 0, r.max_attempts, r.run_at, v_now, r.k, r.unique_states
      FROM ranked r
    )
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT job_ids[j.o], 'scheduled', j.kind, j.queue, j.priority, 0, j.args, j.metadata, j.tags, '[]', 0, 0,
           j.max_attempts, j.run_at, v_now, j.k, j.unique_states
    FROM j WHERE NOT j.ready;
  END IF;

  -- Delivered on commit only; identical (channel, payload) pairs are folded by Postgres.
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q.queue)
  FROM (SELECT DISTINCT x.queue FROM jsonb_to_recordset(p_headers) AS x(queue text, run_at timestamptz)
        WHERE NOT v_divert AND (x.run_at IS NULL OR x.run_at <= v_now)) q;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- enqueue(rows jsonb) -> (ord, job_id, state)   (callers: cron, and older code in a rolling upgrade)
-- Input: a JSON array of {kind, queue, priority, args, metadata, tags, max_attempts, run_at?,
--        unique_key? (hex), unique_states}. All-or-nothing inside the caller's transaction.
-- Output: one row per input row, state 'available' or 'scheduled' (a future run_at; every row
--        outside READ COMMITTED). On a unique conflict, one row instead: the first losing row's
--        ord, job_id = the holder (NULL if not visible), state 'duplicate'; nothing stays written.
-- Locks: enqueue lock of every lane with rows available now, blocking, in sorted lane order;
--        held to commit, so positions commit in lane order.
-- Writes: unique_claims first; ready rows or deferred rows; NOTIFY.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.enqueue(p_rows jsonb)
RETURNS TABLE (ord int, job_id bigint, state text)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_n int := jsonb_array_length(p_rows);
  v_divert boolean := current_setting('transaction_isolation') <> 'read committed';
  v_lane record;
  v_slot int;
  v_generation bigint;
  v_ids bigint[];
  v_pos bigint[];
  v_n_ready int;
  v_keys int;
  v_inserted int;
BEGIN
  FOR v_lane IN
    -- byte order (C collation): the TypeScript side sorts multi-call batches the same way
    SELECT DISTINCT r.queue COLLATE "C" AS queue, r.priority
    FROM jsonb_to_recordset(p_rows) AS r(queue text, priority int, run_at timestamptz)
    WHERE NOT v_divert AND (r.run_at IS NULL OR r.run_at <= v_now)
    ORDER BY 1, 2
  LOOP
    -- = lane_key(queue, priority, 0), written with immutable operators so it is inlined
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'),
                                  hashtext(v_lane.queue || chr(31) || v_lane.priority::text || chr(31) || '0'));
    INSERT INTO lanes (queue, priority, shard)
    SELECT v_lane.queue, v_lane.priority, 0
    WHERE NOT EXISTS (SELECT 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = 0)
    ON CONFLICT DO NOTHING;
  END LOOP;

  SELECT array_agg(v ORDER BY v) INTO v_ids FROM (SELECT nextval('job_id_seq') AS v FROM generate_series(1, v_n)) s;

  -- Keys first: a batch that loses one writes nothing else (see enqueue_batch).
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_rows) AS e(v) WHERE e.v ->> 'unique_key' IS NOT NULL) THEN
    WITH ins AS (
      INSERT INTO unique_claims (unique_key, job_id)
      SELECT decode(e.v ->> 'unique_key', 'hex'), v_ids[e.o] FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS e(v, o)
      WHERE e.v ->> 'unique_key' IS NOT NULL ORDER BY e.o
      ON CONFLICT (unique_key) DO NOTHING
      RETURNING 1
    )
    SELECT count(*) INTO v_inserted FROM ins;
    SELECT count(*) INTO v_keys FROM jsonb_array_elements(p_rows) AS e(v) WHERE e.v ->> 'unique_key' IS NOT NULL;
    IF v_inserted < v_keys THEN
      RETURN QUERY
      SELECT e.o::int, u.job_id, 'duplicate'::text
      FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS e(v, o)
      LEFT JOIN unique_claims u ON u.unique_key = decode(e.v ->> 'unique_key', 'hex')
      WHERE e.v ->> 'unique_key' IS NOT NULL AND u.job_id IS DISTINCT FROM v_ids[e.o]
      ORDER BY e.o LIMIT 1;
      DELETE FROM unique_claims u WHERE u.job_id = ANY (v_ids);
      RETURN;
    END IF;
  END IF;

  SELECT count(*) INTO v_n_ready FROM jsonb_to_recordset(p_rows) AS r(run_at timestamptz)
  WHERE NOT v_divert AND (r.run_at IS NULL OR r.run_at <= v_now);
  IF v_n_ready > 0 THEN
    -- After the lane locks: the slot is never older than the lane's previous rows.
    SELECT o_generation, o_slot INTO v_generation, v_slot FROM enqueue_ready_slot();
    SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, v_n_ready)) s;
  END IF;

  RETURN QUERY
  WITH input AS (
    -- args from the element itself: JSON null stays JSON null (jsonb_to_record made it SQL NULL)
    SELECT x_e.o::int AS o, v_ids[x_e.o] AS id, x.kind, x.queue, x.priority, x_e.v -> 'args' AS args, x.metadata,
           ARRAY(SELECT jsonb_array_elements_text(x.tags)) AS tags, x.max_attempts,
           coalesce(x.run_at, v_now) AS run_at, NOT v_divert AND (x.run_at IS NULL OR x.run_at <= v_now) AS ready,
           decode(x.unique_key, 'hex') AS unique_key, coalesce(x.unique_states, 0) AS unique_states
    FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS x_e(v, o), jsonb_to_record(x_e.v) AS x(kind text, queue text, priority smallint,
         metadata jsonb, tags jsonb, max_attempts int, run_at timestamptz, unique_key text, unique_states int)
  ),
  ranked AS (
    SELECT i.*, row_number() OVER (ORDER BY i.o) AS rank FROM input i WHERE i.ready
  ),
  ins_ready AS (
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_slot, v_generation, r.id, r.kind, r.queue, r.priority, 0, v_pos[r.rank], r.args, r.metadata,
           r.tags, '[]', 0, 0, r.max_attempts, r.run_at, v_now, r.unique_key, r.unique_states
    FROM ranked r
  ),
  ins_deferred AS (
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT i.id, 'scheduled', i.kind, i.queue, i.priority, 0, i.args, i.metadata, i.tags, '[]', 0, 0,
           i.max_attempts, i.run_at, v_now, i.unique_key, i.unique_states
    FROM input i WHERE NOT i.ready
  )
  SELECT i.o, i.id, CASE WHEN i.ready THEN 'available' ELSE 'scheduled' END
  FROM input i
  ORDER BY i.o;

  -- Delivered on commit only; identical (channel, payload) pairs are folded by Postgres.
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q.queue)
  FROM (SELECT DISTINCT r.queue FROM jsonb_to_recordset(p_rows) AS r(queue text, run_at timestamptz)
        WHERE NOT v_divert AND (r.run_at IS NULL OR r.run_at <= v_now)) q;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- cron_fire(name, expected_last, tick, job jsonb) -> (outcome, job_id): as 0005, the duplicate
-- read from enqueue's state instead of caught as AWU01 (no sub-transaction, no server ERROR).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.cron_fire(p_name text, p_expected_last timestamptz, p_tick timestamptz, p_job jsonb)
RETURNS TABLE (outcome text, job_id bigint)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_schedule record;
  v_row jsonb;
  v_job_id bigint;
  v_state text;
BEGIN
  SELECT c.paused, c.last_fire_at INTO v_schedule FROM cron_schedules c WHERE c.name = p_name FOR UPDATE;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 'not_found'::text, NULL::bigint;
    RETURN;
  END IF;
  IF v_schedule.paused THEN
    RETURN QUERY SELECT 'paused'::text, NULL::bigint;
    RETURN;
  END IF;
  IF v_schedule.last_fire_at IS DISTINCT FROM p_expected_last OR p_tick <= v_schedule.last_fire_at THEN
    RETURN QUERY SELECT 'stale'::text, NULL::bigint;
    RETURN;
  END IF;
  IF p_tick > now() THEN
    RETURN QUERY SELECT 'not_due'::text, NULL::bigint;
    RETURN;
  END IF;
  v_row := jsonb_set(p_job, '{metadata}', coalesce(p_job -> 'metadata', '{}') || jsonb_build_object(
    'awa:cronName', p_name,
    'awa:cronFireTime', to_char(p_tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')));
  SELECT e.job_id, e.state INTO v_job_id, v_state FROM enqueue(jsonb_build_array(v_row)) e;
  IF v_state = 'duplicate' THEN
    -- the unique key is held (e.g. the previous fire's job still runs): the tick is consumed
    UPDATE cron_schedules c SET last_fire_at = p_tick, last_job_id = NULL WHERE c.name = p_name;
    RETURN QUERY SELECT 'deduplicated'::text, v_job_id;
    RETURN;
  END IF;
  UPDATE cron_schedules c SET last_fire_at = p_tick, last_job_id = v_job_id WHERE c.name = p_name;
  RETURN QUERY SELECT 'fired'::text, v_job_id;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- cron_trigger(name, job jsonb) -> (job_id, state); no row when the schedule does not exist.
-- A manual fire: ignores pause and does not move last_fire_at (the schedule keeps its ticks).
-- Locks: the schedule's row (FOR UPDATE), then those of enqueue.
-- Writes: the job through enqueue(jsonb) with awa:cronName, awa:cronFireTime (now) and
--         awa:cronTriggered = true; then last_triggered_at. On a unique conflict: state
--         'duplicate', job_id = the holder, and nothing written.
DROP FUNCTION :AWA_SCHEMA.cron_trigger(text, jsonb);
CREATE FUNCTION :AWA_SCHEMA.cron_trigger(p_name text, p_job jsonb)
RETURNS TABLE (job_id bigint, state text)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_job_id bigint;
  v_state text;
BEGIN
  PERFORM 1 FROM cron_schedules c WHERE c.name = p_name FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT e.job_id, e.state INTO v_job_id, v_state FROM enqueue(jsonb_build_array(jsonb_set(p_job, '{metadata}',
    coalesce(p_job -> 'metadata', '{}') || jsonb_build_object(
      'awa:cronName', p_name,
      'awa:cronFireTime', to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
      'awa:cronTriggered', true)))) e;
  IF v_state <> 'duplicate' THEN
    UPDATE cron_schedules c SET last_triggered_at = v_now WHERE c.name = p_name;
  END IF;
  RETURN QUERY SELECT v_job_id, v_state;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- JIT off for every other PL/pgSQL function of the schema (ALTER keeps their other SET clauses).
DO $$
DECLARE f record;
BEGIN
  FOR f IN
    SELECT p.oid::regprocedure AS sig FROM pg_proc p
    JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang
    WHERE n.nspname = ':AWA_SCHEMA' AND l.lanname = 'plpgsql'
      AND NOT coalesce('jit=off' = ANY (p.proconfig), false)
  LOOP
    EXECUTE format('ALTER FUNCTION %s SET jit = off', f.sig);
  END LOOP;
END
$$;

-- Least privilege: only the owner (and roles granted later) may call any function of ours.
DO $$
DECLARE f record;
BEGIN
  FOR f IN SELECT p.oid::regprocedure AS sig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ':AWA_SCHEMA' LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f.sig);
  END LOOP;
END
$$;
