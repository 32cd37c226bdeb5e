-- 0042: sharded enqueue heads (capabilities.md §22; issue 17, ADR 0034).
--
-- A queue's `enqueue_shards` (queue_meta, 1–64, default 1; written by QueueStorage.configureQueue) spreads its jobs of one priority over
-- that many lanes (queue, priority, shard). Producers of one lane serialise on its enqueue lock
-- (held to commit, so positions commit in lane order), and claimers of one lane on its claim lock
-- (held to commit, so the next claimer sees the cursor): with shards, concurrent producers and
-- claimers of one hot queue mostly take different lanes. Strict FIFO per queue and priority
-- becomes FIFO per shard; a key's jobs keep theirs.
--
-- The shard of an insert: width 1 (the default, or no queue_meta row): 0, as before. Otherwise
-- the ordering key's digest (metadata 'awa:orderingKey', else the concurrency key 'awa:concurrencyKey')
-- modulo the width, domain 'shard'; else the transaction's draw of the sequence shard_rotor
-- (shard_draw: one per transaction) modulo the width. The shard is stored on the row and
-- kept through retries (finalize and rescue copy it to deferred; promote now puts a deferred row
-- back in its own lane). Rows re-entered by an operator (retry_job, the DLQ retries) take their
-- shard by the same rule (shard_for) in the queue they re-enter, so a key's job joins its key's
-- lane; the DLQ keeps no shard (a keyless entry takes the transaction's draw). Cron's inserts
-- (enqueue) go to shard 0, as before: a lane every queue has.
--
-- One draw per transaction rather than per call: the chunks of one large insertMany (5,000 rows
-- each, one transaction) then share one lane per (queue, priority), and their lane locks keep the
-- one global order that keeps two multi-chunk producers from deadlocking (PgQueueStorage sorts
-- rows by lane across chunks). Rows with ordering keys can span shards: a transaction that
-- inserts into several lanes takes their enqueue locks in the order of its inserts, and two such
-- transactions inserting in opposite orders can deadlock, as with two queues today (Postgres
-- aborts one; nothing is written by it).
--
-- Lowering the width is safe: claims probe every lane of the queue (the lanes table), so the old
-- shards drain. Raising it takes effect for the next insert.
--
-- Functions (0020's, 0027's and 0029's text, lines marked 0042):
-- - enqueue_one, enqueue_batch: choose the shard; lock, create and fill that lane.
-- - promote: lanes are (queue, priority, shard); it locked and created only shard 0's lane, while
--   it inserted each row with its own shard (every shard was 0 until now).
-- - claim: its ranking of several lanes reads the cursors in its own statement instead of calling
--   lane_cursor once per lane, and its head probes open only the live slots' children, as the
--   pick does (together: an 8-lane claim from a third to ~80 % of a one-lane claim's rate,
--   pgbench, one client). And a busy lane followed in the claim order by lanes of the same priority goes behind them
--   once instead of being waited for (0025's wait of up to 100 ms is for priority inversion,
--   which shards of one priority cannot cause). Met again, it is waited for as before.
--
-- - retry_from_dlq, dlq_retry_batch, retry_job: the shard of shard_for (new) instead of 0.
-- - claim_keyed: its ranking as claim's (cursors in its own statement, heads in the live slots).
--   It already skipped a busy lane without waiting.
--
-- Locks, guards and writes: as before, per lane. A lane's enqueue lock is still held to commit
-- by every insert into it, and its claim lock by every claim of it; a call that touches several
-- lanes takes their enqueue locks in (queue, priority, shard) order (enqueue_batch) or tries them
-- (promote). claim_keyed already skips a busy lane without waiting.

ALTER TABLE :AWA_SCHEMA.queue_meta
  ADD COLUMN enqueue_shards smallint NOT NULL DEFAULT 1 CHECK (enqueue_shards BETWEEN 1 AND 64);

-- Draws for inserts without a key (shard_draw): concurrent producers take consecutive values, so
-- different shards. Not transactional, never reset; only its value modulo the width matters.
CREATE SEQUENCE :AWA_SCHEMA.shard_rotor AS bigint;

-- The transaction's rotor draw: the first call of a transaction takes shard_rotor's next value,
-- later calls of the same transaction return it again (a transaction-local setting; coalesce
-- evaluates set_config only when there is none). SQL without SET clauses, so the planner inlines
-- it into the calling statement: a plpgsql function with SET clauses cost single inserts into a
-- sharded queue ~7 % (pgbench, one client).
CREATE FUNCTION :AWA_SCHEMA.shard_draw()
  RETURNS bigint
  LANGUAGE sql
AS $function$
  SELECT coalesce(nullif(pg_catalog.current_setting('awa.shard_draw', true), '')::bigint,
                  pg_catalog.set_config('awa.shard_draw', pg_catalog.nextval(':AWA_SCHEMA.shard_rotor')::text, true)::bigint)
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.shard_draw() FROM PUBLIC;

-- :AWA_SCHEMA.enqueue_one: 0020's text (as installed), lines marked 0042.
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
    -- Delivered on commit only.
    PERFORM pg_notify('awa_wake_:AWA_SCHEMA', p_queue);
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

-- :AWA_SCHEMA.enqueue_batch: 0020's text (as installed), lines marked 0042.
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
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q.queue)
  FROM (SELECT DISTINCT x.queue FROM jsonb_to_recordset(p_headers) AS x(queue text, run_at timestamptz)
        WHERE NOT v_divert AND (x.run_at IS NULL OR x.run_at <= v_now)) q;
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.enqueue_batch(jsonb, jsonb, int[], jsonb) FROM PUBLIC;

-- :AWA_SCHEMA.promote: 0027's text (as installed), lines marked 0042.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.promote(p_limit integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET jit = off
AS $function$
#variable_conflict use_column
DECLARE
  v_lane record;
  v_q text[] := '{}';
  v_p int[] := '{}';
  v_s int[] := '{}'; -- 0042: the lanes' shards
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
  v_busy_s int[] := '{}'; -- 0042
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'promote needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  -- Lanes of the first p_limit due rows, enqueue locks tried. When every one of them is busy (a
  -- producer holds the lane in an open transaction), look further, past those lanes, instead of
  -- promoting nothing while other lanes' rows are due (review m5). Tried locks never wait, so the
  -- order across rounds does not matter.
  FOR v_round IN 1 .. 8 LOOP
    v_found := false;
    FOR v_lane IN
      SELECT DISTINCT d.queue COLLATE "C" AS queue, d.priority, d.shard -- 0042
      FROM (SELECT d.queue, d.priority, d.shard FROM deferred d -- 0042
            WHERE d.state IN ('scheduled', 'retryable') AND d.run_at <= now()
              AND (d.queue, d.priority, d.shard) NOT IN (SELECT * FROM unnest(v_busy_q, v_busy_p, v_busy_s)) -- 0042
            ORDER BY d.run_at, d.job_id LIMIT p_limit) d
      ORDER BY 1, 2, 3 -- 0042
    LOOP
      v_found := true;
      -- 0042: the row's own lane (its shard was chosen at insert and is kept through retries)
      IF pg_try_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_lane.queue, v_lane.priority, v_lane.shard)) THEN -- 0042
        v_q := v_q || v_lane.queue;
        v_p := v_p || v_lane.priority::int;
        v_s := v_s || v_lane.shard::int; -- 0042
        INSERT INTO lanes (queue, priority, shard)
        SELECT v_lane.queue, v_lane.priority, v_lane.shard -- 0042
        WHERE NOT EXISTS (SELECT 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = v_lane.shard) -- 0042
        ON CONFLICT DO NOTHING;
      ELSE
        v_busy_q := v_busy_q || v_lane.queue;
        v_busy_p := v_busy_p || v_lane.priority::int;
        v_busy_s := v_busy_s || v_lane.shard::int; -- 0042
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
      AND (d.queue, d.priority, d.shard) IN (SELECT * FROM unnest(v_q, v_p, v_s)) -- 0042
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
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.promote(int) FROM PUBLIC;

-- :AWA_SCHEMA.claim: 0029's text (as installed), lines marked 0042.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.claim(p_queue text, p_max integer, p_deadline_ms bigint, p_aging_ms bigint)
 RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, deadline_at timestamp with time zone, progress jsonb)
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET plan_cache_mode = force_generic_plan
 SET enable_seqscan = off
 SET jit = off
 SET enable_bitmapscan = off
 SET enable_hashjoin = off
 SET enable_mergejoin = off
 SET enable_material = off
AS $function$
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
  v_may_wait boolean := true; -- 0025: one wait (100 ms at most) per call for a lane another claimer holds
  v_locked boolean; -- 0025: this lane's claim lock is ours
  v_saved_timeout text := current_setting('lock_timeout');
  -- the queue ring's slots that can hold rows (queue_slot_ranges), read once per call
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
  v_got int; -- 0024: rows returned for the current lane, over its picks
  v_keyed boolean; -- 0024: the last pick left out rows whose key is taken at claim
  v_mark bigint; -- 0024: the lane's cursor after that pick
  -- 0042: the slot ranges for the ranking's head probes, read before it (the pick's own, v_lo1 …,
  -- are still read after its lane's cursor: a range read earlier could miss a row carried since,
  -- and the mark would pass it; a ranking that misses a head only leaves the lane for a later call)
  v_rlo1 int; -- 0042
  v_rhi1 int; -- 0042
  v_rlo2 int; -- 0042
  v_rhi2 int; -- 0042
  v_j int; -- 0042: the last lane of a busy lane's run of same-priority lanes
  v_passed text[] := '{}'; -- 0042: busy lanes moved behind their shards ('priority:shard')
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
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
    SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_rlo1, v_rhi1, v_rlo2, v_rhi2 FROM queue_slot_ranges() s; -- 0042
    -- 0042: the cursors by a lateral read of claim_marks (lane_cursor's query), not a call of
    -- lane_cursor per lane: its SET clauses and its own executor start cost ~0.1 ms a lane, so a
    -- claim of an 8-shard queue ran at a third of one lane's rate (pgbench, one client).
    WITH cur AS MATERIALIZED (
      SELECT l.queue, l.priority, l.shard, coalesce(mk.c, 0) AS c -- 0042
      FROM lanes l
      LEFT JOIN LATERAL (SELECT m.next_lane_seq AS c FROM claim_marks m -- 0042
                         WHERE m.queue = l.queue AND m.priority = l.priority AND m.shard = l.shard -- 0042
                         ORDER BY m.next_lane_seq DESC LIMIT 1) mk ON true -- 0042
      WHERE l.queue = p_queue
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
          AND (r.slot BETWEEN v_rlo1 AND v_rhi1 OR r.slot BETWEEN v_rlo2 AND v_rhi2) -- 0042: the live slots only
          AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                            AND (t.slot BETWEEN v_rlo1 AND v_rhi1 OR t.slot BETWEEN v_rlo2 AND v_rhi2)) -- 0042
        ORDER BY r.lane_seq LIMIT 1
      ) head
    ) o;
    IF v_prios IS NULL THEN
      RETURN;
    END IF;
  END IF;

  -- 0025: one pass over the lanes in rank order. A lane whose claim lock another claimer holds (a
  -- claim in flight: a few ms) is waited for, up to 100 ms and once per call, instead of skipped:
  -- skipping it took a worse-ranked lane's jobs while better-ranked ones waited (priority
  -- inversion under concurrent claimers). A lane still held after the wait, and any busy lane
  -- after it, is skipped, and the batch fills from the next lanes in order, so a claimer stuck
  -- behind a slow one never idles a poll interval for it. (0009 to 0024: pass 1 skipped busy
  -- lanes and claimed the rest at once; pass 2 waited only when pass 1 had claimed nothing.)
  v_k := 0; -- 0042: a WHILE over the lanes, whose order a busy shard may change (below)
  WHILE v_k < cardinality(v_prios) LOOP -- 0042
    v_k := v_k + 1; -- 0042
    EXIT WHEN v_left <= 0;
    -- = lane_key(p_queue, priority, shard), written with immutable operators so it is inlined
    -- (the SQL function is planned again on every call, as 0012 found for enqueue)
    v_locked := pg_try_advisory_xact_lock(lock_ns('claim'),
                                          hashtext(p_queue || chr(31) || v_prios[v_k]::text || chr(31) || v_shards[v_k]::text));
    IF NOT v_locked THEN
      -- With one lane the ordering query was skipped: wait for the busy lane only if it has
      -- a claimable head, as with several lanes (an idle queue still answers empty at once).
      CONTINUE WHEN NOT v_ordered AND NOT EXISTS (
        SELECT 1 FROM ready r
        WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k]
          AND r.lane_seq >= (SELECT coalesce(max(m.next_lane_seq), 0) FROM claim_marks m
                             WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k])
          AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq));
      -- 0042: a busy lane followed in the order by lanes of the same priority (other shards of
      -- the queue, capabilities.md §22: not ordered among themselves) goes behind them, once,
      -- instead of being waited for: its claimer is taking its jobs, and this one takes the next
      -- shard's. Met again after them, it is waited for as below (rank order across priorities
      -- is kept: the move never passes a lane of another priority).
      IF v_prios[v_k + 1] = v_prios[v_k] AND NOT (v_prios[v_k] || ':' || v_shards[v_k]) = ANY (v_passed) THEN -- 0042
        v_j := v_k + 1; -- 0042
        WHILE v_prios[v_j + 1] = v_prios[v_k] LOOP -- 0042
          v_j := v_j + 1; -- 0042
        END LOOP; -- 0042
        v_passed := v_passed || (v_prios[v_k] || ':' || v_shards[v_k]); -- 0042
        v_prios := v_prios[1:v_k - 1] || v_prios[v_k + 1:v_j] || v_prios[v_k] || v_prios[v_j + 1:]; -- 0042
        v_shards := v_shards[1:v_k - 1] || v_shards[v_k + 1:v_j] || v_shards[v_k] || v_shards[v_j + 1:]; -- 0042
        v_k := v_k - 1; -- 0042: the lane now at v_k is the next one
        CONTINUE; -- 0042
      END IF; -- 0042
      CONTINUE WHEN NOT v_may_wait; -- 0025
      v_may_wait := false; -- 0025
      BEGIN
        PERFORM set_config('lock_timeout', '100ms', true);
        PERFORM pg_advisory_xact_lock(lock_ns('claim'),
                                      hashtext(p_queue || chr(31) || v_prios[v_k]::text || chr(31) || v_shards[v_k]::text));
        PERFORM set_config('lock_timeout', v_saved_timeout, true);
        v_locked := true; -- 0025
      EXCEPTION WHEN lock_not_available THEN
        -- still held after 100 ms: on to the next lane (0025; the setting rolls back with the block)
        v_locked := false;
      END;
      CONTINUE WHEN NOT v_locked; -- 0025
    END IF;
    v_got := 0; -- 0024
    LOOP -- 0024: once more after a pick that superseded rows (see Keys at claim below)
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
             r.tags, r.errors, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.progress, r.unique_key, r.unique_states -- 0022
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
      WHERE p.unique_key IS NULL OR (p.unique_states & 6) <> 4 -- 0024: not a row whose key is taken at claim
    ),
    -- available -> running leaves a mask that holds 'available' but not 'running': the key goes
    -- (capabilities.md §4). Default masks hold both: the filter finds nothing.
    rel_unique AS (
      DELETE FROM unique_claims u USING picked p
      WHERE p.unique_key IS NOT NULL AND (p.unique_states & 6) = 2
        AND u.unique_key = p.unique_key AND u.job_id = p.job_id
    )
    SELECT p.job_id, p.run_lease + 1, p.attempt + 1, p.max_attempts, p.kind, p.queue, p.priority, p.args, p.metadata,
           p.tags, p.errors, p.run_at, p.created_at, v_now, v_deadline, p.progress /* 0022 */
    FROM picked p
    -- 0024: a row whose mask holds 'running' but not 'available' is left to the statement below;
    -- set_config (evaluated only for such a row: OR stops at the first true arm) tells the loop.
    WHERE p.unique_key IS NULL OR (p.unique_states & 6) <> 4
       OR set_config('awa.claim_keyed', 'on', true) IS NULL -- 0024
    ORDER BY p.lane_seq;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_got := v_got + v_n; -- 0024
    v_left := v_left - v_n; -- 0024 (was after the two tests below; v_n = 0 there)
    v_keyed := current_setting('awa.claim_keyed', true) = 'on'; -- 0024
    EXIT WHEN v_keyed IS NOT TRUE; -- 0024: every default-mask call leaves here
    -- 0024: Keys at claim (capabilities.md §4, as the simulation). available -> running enters a
    -- mask that holds 'running' but not 'available': the job takes its key. The pick above marked
    -- these rows as claimed (its mark passes them) but wrote no claims row for them and did not
    -- return them; this statement does, in lane order among them, under the same lane lock.
    -- They are the lane's ready rows from the old cursor up to the new one, in the same slot
    -- ranges, not tombstoned and with no claims row: no other row can be there (positions of a
    -- lane commit in order under its enqueue lock, and no row is carried or unparked into the
    -- lane while we hold its claim lock and ACCESS SHARE on the claim_marks children).
    -- The first row per key inserts it (keys in key order: two such statements cannot deadlock
    -- on each other's keys). A row whose key another job holds -- committed before, taken by an
    -- earlier row here, or inserted by a claim of another lane that the insert waited for -- is
    -- superseded: cancelled 'superseded by duplicate <holder>', a tombstone and a wide terminal
    -- row in its ready row's slot (as cancel_job ends an available job), no attempt used.
    -- DO UPDATE (a no-op write of the holder's key row, on this rare path only) returns the
    -- holder even when it committed after this statement's snapshot, and keeps it from
    -- releasing the key until we commit.
    PERFORM set_config('awa.claim_keyed', '', true);
    SELECT m.next_lane_seq INTO v_mark FROM claim_marks m
    WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k]
    ORDER BY m.next_lane_seq DESC LIMIT 1;
    RETURN QUERY
    WITH keyed AS MATERIALIZED (
      SELECT r.slot, r.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata,
             r.tags, r.errors, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.progress, r.unique_key,
             r.unique_states
      FROM ready r
      WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k]
        AND r.lane_seq >= v_cursor AND r.lane_seq < v_mark
        AND (r.slot BETWEEN v_lo1 AND v_hi1 OR r.slot BETWEEN v_lo2 AND v_hi2)
        AND r.unique_key IS NOT NULL AND (r.unique_states & 6) = 4
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          AND (t.slot BETWEEN v_lo1 AND v_hi1 OR t.slot BETWEEN v_lo2 AND v_hi2))
        AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.job_id = r.job_id AND c.lane_seq = r.lane_seq
                          AND (c.slot BETWEEN v_lo1 AND v_hi1 OR c.slot BETWEEN v_lo2 AND v_hi2))
    ),
    took AS (
      INSERT INTO unique_claims AS u (unique_key, job_id)
      SELECT DISTINCT ON (k.unique_key) k.unique_key, k.job_id FROM keyed k ORDER BY k.unique_key, k.lane_seq
      ON CONFLICT (unique_key) DO UPDATE SET job_id = u.job_id
      RETURNING u.unique_key, u.job_id AS holder
    ),
    settled AS MATERIALIZED (
      SELECT k.*, t.holder FROM keyed k JOIN took t ON t.unique_key = k.unique_key
    ),
    ins AS (
      INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at)
      SELECT s.slot, s.generation, s.job_id, s.run_lease + 1, s.attempt + 1, s.queue, s.priority, s.shard, s.lane_seq,
             v_now, v_deadline
      FROM settled s WHERE s.holder = s.job_id
    ),
    tomb AS (
      INSERT INTO ready_tombstones (slot, generation, job_id, queue, priority, shard, lane_seq)
      SELECT s.slot, s.generation, s.job_id, s.queue, s.priority, s.shard, s.lane_seq FROM settled s WHERE s.holder <> s.job_id
    ),
    ended AS (
      INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                            kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT s.slot, s.generation, s.job_id, s.run_lease, 'cancelled', s.attempt, v_now,
             append_error(s.errors, jsonb_build_object('error', 'cancelled: superseded by duplicate ' || s.holder,
                                                       'attempt', s.attempt, 'at', v_now)),
             s.progress, true, s.kind, s.queue, s.priority, s.args, s.metadata, s.tags, s.max_attempts, s.run_at,
             s.created_at, s.unique_key, s.unique_states
      FROM settled s WHERE s.holder <> s.job_id
    )
    SELECT s.job_id, s.run_lease + 1, s.attempt + 1, s.max_attempts, s.kind, s.queue, s.priority, s.args, s.metadata,
           s.tags, s.errors, s.run_at, s.created_at, v_now, v_deadline, s.progress
    FROM settled s WHERE s.holder = s.job_id
    ORDER BY s.lane_seq;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_got := v_got + v_n;
    v_left := v_left - v_n;
    -- Superseded rows used part of the pick's limit: pick again from this lane (a superseded
    -- head must not make the call look empty; the simulation goes on down the lane).
    EXIT WHEN v_left <= 0;
    END LOOP; -- 0024
  END LOOP;
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) FROM PUBLIC;

-- :AWA_SCHEMA.claim_keyed: 0041's text, lines marked 0042 (its ranking, as claim's).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.claim_keyed(p_queue text, p_policy text, p_max int, p_deadline_ms bigint, p_aging_ms bigint)
  RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamptz, created_at timestamptz, claimed_at timestamptz, deadline_at timestamptz, progress jsonb, gate text)
  LANGUAGE plpgsql
  SET search_path = :AWA_SCHEMA, pg_catalog
  SET plan_cache_mode = force_generic_plan
  SET enable_seqscan = off
  SET jit = off
  SET enable_bitmapscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  SET enable_material = off
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_deadline timestamptz := CASE WHEN p_deadline_ms > 0 THEN now() + p_deadline_ms * interval '1 millisecond' END;
  v_left int := least(p_max, 64);
  v_limit int;
  v_state text;
  v_prios smallint[];
  v_shards smallint[];
  v_k int;
  v_i int;
  v_cursor bigint;
  v_n int;
  v_total int := 0;
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
  v_klo1 int; -- 0036: the slot ranges read after the key locks (the count's slots)
  v_khi1 int; -- 0036
  v_klo2 int; -- 0036
  v_khi2 int; -- 0036
  v_rlo1 int; -- 0042: the ranking's slot ranges (as claim's)
  v_rhi1 int; -- 0042
  v_rlo2 int; -- 0042
  v_rhi2 int; -- 0042
  v_gen bigint; -- 0036: the queue ring's newest generation before the pick's ranges were read
  v_gen2 bigint; -- 0036: and after a lane's key locks
  v_ids bigint[];
  v_rows ready[]; -- 0036: the window's rows, claimed from here (no second read of ready)
  v_ranked boolean := false; -- 0036: the lanes were ranked (more than one)
  v_seqs bigint[];
  v_digests bytea[];
  v_at_claim boolean[];
  v_admit int;
  v_d bytea;
  v_pos int;
  v_keys bytea[] := '{}';        -- keys tried by this call
  v_locked_keys boolean[] := '{}'; -- per key: its lock is ours
  v_held int[] := '{}';          -- per key: open grants plus those admitted in this call
  v_new bytea[];
  v_new_locked boolean[];
  v_new_held int[];
  v_hz bigint[] := '{}';      -- 0036: per key: its horizon (see the header), NULL if not counted
  v_new_hz bigint[];          -- 0036
  v_row_hz bigint[];          -- 0036: per window row: its key's horizon
  v_floor bigint;             -- 0036: this lane's grant sequence value, taken after its key locks
  v_gated boolean := false;
  v_contended boolean := false;
  v_out ready[] := '{}'; -- 0041: the claimed rows of every lane, returned once at the end
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim_keyed needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF p_max <= 0 THEN
    RETURN;
  END IF;
  -- The policy, read in a statement after its lock is held shared (a change of limit waits for us).
  PERFORM pg_advisory_xact_lock_shared(lock_ns('key_policy'), hashtext(p_policy));
  SELECT kp.max_in_flight, kp.state INTO v_limit, v_state FROM key_policies kp WHERE kp.id = p_policy;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'key policy "%" does not exist', p_policy
      USING ERRCODE = 'AWK01', HINT = 'Create it with keyPolicies.create before a queue uses it.';
  END IF;
  -- 0036: the queue's lanes; none when paused. With one lane the ranking below is skipped (as
  -- claim does): the window finds out whether the lane has anything.
  SELECT array_agg(l.priority), array_agg(l.shard) INTO v_prios, v_shards FROM lanes l -- 0036
  WHERE l.queue = p_queue AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused); -- 0036
  IF v_prios IS NULL THEN -- 0036
    RETURN; -- 0036
  END IF; -- 0036
  IF cardinality(v_prios) > 1 THEN -- 0036
  v_ranked := true; -- 0036
  -- The queue's lanes with a claimable head, in claim order; none when paused.
  SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_rlo1, v_rhi1, v_rlo2, v_rhi2 FROM queue_slot_ranges() s; -- 0042
  -- 0042: the cursors by a lateral read of claim_marks, not a lane_cursor call per lane (as claim)
  WITH cur AS MATERIALIZED (
    SELECT l.queue, l.priority, l.shard, coalesce(mk.c, 0) AS c -- 0042
    FROM lanes l
    LEFT JOIN LATERAL (SELECT m.next_lane_seq AS c FROM claim_marks m -- 0042
                       WHERE m.queue = l.queue AND m.priority = l.priority AND m.shard = l.shard -- 0042
                       ORDER BY m.next_lane_seq DESC LIMIT 1) mk ON true -- 0042
    WHERE l.queue = p_queue
      AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused)
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
        AND (r.slot BETWEEN v_rlo1 AND v_rhi1 OR r.slot BETWEEN v_rlo2 AND v_rhi2) -- 0042: the live slots only
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          AND (t.slot BETWEEN v_rlo1 AND v_rhi1 OR t.slot BETWEEN v_rlo2 AND v_rhi2)) -- 0042
      ORDER BY r.lane_seq LIMIT 1
    ) head
  ) o;
  IF v_prios IS NULL THEN
    RETURN;
  END IF;
  END IF; -- 0036

  FOR v_k IN 1 .. cardinality(v_prios) LOOP
    EXIT WHEN v_left <= 0;
    IF NOT pg_try_advisory_xact_lock(lock_ns('claim'),
                                     hashtext(p_queue || chr(31) || v_prios[v_k]::text || chr(31) || v_shards[v_k]::text)) THEN
      -- 0036: an unranked lane is contended only if it has a claimable head (else: idle), as claim
      CONTINUE WHEN NOT v_ranked AND NOT EXISTS ( -- 0036
        SELECT 1 FROM ready r -- 0036
        WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k] -- 0036
          AND r.lane_seq >= lane_cursor(p_queue, v_prios[v_k], v_shards[v_k]) -- 0036
          AND NOT EXISTS (SELECT 1 FROM ready_tombstones t -- 0036
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq)); -- 0036
      v_contended := true;
      CONTINUE;
    END IF;
    SELECT m.next_lane_seq INTO v_cursor FROM claim_marks m
    WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k]
    ORDER BY m.next_lane_seq DESC LIMIT 1;
    v_cursor := coalesce(v_cursor, 0);
    IF v_lo1 IS NULL THEN
      -- 0036: the newest generation, read before the ranges (they reach at least up to it)
      SELECT g.generation INTO v_gen FROM ring_rotations g WHERE g.ring = 'queue' ORDER BY g.generation DESC LIMIT 1; -- 0036
      SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_lo1, v_hi1, v_lo2, v_hi2 FROM queue_slot_ranges() s;
    END IF;
    -- The window (claim's pick, without the writes).
    WITH w AS MATERIALIZED (
      SELECT r AS rw, r.job_id, r.lane_seq, r.metadata ->> 'awa:concurrencyKey' AS ckey, -- 0036: rw
             (r.unique_key IS NOT NULL AND (r.unique_states & 6) = 4) AS at_claim
      FROM ready r
      WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k] AND r.lane_seq >= v_cursor
        AND (r.slot BETWEEN v_lo1 AND v_hi1 OR r.slot BETWEEN v_lo2 AND v_hi2)
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          AND (t.slot BETWEEN v_lo1 AND v_hi1 OR t.slot BETWEEN v_lo2 AND v_hi2))
        AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused)
        AND r.lane_seq < coalesce((SELECT p.lane_seq FROM parked p
                                   WHERE p.queue = p_queue AND p.priority = v_prios[v_k] AND p.shard = v_shards[v_k]
                                   ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
      ORDER BY r.lane_seq LIMIT v_left
    )
    SELECT array_agg(w.job_id ORDER BY w.lane_seq), array_agg(w.lane_seq ORDER BY w.lane_seq),
           -- 0036: key_digest(w.ckey) written out: the function is not inlined (convert_to is
           -- STABLE in an IMMUTABLE function), and a call per row cost ~10 µs of SQL-function setup
           array_agg(CASE WHEN w.ckey IS NOT NULL -- 0036
                          THEN sha256(convert_to('awa.concurrency-key.v1' || chr(31) || ':AWA_SCHEMA' || chr(31) || w.ckey, 'UTF8')) -- 0036
                     END ORDER BY w.lane_seq), -- 0036
           array_agg(w.at_claim ORDER BY w.lane_seq),
           array_agg(w.rw ORDER BY w.lane_seq) -- 0036
      INTO v_ids, v_seqs, v_digests, v_at_claim, v_rows -- 0036
    FROM w;
    CONTINUE WHEN v_ids IS NULL;
    -- The window's keys not seen yet in this call, in order of first appearance (at most 64 per
    -- call in all: the lock-table budget, 0036), each try-locked once, in one statement.
    IF v_state = 'active' THEN
      SELECT coalesce(array_agg(k.d ORDER BY k.first), '{}'),
             coalesce(array_agg(pg_try_advisory_xact_lock(lock_ns('key'),
                                  (get_byte(k.d, 0) << 24) | (get_byte(k.d, 1) << 16) | (get_byte(k.d, 2) << 8) | get_byte(k.d, 3))
                                ORDER BY k.first), '{}')
        INTO v_new, v_new_locked
      FROM (SELECT u.d, min(u.i) AS first FROM unnest(v_digests) WITH ORDINALITY u(d, i)
            WHERE u.d IS NOT NULL AND NOT (u.d = ANY (v_keys))
            GROUP BY u.d ORDER BY min(u.i) LIMIT 64 - cardinality(v_keys)) k; -- 0036: 64 keys (was 32)
      -- 0036: the slots that can hold a claim, as seen after the key locks: a grant committed by
      -- an earlier holder of a key's lock sits in a slot rotated in before that. The pick's
      -- ranges do when no rotation committed since v_gen was read before them (the lower end
      -- cannot move while we run, see the header); else they are read again.
      SELECT g.generation INTO v_gen2 FROM ring_rotations g WHERE g.ring = 'queue' ORDER BY g.generation DESC LIMIT 1; -- 0036
      IF v_gen2 IS NOT DISTINCT FROM v_gen THEN -- 0036
        v_klo1 := v_lo1; v_khi1 := v_hi1; v_klo2 := v_lo2; v_khi2 := v_hi2; -- 0036
      ELSE -- 0036
        SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_klo1, v_khi1, v_klo2, v_khi2 FROM queue_slot_ranges() s; -- 0036
      END IF; -- 0036
      -- 0036: this lane's grants' key_seq: taken after its key locks, so above every key_seq an
      -- earlier holder of any of them wrote (the order the horizons rely on).
      v_floor := nextval('key_grant_seq'); -- 0036
      -- Their open grants, in a statement that starts after the locks are held: it sees every
      -- grant committed by an earlier holder of each lock. (Keys whose lock another claimer
      -- holds are not counted: the walk stops at them.) 0036: only the grants from the key's
      -- horizon on (the horizon of its newest grant: every grant of the key below it was closed
      -- when that grant was taken) and those without a key_seq (carried by prune, or written
      -- before 0036), up to the limit (admission only asks whether open + admitted < limit),
      -- in the slots that can hold a claim. Also the smallest key_seq among the open ones. (The
      -- closures' slot ranges are implied by x.slot = c.slot; written out, they let the executor
      -- open one closures child instead of sixteen.)
      SELECT coalesce(array_agg(g.n ORDER BY k.i), '{}'), -- 0036
             coalesce(array_agg(least(g.m, v_floor) ORDER BY k.i), '{}') -- 0036
        INTO v_new_held, v_new_hz -- 0036
      FROM unnest(v_new) WITH ORDINALITY k(d, i)
      LEFT JOIN LATERAL ( -- 0036
        SELECT count(*)::int AS n, min(o.s) AS m FROM ( -- 0036
          (SELECT c.key_seq AS s FROM claims c -- 0036
           WHERE c.key_policy = p_policy AND c.key_digest = k.d -- 0036
             AND (c.slot BETWEEN v_klo1 AND v_khi1 OR c.slot BETWEEN v_klo2 AND v_khi2) -- 0036
             AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims h -- 0036
                                        WHERE h.key_policy = p_policy AND h.key_digest = k.d AND h.key_seq IS NOT NULL -- 0036
                                          AND (h.slot BETWEEN v_klo1 AND v_khi1 OR h.slot BETWEEN v_klo2 AND v_khi2) -- 0036
                                        ORDER BY h.key_seq DESC LIMIT 1), 0) -- 0036
             AND NOT EXISTS (SELECT 1 FROM closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease AND x.slot = c.slot -- 0036
                               AND (x.slot BETWEEN v_klo1 AND v_khi1 OR x.slot BETWEEN v_klo2 AND v_khi2))) -- 0036
          UNION ALL -- 0036
          (SELECT NULL::bigint FROM claims c -- 0036
           WHERE c.key_policy = p_policy AND c.key_digest = k.d AND c.key_seq IS NULL -- 0036
             AND (c.slot BETWEEN v_klo1 AND v_khi1 OR c.slot BETWEEN v_klo2 AND v_khi2) -- 0036
             AND NOT EXISTS (SELECT 1 FROM closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease AND x.slot = c.slot -- 0036
                               AND (x.slot BETWEEN v_klo1 AND v_khi1 OR x.slot BETWEEN v_klo2 AND v_khi2))) -- 0036
          LIMIT v_limit) o -- 0036
      ) g ON v_new_locked[k.i]; -- 0036
      v_keys := v_keys || v_new;
      v_locked_keys := v_locked_keys || v_new_locked;
      v_held := v_held || v_new_held;
      v_hz := v_hz || v_new_hz; -- 0036
    END IF;
    -- The admitted prefix.
    v_admit := 0;
    v_row_hz := '{}'; -- 0036
    FOR v_i IN 1 .. cardinality(v_ids) LOOP
      EXIT WHEN v_at_claim[v_i];
      v_d := v_digests[v_i];
      IF v_d IS NOT NULL AND v_state <> 'disabled' THEN
        IF v_state = 'draining' THEN
          v_gated := true;
          EXIT;
        END IF;
        v_pos := array_position(v_keys, v_d);
        EXIT WHEN v_pos IS NULL; -- past the 64 keys of this call (0036)
        IF NOT v_locked_keys[v_pos] THEN
          v_contended := true;
          EXIT;
        END IF;
        IF v_held[v_pos] >= v_limit THEN
          v_gated := true;
          EXIT;
        END IF;
        v_held[v_pos] := v_held[v_pos] + 1;
        v_row_hz[v_i] := v_hz[v_pos]; -- 0036
      END IF;
      v_admit := v_i;
    END LOOP;
    CONTINUE WHEN v_admit = 0;
    -- Mark, claim and return the prefix (the rows of positions v_cursor .. v_seqs[v_admit] read
    -- above: none can appear or go while we hold the lane's claim lock, see claim). 0036: the
    -- window's own rows (ready rows are never updated), not a second lookup of ready.
    WITH picked AS MATERIALIZED ( -- 0041: counted here, returned at the end
      SELECT r.slot, r.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata,
             r.tags, r.errors, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.progress,
             v_digests[r.ordinality] AS digest, v_row_hz[r.ordinality] AS hz -- 0036
      FROM unnest(v_rows[1:v_admit]) WITH ORDINALITY r -- 0036
    ),
    mark AS (
      INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
      SELECT ring.slot, ring.generation, p_queue, v_prios[v_k], v_shards[v_k], v_seqs[v_admit] + 1
      FROM (SELECT g.slot, g.generation FROM ring_rotations g WHERE g.ring = 'queue'
            ORDER BY g.generation DESC LIMIT 1) ring
    ),
    ins AS (
      INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at,
                          deadline_at, key_policy, key_digest, key_seq, key_horizon) -- 0036
      SELECT p.slot, p.generation, p.job_id, p.run_lease + 1, p.attempt + 1, p.queue, p.priority, p.shard, p.lane_seq,
             v_now, v_deadline, CASE WHEN p.digest IS NOT NULL THEN p_policy END, p.digest,
             CASE WHEN p.digest IS NOT NULL THEN v_floor END, p.hz -- 0036: NULL unless counted (active)
      FROM picked p
    )
    SELECT count(*)::int INTO v_n FROM picked; -- 0041
    v_out := v_out || v_rows[1:v_admit]; -- 0041: in lane order, each lane's rows by position
    v_total := v_total + v_n;
    v_left := v_left - v_n;
  END LOOP;
  -- 0041: the claimed rows, each carrying why the call stopped short of its window if it did (a
  -- key at its limit, or one whose lock another claimer held); NULL otherwise.
  IF v_total > 0 THEN -- 0041
    RETURN QUERY -- 0041
    SELECT r.job_id, r.run_lease + 1, r.attempt + 1, r.max_attempts, r.kind, r.queue, r.priority, r.args, r.metadata, -- 0041
           r.tags, r.errors, r.run_at, r.created_at, v_now, v_deadline, r.progress, -- 0041
           CASE WHEN v_contended THEN 'keyLockContended' WHEN v_gated THEN 'keyGated' END -- 0041
    FROM unnest(v_out) WITH ORDINALITY r -- 0041
    ORDER BY r.ordinality; -- 0041
  ELSIF v_contended OR v_gated THEN -- 0041
    RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::int, NULL::int, NULL::text, p_queue, NULL::smallint, NULL::jsonb,
                        NULL::jsonb, NULL::text[], NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                        NULL::timestamptz, NULL::jsonb,
                        CASE WHEN v_contended THEN 'keyLockContended' ELSE 'keyGated' END;
  END IF;
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim_keyed(text, text, int, bigint, bigint) FROM PUBLIC;

-- The shard a re-entered job takes (retry_from_dlq, dlq_retry_batch, retry_job): the rule of
-- enqueue_one and enqueue_batch, which inline it on their hot paths. Reads queue_meta and draws
-- from the rotor; no other table.
CREATE FUNCTION :AWA_SCHEMA.shard_for(p_queue text, p_metadata jsonb)
  RETURNS smallint
  LANGUAGE plpgsql
  SET search_path = :AWA_SCHEMA, pg_catalog
  SET jit = off
AS $function$
DECLARE
  v_width int;
  v_key text := coalesce(p_metadata ->> 'awa:orderingKey', p_metadata ->> 'awa:concurrencyKey');
BEGIN
  SELECT m.enqueue_shards INTO v_width FROM queue_meta m WHERE m.queue = p_queue;
  IF v_width IS NULL OR v_width <= 1 THEN
    RETURN 0;
  END IF;
  RETURN CASE WHEN v_key IS NOT NULL
              THEN (hashtextextended('shard' || chr(31) || v_key, 0) & 9223372036854775807) % v_width
              ELSE shard_draw() % v_width END;
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.shard_for(text, jsonb) FROM PUBLIC;

-- :AWA_SCHEMA.retry_from_dlq: its text as installed before 0042, lines marked 0042 (the shard).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.retry_from_dlq(p_job_id bigint, p_queue text, p_priority integer, p_run_at timestamp with time zone)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET jit = off
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_row dlq%ROWTYPE;
  v_queue text;
  v_priority smallint;
  v_run_at timestamptz;
  v_state text;
  v_holder bigint;
  v_ring record;
  v_shard smallint; -- 0042
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'retry_from_dlq needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  DELETE FROM dlq d WHERE d.job_id = p_job_id RETURNING d.* INTO v_row;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  v_queue := coalesce(p_queue, v_row.queue);
  v_priority := coalesce(p_priority, v_row.priority);
  v_run_at := coalesce(p_run_at, v_now);
  v_state := CASE WHEN v_run_at > v_now THEN 'scheduled' ELSE 'available' END;
  -- 0042: the destination queue's shard for the job's ordering (else concurrency) key, as an insert
  -- chooses it: a key's retried job joins its key's lane; at width 1, shard 0 as before
  v_shard := shard_for(v_queue, v_row.metadata); -- 0042
  IF v_state = 'available' THEN
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_queue, v_priority, v_shard)); -- 0042
  END IF;
  IF v_row.unique_key IS NOT NULL AND (v_row.unique_states & state_bit(v_state)) <> 0 THEN
    INSERT INTO unique_claims (unique_key, job_id) VALUES (v_row.unique_key, p_job_id) ON CONFLICT DO NOTHING;
    SELECT u.job_id INTO v_holder FROM unique_claims u WHERE u.unique_key = v_row.unique_key;
    IF v_holder <> p_job_id THEN
      RAISE EXCEPTION 'unique key % is held by job %', encode(v_row.unique_key, 'hex'), v_holder
        USING ERRCODE = 'AWU01', DETAIL = encode(v_row.unique_key, 'hex'), HINT = v_holder::text;
    END IF;
  END IF;
  IF v_state = 'scheduled' THEN
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, progress, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    VALUES (p_job_id, 'scheduled', v_row.kind, v_queue, v_priority, v_shard, v_row.args, v_row.metadata, v_row.tags, v_row.errors, -- 0042
            v_row.progress, 0, v_row.original_run_lease, v_row.max_attempts, v_run_at, v_row.created_at,
            v_row.unique_key, v_row.unique_states);
    RETURN v_state;
  END IF;
  INSERT INTO lanes (queue, priority, shard) VALUES (v_queue, v_priority, v_shard) ON CONFLICT DO NOTHING; -- 0042
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
  INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                     errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
  VALUES (v_ring.slot, v_ring.generation, p_job_id, v_row.kind, v_queue, v_priority, v_shard, nextval('lane_seq'), -- 0042
          v_row.args, v_row.metadata, v_row.tags, v_row.errors, v_row.progress, 0, v_row.original_run_lease,
          v_row.max_attempts, v_run_at, v_row.created_at, v_row.unique_key, v_row.unique_states);
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', v_queue);
  RETURN v_state;
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.retry_from_dlq(bigint, text, int, timestamptz) FROM PUBLIC;

-- :AWA_SCHEMA.retry_job: its text as installed before 0042, lines marked 0042 (the shard).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.retry_job(p_job_id bigint)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET jit = off
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_job record;
  v_key record;
  v_ring record;
  v_holder bigint;
  v_shard smallint; -- 0042
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'retry_job needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  SELECT * INTO v_job FROM jobs j WHERE j.job_id = p_job_id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF v_job.dlq_reason IS NOT NULL THEN
    -- the newest representation is the DLQ row: move it out, never copy it beside the entry
    RETURN retry_from_dlq(p_job_id, NULL, NULL, NULL);
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
  v_shard := shard_for(v_job.queue, v_job.metadata); -- 0042: as retry_from_dlq
  PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_job.queue, v_job.priority, v_shard)); -- 0042
  IF v_key.unique_key IS NOT NULL AND (v_key.unique_states & state_bit('available')) <> 0 THEN
    INSERT INTO unique_claims (unique_key, job_id) VALUES (v_key.unique_key, p_job_id) ON CONFLICT DO NOTHING;
    SELECT u.job_id INTO v_holder FROM unique_claims u WHERE u.unique_key = v_key.unique_key;
    IF v_holder <> p_job_id THEN
      RAISE EXCEPTION 'unique key % is held by job %', encode(v_key.unique_key, 'hex'), v_holder
        USING ERRCODE = 'AWU01', DETAIL = encode(v_key.unique_key, 'hex'), HINT = v_holder::text;
    END IF;
  END IF;
  INSERT INTO lanes (queue, priority, shard) VALUES (v_job.queue, v_job.priority, v_shard) ON CONFLICT DO NOTHING; -- 0042
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
  INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                     errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
  VALUES (v_ring.slot, v_ring.generation, p_job_id, v_job.kind, v_job.queue, v_job.priority, v_shard, nextval('lane_seq'), -- 0042
          v_job.args, v_job.metadata, v_job.tags, v_job.errors, v_job.progress, 0, v_job.run_lease, v_job.max_attempts,
          v_now, v_job.created_at, v_key.unique_key, coalesce(v_key.unique_states, 0));
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', v_job.queue);
  RETURN 'available';
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.retry_job(bigint) FROM PUBLIC;

-- :AWA_SCHEMA.dlq_retry_batch: its text as installed before 0042, lines marked 0042 (the shard).
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.dlq_retry_batch(p_queue text, p_kind text, p_tag text, p_since timestamp with time zone, p_until timestamp with time zone, p_before bigint, p_after_job_id bigint, p_limit integer, OUT retried integer, OUT last_job_id bigint)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET jit = off
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_ids bigint[];
  v_lane record;
  v_slot int;
  v_generation bigint;
  v_pos bigint[];
  v_queues text[];
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'dlq_retry_batch needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  retried := 0;
  SELECT array_agg(d.job_id ORDER BY d.job_id), max(d.job_id) INTO v_ids, last_job_id
  FROM (
    SELECT m.job_id FROM dlq m
    WHERE (p_queue IS NULL OR m.queue = p_queue) AND (p_kind IS NULL OR m.kind = p_kind)
      AND (p_tag IS NULL OR p_tag = ANY (m.tags)) AND (p_since IS NULL OR m.dlq_at >= p_since)
      AND (p_until IS NULL OR m.dlq_at < p_until) AND (p_before IS NULL OR m.job_id < p_before)
      AND m.job_id > coalesce(p_after_job_id, 0)
    ORDER BY m.job_id LIMIT p_limit
    FOR UPDATE SKIP LOCKED
  ) d;
  IF v_ids IS NULL THEN
    RETURN;
  END IF;

  -- the target lanes' enqueue locks, sorted, before the unique keys (enqueue's order)
  -- 0042: each entry's shard as retry_from_dlq chooses it (shard_for: the same answer for the
  -- insert below, within this transaction)
  FOR v_lane IN
    SELECT DISTINCT d.queue COLLATE "C" AS queue, d.priority, shard_for(d.queue, d.metadata) AS shard -- 0042
    FROM dlq d WHERE d.job_id = ANY (v_ids) ORDER BY 1, 2, 3 -- 0042
  LOOP
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_lane.queue, v_lane.priority, v_lane.shard)); -- 0042
    INSERT INTO lanes (queue, priority, shard) VALUES (v_lane.queue, v_lane.priority, v_lane.shard) ON CONFLICT DO NOTHING; -- 0042
  END LOOP;

  -- Keys the retried jobs must hold ('available' in their mask); an entry whose key another job
  -- holds stays in the DLQ (retry_from_dlq raises AWU01 for it; a bulk retry passes it over).
  INSERT INTO unique_claims (unique_key, job_id)
  SELECT d.unique_key, d.job_id FROM dlq d
  WHERE d.job_id = ANY (v_ids) AND d.unique_key IS NOT NULL AND (d.unique_states & state_bit('available')) <> 0
  ORDER BY d.job_id
  ON CONFLICT (unique_key) DO NOTHING;
  SELECT array_agg(d.job_id ORDER BY d.job_id) INTO v_ids FROM dlq d
  WHERE d.job_id = ANY (v_ids)
    AND (d.unique_key IS NULL OR (d.unique_states & state_bit('available')) = 0
         OR EXISTS (SELECT 1 FROM unique_claims u WHERE u.unique_key = d.unique_key AND u.job_id = d.job_id));
  IF v_ids IS NULL THEN
    RETURN;
  END IF;

  SELECT o_generation, o_slot INTO v_generation, v_slot FROM enqueue_ready_slot();
  SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, cardinality(v_ids))) s;
  WITH gone AS (
    DELETE FROM dlq d WHERE d.job_id = ANY (v_ids) RETURNING d.*
  ),
  ranked AS (
    SELECT g.*, row_number() OVER (ORDER BY g.job_id) AS rank FROM gone g
  ),
  ins AS (
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_slot, v_generation, r.job_id, r.kind, r.queue, r.priority, shard_for(r.queue, r.metadata), v_pos[r.rank], r.args, r.metadata, r.tags, -- 0042
           r.errors, r.progress, 0, r.original_run_lease, r.max_attempts, v_now, r.created_at, r.unique_key, r.unique_states
    FROM ranked r
    RETURNING queue
  )
  SELECT count(*)::int, array_agg(DISTINCT ins.queue) INTO retried, v_queues FROM ins;
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q) FROM unnest(v_queues) AS q;
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.dlq_retry_batch(text, text, text, timestamptz, timestamptz, bigint, bigint, int) FROM PUBLIC;
