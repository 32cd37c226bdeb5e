-- 0020: unique state masks on Postgres as in capabilities.md §4 and the simulation (ADR 0016;
-- issue 14 property 3; ADR 0004 "Not built yet"). A job holds its key exactly while its state is
-- in its mask:
--   enqueue_one, enqueue_batch, enqueue(jsonb)
--                take the key only when the initial state (available, or scheduled: a future run_at
--                or a job diverted outside READ COMMITTED) is in the mask (before: always).
--   claim        releases the key when the mask holds 'available' but not 'running'.
--   promote      releases it when the mask holds the deferred state but not 'available'; takes it
--                when the mask holds 'available' but not the deferred state, and a job that finds
--                the key held by a newer job is cancelled ('superseded by duplicate <id>').
--   finalize     (0019) takes the key when a job whose mask omits 'running' re-enters it, with the
--                same supersede rule.
-- Default masks hold scheduled, available, running and retryable: every new test above is false
-- for them, so the hot path does no extra key work (one filter over the claimed rows, one probe in
-- promote). Not built: taking the key at claim for a mask that holds 'running' but not
-- 'available' (ADR 0016).

-- enqueue_one, enqueue_batch, enqueue(jsonb): as in 0018 (key first, 'duplicate' answers, diversion
-- outside READ COMMITTED), with the mask condition on the key.
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
  -- only when the initial state is in the job's mask (capabilities.md §4)
  IF p_unique_key IS NOT NULL AND (coalesce(p_unique_states, 0) & CASE WHEN v_ready THEN 2 ELSE 1 END) <> 0 THEN
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

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.enqueue_batch(p_headers jsonb, p_args jsonb, p_header_of int[], p_keys jsonb,
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
      -- only a row whose initial state is in its mask takes its key (capabilities.md §4)
      WHERE k.v IS NOT NULL AND (coalesce((p_headers -> coalesce(p_header_of[k.o], 0) ->> 'unique_states')::int, 0)
                                   & CASE WHEN coalesce(p_header_of[k.o], 0) = ANY (coalesce(scheduled_headers, '{}')) THEN 1 ELSE 2 END) <> 0
      ORDER BY k.o
      ON CONFLICT (unique_key) DO NOTHING
      RETURNING 1
    )
    SELECT count(*) INTO v_inserted FROM ins;
    SELECT count(*) INTO v_keys FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS k(v, o)
    WHERE k.v IS NOT NULL AND (coalesce((p_headers -> coalesce(p_header_of[k.o], 0) ->> 'unique_states')::int, 0)
                                 & CASE WHEN coalesce(p_header_of[k.o], 0) = ANY (coalesce(scheduled_headers, '{}')) THEN 1 ELSE 2 END) <> 0;
    IF v_inserted < v_keys THEN
      -- A key that was not inserted lost to an existing holder (or to an earlier row of this
      -- batch): the whole call is rejected. The holder is read before our own keys are removed.
      SELECT k.v, u.job_id INTO conflict_key, conflict_holder
      FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS k(v, o)
      LEFT JOIN unique_claims u ON u.unique_key = decode(k.v, 'hex')
      WHERE k.v IS NOT NULL AND u.job_id IS DISTINCT FROM job_ids[k.o]
        AND (coalesce((p_headers -> coalesce(p_header_of[k.o], 0) ->> 'unique_states')::int, 0)
               & CASE WHEN coalesce(p_header_of[k.o], 0) = ANY (coalesce(scheduled_headers, '{}')) THEN 1 ELSE 2 END) <> 0
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
      -- only a row whose initial state is in its mask takes its key (capabilities.md §4)
      WHERE e.v ->> 'unique_key' IS NOT NULL AND (coalesce((e.v ->> 'unique_states')::int, 0)
                                                   & CASE WHEN NOT v_divert AND (e.v ->> 'run_at' IS NULL OR (e.v ->> 'run_at')::timestamptz <= v_now)
                                                          THEN 2 ELSE 1 END) <> 0
      ORDER BY e.o
      ON CONFLICT (unique_key) DO NOTHING
      RETURNING 1
    )
    SELECT count(*) INTO v_inserted FROM ins;
    SELECT count(*) INTO v_keys FROM jsonb_array_elements(p_rows) AS e(v)
    WHERE e.v ->> 'unique_key' IS NOT NULL AND (coalesce((e.v ->> 'unique_states')::int, 0)
                                                 & CASE WHEN NOT v_divert AND (e.v ->> 'run_at' IS NULL OR (e.v ->> 'run_at')::timestamptz <= v_now)
                                                        THEN 2 ELSE 1 END) <> 0;
    IF v_inserted < v_keys THEN
      RETURN QUERY
      SELECT e.o::int, u.job_id, 'duplicate'::text
      FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS e(v, o)
      LEFT JOIN unique_claims u ON u.unique_key = decode(e.v ->> 'unique_key', 'hex')
      WHERE e.v ->> 'unique_key' IS NOT NULL AND u.job_id IS DISTINCT FROM v_ids[e.o]
        AND (coalesce((e.v ->> 'unique_states')::int, 0)
               & CASE WHEN NOT v_divert AND (e.v ->> 'run_at' IS NULL OR (e.v ->> 'run_at')::timestamptz <= v_now)
                      THEN 2 ELSE 1 END) <> 0
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

-- claim: as in 0016 (with 0018's jit = off), releasing keys that leave the mask.
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

-- promote, as in 0003, with the mask transitions above.
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
-- Every representation of every job, most current first per job (storage-engine.md §5.9):
--   1 deferred row, 2 open claim (running), 3 unclaimed non-tombstoned ready row (available),
--   4 newest terminal or history row. Older rows are history; nothing is ever rewritten.

