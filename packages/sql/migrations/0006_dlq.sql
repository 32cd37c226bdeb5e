-- 0006: the dead letter queue (capability 19; docs/adr/0005-dlq.md).
--
-- A job that fails terminally or exhausts its attempts (rescue included) on a queue with DLQ
-- routing moves, in the same transaction as its final failure, to the plain `dlq` table instead
-- of the ring's terminal rows. The table churns with failures on DLQ queues only, and retention
-- deletes it in bounded batches. Operator retry removes the entry and adds a new ready or
-- deferred representation (attempt 0, run_lease unchanged, so leases stay monotonic).

ALTER TABLE :AWA_SCHEMA.queue_meta
  ADD COLUMN dlq_enabled boolean,
  ADD COLUMN dlq_retention interval;

-- Installation-wide settings that every process must agree on (not per-process config).
CREATE TABLE :AWA_SCHEMA.settings (
  key        text PRIMARY KEY,
  value      jsonb NOT NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE :AWA_SCHEMA.dlq (
  job_id             bigint      PRIMARY KEY,
  kind               text        NOT NULL,
  queue              text        NOT NULL,
  priority           smallint    NOT NULL,
  args               jsonb       NOT NULL,
  metadata           jsonb       NOT NULL,
  tags               text[]      NOT NULL,
  errors             jsonb       NOT NULL,
  progress           jsonb,
  attempt            int         NOT NULL,
  max_attempts       int         NOT NULL,
  original_run_lease bigint      NOT NULL,
  run_at             timestamptz NOT NULL,
  created_at         timestamptz NOT NULL,
  dlq_at             timestamptz NOT NULL,
  dlq_reason         text        NOT NULL,
  unique_key         bytea,
  unique_states      int         NOT NULL DEFAULT 0
);
CREATE INDEX dlq_by_time ON :AWA_SCHEMA.dlq (dlq_at);
CREATE INDEX dlq_by_queue ON :AWA_SCHEMA.dlq (queue, dlq_at);
CREATE INDEX dlq_by_kind ON :AWA_SCHEMA.dlq (kind, dlq_at);

-- Does a failure on this queue go to the DLQ? The queue's own setting, else the global default.
CREATE FUNCTION :AWA_SCHEMA.dlq_enabled(p_queue text) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT coalesce(
    (SELECT m.dlq_enabled FROM :AWA_SCHEMA.queue_meta m WHERE m.queue = p_queue),
    (SELECT (s.value #>> '{}')::boolean FROM :AWA_SCHEMA.settings s WHERE s.key = 'dlq_enabled_by_default'),
    false)
$$;

-- finalize, as in 0003, plus DLQ routing: an attempt ending `failed` on a DLQ queue writes a
-- dlq row instead of a terminal row. Items may carry `reason` (rescue: stale_heartbeat,
-- deadline_exceeded); otherwise terminal_error for a Fail and max_attempts_exhausted for an
-- exhausted retry.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.finalize(p_items jsonb)
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
    SELECT x_e.o::int AS o, x.job_id, x.run_lease, x.outcome, coalesce(x.delay_ms, 0) AS delay_ms, x.message, x.reason
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x_e(v, o),
         jsonb_to_record(x_e.v) AS x(job_id bigint, run_lease bigint, outcome text, delay_ms bigint, message text, reason text)
  ),
  open AS (
    SELECT DISTINCT ON (i.job_id, i.run_lease)
           i.o, i.outcome, i.delay_ms, i.message, i.reason, c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.lane_seq,
           r.kind, r.queue, r.priority, r.shard, r.args, r.metadata, r.tags, r.errors, r.max_attempts, r.created_at, r.run_at,
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
           o.new_state = 'failed' AND dlq_enabled(o.queue) AS to_dlq,
           CASE WHEN o.outcome = 'fail' THEN 'terminal_error' ELSE coalesce(o.reason, 'max_attempts_exhausted') END AS dlq_reason,
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
    FROM resolved r WHERE r.new_state IN ('completed', 'failed', 'cancelled') AND NOT r.to_dlq
  ),
  ins_dlq AS (
    INSERT INTO dlq (job_id, kind, queue, priority, args, metadata, tags, errors, progress, attempt, max_attempts,
                     original_run_lease, run_at, created_at, dlq_at, dlq_reason, unique_key, unique_states)
    SELECT r.job_id, r.kind, r.queue, r.priority, r.args, r.metadata, r.tags, coalesce(r.new_errors, r.errors), r.progress,
           r.attempt, r.max_attempts, r.run_lease, r.run_at, r.created_at, v_now, r.dlq_reason, r.unique_key, r.unique_states
    FROM resolved r WHERE r.to_dlq
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


-- rescue, as in 0003, tagging its items with the rescue reason for DLQ routing.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.rescue(p_kind text, p_staleness_ms bigint, p_limit int)
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
             'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'heartbeat stale: worker presumed dead',
             'reason', 'stale_heartbeat'))
      INTO v_items FROM cand;
  ELSE
    WITH cand AS (
      SELECT c.job_id, c.run_lease, c.attempt FROM claims c
      WHERE c.deadline_at < now()
        AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
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
    job_id := v_row.j;
    run_lease := v_row.l;
    state := v_row.s;
    RETURN NEXT;
  END LOOP;
END
$$;


-- The job views gain the DLQ as the most current representation (rank 0) and a dlq_reason column.
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
-- retry_from_dlq(id, queue?, priority?, run_at?) -> 'available' | 'scheduled', NULL if not in the DLQ.
-- Locks: per-job lock; then (available) the lane's enqueue lock, blocking, and the current
--        slot's ready child via lock_current_slot.
-- Writes: deletes the dlq row; a ready row (fresh position) or a deferred row with attempt 0 and
--        the original run lease (the next claim increments it: leases never go back); re-takes
--        the unique key when the new state is in its mask (AWU01 if another job holds it, and
--        the whole call rolls back, entry included).
CREATE FUNCTION :AWA_SCHEMA.retry_from_dlq(p_job_id bigint, p_queue text, p_priority int, p_run_at timestamptz)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
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
BEGIN
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  DELETE FROM dlq d WHERE d.job_id = p_job_id RETURNING d.* INTO v_row;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  v_queue := coalesce(p_queue, v_row.queue);
  v_priority := coalesce(p_priority, v_row.priority);
  v_run_at := coalesce(p_run_at, v_now);
  v_state := CASE WHEN v_run_at > v_now THEN 'scheduled' ELSE 'available' END;
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
    VALUES (p_job_id, 'scheduled', v_row.kind, v_queue, v_priority, 0, v_row.args, v_row.metadata, v_row.tags, v_row.errors,
            v_row.progress, 0, v_row.original_run_lease, v_row.max_attempts, v_run_at, v_row.created_at,
            v_row.unique_key, v_row.unique_states);
    RETURN v_state;
  END IF;
  PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_queue, v_priority, 0));
  INSERT INTO lanes (queue, priority, shard) VALUES (v_queue, v_priority, 0) ON CONFLICT DO NOTHING;
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
  INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                     errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
  VALUES (v_ring.slot, v_ring.generation, p_job_id, v_row.kind, v_queue, v_priority, 0, nextval('lane_seq'),
          v_row.args, v_row.metadata, v_row.tags, v_row.errors, v_row.progress, 0, v_row.original_run_lease,
          v_row.max_attempts, v_run_at, v_row.created_at, v_row.unique_key, v_row.unique_states);
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', v_queue);
  RETURN v_state;
END
$$;

-- The DLQ entries a filter selects (NULL = no condition), for reads and bulk actions.
CREATE FUNCTION :AWA_SCHEMA.dlq_matching(p_queue text, p_kind text, p_tag text, p_since timestamptz,
                                          p_until timestamptz, p_before bigint)
RETURNS SETOF :AWA_SCHEMA.dlq
LANGUAGE sql STABLE AS $$
  SELECT d.* FROM :AWA_SCHEMA.dlq d
  WHERE (p_queue IS NULL OR d.queue = p_queue)
    AND (p_kind IS NULL OR d.kind = p_kind)
    AND (p_tag IS NULL OR p_tag = ANY (d.tags))
    AND (p_since IS NULL OR d.dlq_at >= p_since)
    AND (p_until IS NULL OR d.dlq_at < p_until)
    AND (p_before IS NULL OR d.job_id < p_before)
$$;

-- dlq_bulk(action 'retry' | 'purge', filter…) -> how many entries it acted on.
-- Retry goes entry by entry through retry_from_dlq (per-job locks in id order); an entry whose
-- unique key is held elsewhere stays in the DLQ and is not counted. Operator actions across
-- statements can still meet a concurrent retry_job in the opposite lock order; Postgres then
-- aborts one of them with a deadlock error (retryable).
CREATE FUNCTION :AWA_SCHEMA.dlq_bulk(p_action text, p_queue text, p_kind text, p_tag text, p_since timestamptz,
                                      p_until timestamptz, p_before bigint)
RETURNS int
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_id bigint;
  v_count int := 0;
BEGIN
  IF p_action = 'purge' THEN
    WITH gone AS (
      DELETE FROM dlq d WHERE d.job_id IN (SELECT m.job_id FROM dlq_matching(p_queue, p_kind, p_tag, p_since, p_until, p_before) m)
      RETURNING d.job_id, d.unique_key
    ),
    -- a purged job is gone for good: a key it still held (mask with 'failed') is released
    released AS (DELETE FROM unique_claims u USING gone g WHERE u.unique_key = g.unique_key AND u.job_id = g.job_id)
    SELECT count(*) INTO v_count FROM gone;
    RETURN v_count;
  END IF;
  FOR v_id IN SELECT m.job_id FROM dlq_matching(p_queue, p_kind, p_tag, p_since, p_until, p_before) m ORDER BY m.job_id LOOP
    BEGIN
      IF retry_from_dlq(v_id, NULL, NULL, NULL) IS NOT NULL THEN
        v_count := v_count + 1;
      END IF;
    EXCEPTION WHEN SQLSTATE 'AWU01' THEN
      NULL; -- stays in the DLQ
    END;
  END LOOP;
  RETURN v_count;
END
$$;

-- cleanup_dlq(default_retention_ms, batch) -> entries deleted (oldest first, at most batch).
-- DELETE on the plain dlq table: churn proportional to failures on DLQ queues, in bounded batches.
CREATE FUNCTION :AWA_SCHEMA.cleanup_dlq(p_default_retention_ms bigint, p_batch int)
RETURNS int
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_count int;
BEGIN
  WITH old AS (
    SELECT d.job_id FROM dlq d
    LEFT JOIN queue_meta m ON m.queue = d.queue
    WHERE d.dlq_at < now() - coalesce(m.dlq_retention, p_default_retention_ms * interval '1 millisecond')
    ORDER BY d.dlq_at LIMIT p_batch
    FOR UPDATE OF d SKIP LOCKED
  ),
  gone AS (DELETE FROM dlq d USING old WHERE d.job_id = old.job_id RETURNING d.job_id, d.unique_key),
  released AS (DELETE FROM unique_claims u USING gone g WHERE u.unique_key = g.unique_key AND u.job_id = g.job_id)
  SELECT count(*) INTO v_count FROM gone;
  RETURN v_count;
END
$$;

-- drain_queue(queue, reason) -> jobs cancelled: everything of the queue not yet running
-- (available, scheduled, retryable), each through cancel_job and its locks.
CREATE FUNCTION :AWA_SCHEMA.drain_queue(p_queue text, p_reason text)
RETURNS int
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_id bigint;
  v_count int := 0;
BEGIN
  FOR v_id IN
    SELECT j.job_id FROM jobs j WHERE j.queue = p_queue AND j.state IN ('available', 'scheduled', 'retryable') ORDER BY j.job_id
  LOOP
    IF cancel_job(v_id, p_reason) = 'cancelled' THEN
      v_count := v_count + 1;
    END IF;
  END LOOP;
  RETURN v_count;
END
$$;

-- retry_job, as in 0003, but a job in the DLQ is retried out of it.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.retry_job_or_dlq(p_job_id bigint)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM dlq d WHERE d.job_id = p_job_id) THEN
    RETURN retry_from_dlq(p_job_id, NULL, NULL, NULL);
  END IF;
  RETURN retry_job(p_job_id);
END
$$;

DO $$
DECLARE f record;
BEGIN
  FOR f IN SELECT p.oid::regprocedure AS sig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = ':AWA_SCHEMA' LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f.sig);
  END LOOP;
END
$$;
