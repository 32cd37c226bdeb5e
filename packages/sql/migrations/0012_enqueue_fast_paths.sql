-- 0012: enqueue fast paths (issue #5; docs/benchmarks.md "Where Awa stands against the goals").
--
-- enqueue(jsonb) of 0003 spends most of its server time outside the row inserts: for one row,
-- ~0.34 ms in 15 statements, among them `lane_key` re-planned on every call (an IMMUTABLE SQL
-- function whose body uses the STABLE `text || int`, so it is never inlined, ~28 µs of planning),
-- `lock_current_slot` with a dynamic `EXECUTE format('LOCK TABLE …')` parsed on every call, and
-- three passes of `jsonb_to_recordset` over the input. For a batch, every row carries (and the
-- server parses, field by field) kind, queue, priority, metadata, tags and options that are the
-- same for every row of an `insertMany`.
--
-- Two new entry points with enqueue(jsonb)'s semantics, locks and writes; enqueue(jsonb) stays for
-- cron and for callers of the older wire format, re-created at the end with the same savings:
--   enqueue_one(...)            one job, typed parameters, straight-line PL/pgSQL;
--   enqueue_batch(headers, args, header_of, keys)
--                               rows that share a header (kind, queue, priority, metadata, tags,
--                               max_attempts, run_at, unique_states) send it once; per row only
--                               its args, its header index and its unique key.
-- Both take the same enqueue lock per lane (blocking, sorted lane order), held to commit, so the
-- FIFO argument of storage-engine.md §6 is untouched; they compute the lock key inline with an
-- expression equal to lane_key(queue, priority, 0) (checked by a test), and lock the current
-- `ready` child with a static LOCK TABLE (enqueue_ready_slot).

-- The queue ring's current incarnation with ROW EXCLUSIVE on its `ready` child: lock_current_slot
-- ('ready') without dynamic SQL (plan cached per session). Same protocol: lock, then re-read the
-- ledger in a new statement and move on if a prune of that incarnation committed first.
CREATE FUNCTION :AWA_SCHEMA.enqueue_ready_slot(OUT o_generation bigint, OUT o_slot int)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
BEGIN
  LOOP
    SELECT r.generation, r.slot INTO o_generation, o_slot FROM ring_rotations r
    WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
    CASE o_slot
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
      ELSE EXECUTE format('LOCK TABLE %I.%I IN ROW EXCLUSIVE MODE', ':AWA_SCHEMA', 'ready_' || o_slot);
    END CASE;
    EXIT WHEN NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = o_generation);
  END LOOP;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- enqueue_one(kind, queue, priority, args, metadata, tags, max_attempts, run_at, unique_key,
--             unique_states) -> (job_id, state)
-- One job, as enqueue(jsonb) with a one-row array. tags: a JSON array of strings or NULL (none).
-- Locks: the lane's enqueue lock (blocking) when the job is available now; held to commit, so
--        positions commit in lane order. None for a future run_at (deferred).
-- Writes: a ready row (available now) or a deferred row; unique_claims; NOTIFY (on commit).
-- Errors: SQLSTATE AWU01 (unique conflict; DETAIL = key hex, HINT = holder job id).
CREATE FUNCTION :AWA_SCHEMA.enqueue_one(p_kind text, p_queue text, p_priority int, p_args jsonb,
                                        p_metadata jsonb, p_tags jsonb, p_max_attempts int,
                                        p_run_at timestamptz, p_unique_key bytea, p_unique_states int,
                                        OUT job_id bigint, OUT state text)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_id bigint := nextval('job_id_seq');
  v_tags text[];
  v_generation bigint;
  v_slot int;
  v_holder bigint;
BEGIN
  IF p_tags IS NULL OR jsonb_array_length(p_tags) = 0 THEN
    v_tags := '{}';
  ELSE
    v_tags := ARRAY(SELECT jsonb_array_elements_text(p_tags));
  END IF;
  IF p_run_at IS NULL OR p_run_at <= v_now THEN
    -- = lane_key(p_queue, p_priority, 0), written with immutable operators so it is inlined
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'),
                                  hashtext(p_queue || chr(31) || p_priority::text || chr(31) || '0'));
    PERFORM 1 FROM lanes l WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = 0;
    IF NOT FOUND THEN
      INSERT INTO lanes (queue, priority, shard) VALUES (p_queue, p_priority, 0) ON CONFLICT DO NOTHING;
    END IF;
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
  ELSE
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    VALUES (v_id, 'scheduled', p_kind, p_queue, p_priority, 0, p_args, p_metadata, v_tags, '[]', 0, 0,
            p_max_attempts, p_run_at, v_now, p_unique_key, coalesce(p_unique_states, 0));
    state := 'scheduled';
  END IF;
  IF p_unique_key IS NOT NULL THEN
    INSERT INTO unique_claims (unique_key, job_id) VALUES (p_unique_key, v_id) ON CONFLICT (unique_key) DO NOTHING;
    IF NOT FOUND THEN
      SELECT u.job_id INTO v_holder FROM unique_claims u WHERE u.unique_key = p_unique_key;
      RAISE EXCEPTION 'unique key % is held by job %', encode(p_unique_key, 'hex'), v_holder
        USING ERRCODE = 'AWU01', DETAIL = encode(p_unique_key, 'hex'), HINT = v_holder::text;
    END IF;
  END IF;
  IF state = 'available' THEN
    -- Delivered on commit only.
    PERFORM pg_notify('awa_wake_:AWA_SCHEMA', p_queue);
  END IF;
  job_id := v_id;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- enqueue_batch(headers, args, header_of, keys) -> (job_ids, scheduled_headers)
-- Input: headers, a JSON array of {kind, queue, priority, metadata, tags, max_attempts, run_at?,
--        unique_states}; args, a JSON array with one element per job (the job's args);
--        header_of, the header index (0-based) of each job, or NULL when every job uses header 0;
--        keys, a JSON array with each job's unique key (hex) or null, or NULL when none has one.
--        Rows sharing a lane must be in FIFO order in `args`. All-or-nothing inside the caller's
--        transaction.
-- Output: job ids in input order; the indexes of the headers whose jobs were deferred (future
--        run_at by the database clock), NULL when none was.
-- Locks: enqueue lock of every lane with jobs available now, blocking, in sorted lane order
--        (queue in C collation, then priority: the TypeScript side sorts multi-call batches the
--        same way); held to commit, so positions commit in lane order.
-- Writes: ready rows (available now) or deferred rows (future run_at); unique_claims; NOTIFY.
-- Errors: SQLSTATE AWU01 (unique conflict, also between two rows of the batch; DETAIL = key hex,
--         HINT = holder job id).
CREATE FUNCTION :AWA_SCHEMA.enqueue_batch(p_headers jsonb, p_args jsonb, p_header_of int[], p_keys jsonb,
                                          OUT job_ids bigint[], OUT scheduled_headers int[])
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_n int := jsonb_array_length(p_args);
  v_lane record;
  v_slot int;
  v_generation bigint;
  v_pos bigint[];
  v_n_ready int;
  v_h record;
  v_conflict record;
BEGIN
  SELECT array_agg(e.o::int - 1 ORDER BY e.o) FILTER (WHERE x.run_at > v_now) INTO scheduled_headers
  FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o), jsonb_to_record(e.v) AS x(run_at timestamptz);

  FOR v_lane IN
    SELECT DISTINCT x.queue COLLATE "C" AS queue, x.priority
    FROM jsonb_to_recordset(p_headers) AS x(queue text, priority int, run_at timestamptz)
    WHERE x.run_at IS NULL OR x.run_at <= v_now
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

  IF p_keys IS NOT NULL THEN
    INSERT INTO unique_claims (unique_key, job_id)
    SELECT decode(k.v, 'hex'), job_ids[k.o] FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS k(v, o)
    WHERE k.v IS NOT NULL ORDER BY k.o
    ON CONFLICT (unique_key) DO NOTHING;
    -- A key that was not inserted lost to an existing holder (or to an earlier row of this
    -- batch): reject the whole call.
    SELECT encode(u.unique_key, 'hex') AS key, u.job_id AS holder INTO v_conflict
    FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS k(v, o)
    JOIN unique_claims u ON u.unique_key = decode(k.v, 'hex')
    WHERE k.v IS NOT NULL AND u.job_id <> job_ids[k.o]
    LIMIT 1;
    IF FOUND THEN
      RAISE EXCEPTION 'unique key % is held by job %', v_conflict.key, v_conflict.holder
        USING ERRCODE = 'AWU01', DETAIL = v_conflict.key, HINT = v_conflict.holder::text;
    END IF;
  END IF;

  -- Delivered on commit only; identical (channel, payload) pairs are folded by Postgres.
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q.queue)
  FROM (SELECT DISTINCT x.queue FROM jsonb_to_recordset(p_headers) AS x(queue text, run_at timestamptz)
        WHERE x.run_at IS NULL OR x.run_at <= v_now) q;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- enqueue(jsonb), 0003's body with four changes (callers: cron, and code of the previous version
-- during a rolling upgrade): the lane-lock key inline (the same key, without re-planning
-- lane_key() on every call), the slot lock through enqueue_ready_slot() (no dynamic SQL), args
-- that are JSON null stored as JSON null (they became SQL NULL and violated NOT NULL), and no
-- unique-conflict query when no row has a key.
-- enqueue(rows jsonb) -> (ord, job_id, state)
-- Input: a JSON array of {kind, queue, priority, args, metadata, tags, max_attempts, run_at?,
--        unique_key? (hex), unique_states}. All-or-nothing inside the caller's transaction.
-- Locks: enqueue lock of every touched lane, blocking, in sorted lane order (no deadlock between
--        multi-lane producers); held to commit, so positions commit in lane order.
-- Writes: ready rows (available now) or deferred rows (future run_at); unique_claims; NOTIFY.
-- Errors: SQLSTATE AWU01 (unique conflict; DETAIL = key hex, HINT = holder job id).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.enqueue(p_rows jsonb)
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
    -- = lane_key(queue, priority, 0), written with immutable operators so it is inlined
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'),
                                  hashtext(v_lane.queue || chr(31) || v_lane.priority::text || chr(31) || '0'));
    INSERT INTO lanes (queue, priority, shard)
    SELECT v_lane.queue, v_lane.priority, 0
    WHERE NOT EXISTS (SELECT 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = 0)
    ON CONFLICT DO NOTHING;
  END LOOP;

  -- After the lane locks: the slot is never older than the lane's previous rows.
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM enqueue_ready_slot();
  SELECT array_agg(v ORDER BY v) INTO v_ids FROM (SELECT nextval('job_id_seq') AS v FROM generate_series(1, v_n)) s;
  SELECT count(*) INTO v_n_ready FROM jsonb_to_recordset(p_rows) AS r(run_at timestamptz)
  WHERE r.run_at IS NULL OR r.run_at <= v_now;
  SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, v_n_ready)) s;

  RETURN QUERY
  WITH input AS (
    -- args from the element itself: JSON null stays JSON null (jsonb_to_record made it SQL NULL)
    SELECT x_e.o::int AS o, v_ids[x_e.o] AS id, x.kind, x.queue, x.priority, x_e.v -> 'args' AS args, x.metadata,
           ARRAY(SELECT jsonb_array_elements_text(x.tags)) AS tags, x.max_attempts,
           coalesce(x.run_at, v_now) AS run_at, (x.run_at IS NULL OR x.run_at <= v_now) AS ready,
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
  -- this batch): reject the whole call. (No key in the batch: nothing to look for.)
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_rows) AS e(v) WHERE e.v ->> 'unique_key' IS NOT NULL) THEN
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
  END IF;

  -- Delivered on commit only; identical (channel, payload) pairs are folded by Postgres.
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q.queue)
  FROM (SELECT DISTINCT r.queue FROM jsonb_to_recordset(p_rows) AS r(queue text, run_at timestamptz)
        WHERE r.run_at IS NULL OR r.run_at <= v_now) q;
END
$$;
