-- 0051: wake-ups on demand (issue 17, docs/adr/0038-wake-ups-on-demand.md).
--
-- An insert's NOTIFY serialises commits across the whole cluster: at commit, Postgres holds one
-- lock (on database 0's notification queue) from before the commit record until after its flush,
-- so that notifications queue in commit order. Every notifying transaction of every database
-- waits for the previous one's WAL flush: no group commit. pgbench on Debian's PostgreSQL 15
-- (stock, this VM): eight clients calling enqueue_one on eight queues ran 3,070-3,790
-- transactions/s, 4,990-5,530 without the NOTIFY. A wake-up is needed only by a worker that waits
-- for one; a worker that claims from a backlog finds the job without it.
--
-- The protocol. A dispatcher that is about to wait for wake-ups of queue q holds the session
-- lock (lock_ns('waiters'), waiter_bucket(q)) SHARED on its process's signals connection (the
-- one that LISTENs), then claims once more, then waits. One that claims from a backlog (its claims
-- come back full) releases it. An insert into q (enqueue_one, enqueue_batch) tries the same key
-- EXCLUSIVE for its transaction (never waits):
-- - taken: no dispatcher holds the bucket, so none waits for q's wake-ups; no NOTIFY. The lock
--   stays ours to commit, so a dispatcher that starts to wait meanwhile cannot take it until our
--   insert is committed (it tries, is told the bucket is busy, and claims again shortly), and its
--   claim after taking it sees our job.
-- - not taken: a dispatcher waits (or another insert holds it): NOTIFY, as before.
-- A bucket is hashtext(queue) & 63: a process holds at most 64 such locks, whatever its number of
-- queues (one per queue would put a thousand idle queues in the shared lock table); two queues
-- that share a bucket at most send a wake-up that was not needed.
--
-- Workers of earlier builds never hold the lock, so an insert of this build would not wake them
-- while no current worker waits on their queue: they would find its jobs at their idle poll
-- (up to idlePollMax x 1.2). So the protocol is a setting, wake_on_demand(): on for a new
-- install (every migration applied in this transaction), off for an upgraded one until an
-- operator turns it on once every worker runs this build (set_wake_on_demand). Off, inserts
-- notify as before (the test folds to a constant: no lock is tried); workers of this build hold
-- their locks either way.
--
-- Functions (lines marked 0051): waiter_bucket, wake_on_demand, set_wake_on_demand (new);
-- enqueue_one, enqueue_batch (0042's text).
--
-- Locks, guards and writes: an insert that notifies nothing holds one more advisory lock to its
-- commit (EXCLUSIVE, tried, never waited for; a registered waiter only tries it SHARED, so nobody
-- waits on it). Nothing else changes: the lane lock, the rows written, the NOTIFY when one is
-- sent.

-- 0051: the waiter bucket of a queue (the inserts and the workers' signals connections agree on it).
CREATE FUNCTION :AWA_SCHEMA.waiter_bucket(p_queue text) RETURNS integer
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT hashtext(p_queue) & 63 $$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.waiter_bucket(text) FROM PUBLIC;

-- 0051: whether inserts may skip their wake-up. A constant (IMMUTABLE, inlined and folded when
-- enqueue_one and enqueue_batch plan the test), not a settings row: a row read costs a statement
-- inside the lane lock's hold, measured at -25 % for eight producers on one queue. Changed only by
-- set_wake_on_demand, which replaces the function; that invalidates every cached plan that
-- folded it, in every session, so the next insert plans with the new value.
CREATE FUNCTION :AWA_SCHEMA.wake_on_demand() RETURNS boolean
  LANGUAGE sql IMMUTABLE PARALLEL SAFE
  AS $$ SELECT false $$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.wake_on_demand() FROM PUBLIC;

-- 0051: turns wake-ups on demand on or off (QueueStorage.setWakeOnDemand, awa wake-on-demand).
-- Writes: replaces wake_on_demand (its owner: the schema's owner). Locks: an advisory lock of its
-- own for the transaction, so that two operators do not replace it at once.
CREATE FUNCTION :AWA_SCHEMA.set_wake_on_demand(p_on boolean) RETURNS void
  LANGUAGE plpgsql
  SET search_path TO ':AWA_SCHEMA', 'pg_catalog'
  SET jit TO 'off'
AS $function$
BEGIN
  PERFORM pg_advisory_xact_lock(lock_ns('wake_on_demand'), 0);
  EXECUTE format('CREATE OR REPLACE FUNCTION %I.wake_on_demand() RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
                 ':AWA_SCHEMA', 'SELECT ' || CASE WHEN p_on THEN 'true' ELSE 'false' END);
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.set_wake_on_demand(boolean) FROM PUBLIC;

-- 0051: a new install (every recorded migration applied in this transaction) starts with it on.
SELECT :AWA_SCHEMA.set_wake_on_demand(true)
WHERE NOT EXISTS (SELECT 1 FROM :AWA_SCHEMA.schema_version v WHERE v.applied_at < now());

-- :AWA_SCHEMA.enqueue_one: 0042's text, lines marked 0051.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.enqueue_one(p_kind text, p_queue text, p_priority integer, p_args jsonb, p_metadata jsonb, p_tags jsonb, p_max_attempts integer, p_run_at timestamp with time zone, p_unique_key bytea, p_unique_states integer, OUT job_id bigint, OUT state text)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET jit = off
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_id bigint := nextval('job_id_seq');
  v_tags text[];
  v_generation bigint;
  v_slot int;
  v_ready boolean := (p_run_at IS NULL OR p_run_at <= v_now)
                     AND current_setting('transaction_isolation') = 'read committed';
  v_width int; -- 0042: the queue's enqueueShards
  v_shard smallint := 0; -- 0042
  v_key text; -- 0042: the ordering key, else the concurrency key
BEGIN
  -- 0042: the shard (capabilities.md §22). Width 1 (no queue_meta row, or the default): shard 0,
  -- as before. Otherwise the ordering key's digest (else the concurrency key's) modulo the width,
  -- so a key's jobs share a lane; else the rotor's next draw.
  SELECT m.enqueue_shards INTO v_width FROM queue_meta m WHERE m.queue = p_queue; -- 0042
  IF v_width > 1 THEN -- 0042
    v_key := coalesce(p_metadata ->> 'awa:orderingKey', p_metadata ->> 'awa:concurrencyKey'); -- 0042
    v_shard := CASE WHEN v_key IS NOT NULL -- 0042
                    THEN (hashtextextended('shard' || chr(31) || v_key, 0) & 9223372036854775807) % v_width -- 0042
                    ELSE shard_draw() % v_width END; -- 0042
  END IF; -- 0042
  IF p_tags IS NULL OR jsonb_array_length(p_tags) = 0 THEN
    v_tags := '{}';
  ELSE
    v_tags := ARRAY(SELECT jsonb_array_elements_text(p_tags));
  END IF;
  IF v_ready THEN
    -- = lane_key(p_queue, p_priority, v_shard), written with immutable operators so it is inlined
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'),
                                  hashtext(p_queue || chr(31) || p_priority::text || chr(31) || v_shard::text)); -- 0042
    PERFORM 1 FROM lanes l WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = v_shard; -- 0042
    IF NOT FOUND THEN
      INSERT INTO lanes (queue, priority, shard) VALUES (p_queue, p_priority, v_shard) ON CONFLICT DO NOTHING; -- 0042
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
    VALUES (v_slot, v_generation, v_id, p_kind, p_queue, p_priority, v_shard, nextval('lane_seq'), p_args, -- 0042
            p_metadata, v_tags, '[]', 0, 0, p_max_attempts, coalesce(p_run_at, v_now), v_now, p_unique_key,
            coalesce(p_unique_states, 0));
    state := 'available';
    -- Delivered on commit only. 0051: unless no worker waits for this queue's wake-ups (see the
    -- header): then the try holds the queue's waiter bucket to commit instead.
    IF NOT (wake_on_demand() AND pg_try_advisory_xact_lock(lock_ns('waiters'), waiter_bucket(p_queue))) THEN -- 0051
      PERFORM pg_notify('awa_wake_:AWA_SCHEMA', p_queue);
    END IF; -- 0051
  ELSE
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    VALUES (v_id, 'scheduled', p_kind, p_queue, p_priority, v_shard, p_args, p_metadata, v_tags, '[]', 0, 0, -- 0042
            p_max_attempts, coalesce(p_run_at, v_now), v_now, p_unique_key, coalesce(p_unique_states, 0));
    state := 'scheduled';
  END IF;
  job_id := v_id;
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.enqueue_one(text, text, int, jsonb, jsonb, jsonb, int, timestamptz, bytea, int) FROM PUBLIC;

-- :AWA_SCHEMA.enqueue_batch: 0042's text, lines marked 0051.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.enqueue_batch(p_headers jsonb, p_args jsonb, p_header_of integer[], p_keys jsonb, OUT job_ids bigint[], OUT scheduled_headers integer[], OUT conflict_key text, OUT conflict_holder bigint)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET jit = off
AS $function$
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
  v_shards smallint[]; -- 0042: each header's shard, by header index + 1
BEGIN
  SELECT array_agg(e.o::int - 1 ORDER BY e.o) FILTER (WHERE v_divert OR x.run_at > v_now) INTO scheduled_headers
  FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o), jsonb_to_record(e.v) AS x(run_at timestamptz);

  -- 0042: each header's shard (capabilities.md §22). A queue of width 1 (no queue_meta row, or the
  -- default): shard 0, as before. Otherwise the header's ordering key's digest (else its
  -- concurrency key's) modulo the width; else the transaction's rotor draw (shard_draw) modulo
  -- the width: a batch without keys stays in one lane (per-row fan-out costs more than it
  -- spreads), and so do all chunks of one insertMany.
  WITH h AS MATERIALIZED (
    SELECT e.o, x.queue, x.priority,
           coalesce(x.metadata ->> 'awa:orderingKey', x.metadata ->> 'awa:concurrencyKey') AS k,
           coalesce((SELECT m.enqueue_shards FROM queue_meta m WHERE m.queue = x.queue), 1) AS w
    FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o),
         jsonb_to_record(e.v) AS x(queue text, priority int, metadata jsonb)
  )
  SELECT array_agg((CASE WHEN h.w <= 1 THEN 0
                        WHEN h.k IS NOT NULL
                        THEN (hashtextextended('shard' || chr(31) || h.k, 0) & 9223372036854775807) % h.w
                        ELSE shard_draw() % h.w END)::smallint
                   ORDER BY h.o)
  INTO v_shards FROM h;

  FOR v_lane IN
    SELECT DISTINCT x.queue COLLATE "C" AS queue, x.priority, v_shards[e.o] AS shard -- 0042
    FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o), -- 0042
         jsonb_to_record(e.v) AS x(queue text, priority int, run_at timestamptz) -- 0042
    WHERE NOT v_divert AND (x.run_at IS NULL OR x.run_at <= v_now)
    ORDER BY 1, 2, 3 -- 0042
  LOOP
    -- = lane_key(queue, priority, shard), written with immutable operators so it is inlined
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'),
                                  hashtext(v_lane.queue || chr(31) || v_lane.priority::text || chr(31) || v_lane.shard::text)); -- 0042
    PERFORM 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = v_lane.shard; -- 0042
    IF NOT FOUND THEN
      INSERT INTO lanes (queue, priority, shard) VALUES (v_lane.queue, v_lane.priority, v_lane.shard) ON CONFLICT DO NOTHING; -- 0042
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
      SELECT v_slot, v_generation, job_ids[a.o], v_h.kind, v_h.queue, v_h.priority, v_shards[1], v_pos[a.o], a.v, -- 0042
             v_h.metadata, v_h.tags, '[]', 0, 0, v_h.max_attempts, v_h.run_at, v_now,
             CASE WHEN p_keys IS NOT NULL THEN decode(p_keys ->> (a.o::int - 1), 'hex') END, v_h.unique_states
      FROM jsonb_array_elements(p_args) WITH ORDINALITY AS a(v, o);
    ELSE
      INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                         errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT v_slot, v_generation, job_ids[a.o], h.kind, h.queue, h.priority, v_shards[h.i + 1], v_pos[a.o], a.v, -- 0042
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
      SELECT a.o, a.v AS args, h.i, h.kind, h.queue, h.priority, h.metadata, h.tags, h.max_attempts, h.run_at, -- 0042: h.i
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
      SELECT v_slot, v_generation, job_ids[r.o], r.kind, r.queue, r.priority, v_shards[r.i + 1], v_pos[r.rank], r.args, -- 0042
             r.metadata, r.tags, '[]', 0, 0, r.max_attempts, r.run_at, v_now, r.k, r.unique_states
      FROM ranked r
    )
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT job_ids[j.o], 'scheduled', j.kind, j.queue, j.priority, v_shards[j.i + 1], j.args, j.metadata, j.tags, '[]', 0, 0, -- 0042
           j.max_attempts, j.run_at, v_now, j.k, j.unique_states
    FROM j WHERE NOT j.ready;
  END IF;

  -- Delivered on commit only; identical (channel, payload) pairs are folded by Postgres.
  -- 0051: unless no worker waits for the queue's wake-ups (see the header).
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q.queue)
  FROM (SELECT DISTINCT x.queue FROM jsonb_to_recordset(p_headers) AS x(queue text, run_at timestamptz)
        WHERE NOT v_divert AND (x.run_at IS NULL OR x.run_at <= v_now)) q
  WHERE NOT (wake_on_demand() AND pg_try_advisory_xact_lock(lock_ns('waiters'), waiter_bucket(q.queue))); -- 0051
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.enqueue_batch(jsonb, jsonb, int[], jsonb) FROM PUBLIC;
