-- 0054: finalize_completions and finalize read each item's claim once, and its ready row and
-- closure in the claim's slot only (issue 17: the completion is a third of a drain's server time).
--
-- Until now the statement that locks the batch's claims rows (FOR NO KEY UPDATE) discarded them,
-- and the completion statement read them again; it also looked for each job's ready row and
-- closures in every live slot of the ring, by job id. A backlog spread over four slots made
-- finalize_completions(100) ~35 % dearer than one in a single slot (1.26 → 1.71 ms in one backend,
-- bench/src/finalizeCost.ts; docs/benchmarks.md, "Completions in their claims' slots"; 1.41–1.53 ms
-- after this migration). Now the locking statement keeps the
-- rows it locked (an array of claims rows: claims rows are never updated, so the locked version is
-- the row), and the ready rows and closures are read in the slots those rows lie in: a claims row
-- is written in its ready row's slot, prune carries it with its ready row, and its closure is
-- written in its slot by finalize and finalize_completions, the only writers of closures.
--
-- Locks, guards and writes: unchanged (0049's). The claims rows are locked in (job_id, run_lease)
-- order, read again until the slot ranges hold still; the closures are still read in the
-- completion statement, after the locks (a finalizer that held a row lock before us committed its
-- closure, which that statement's snapshot sees). An attempt is applied when its claims row is in
-- those ranges, has no closure and, for an item with a stale_before, no heartbeat since; closures,
-- narrow terminal rows, attempt_state deleted, unique keys released or entered by their mask.
--
-- Functions: finalize_completions and finalize (0049's texts; lines marked 0054). finalize's
-- general statement (retries, failures, snoozes, cancels, releases) reads the same three sets and
-- takes the same change.

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.finalize_completions(p_job_ids bigint[], p_run_leases bigint[], p_stale_before timestamptz[] DEFAULT NULL)
 RETURNS TABLE(ord integer, applied boolean, state text)
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
 SET enable_nestloop = off SET jit = off
AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_ids bigint[];
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
  v_now_lo1 int; -- 0028
  v_now_hi1 int; -- 0028
  v_now_lo2 int; -- 0028
  v_now_hi2 int; -- 0028
  v_claims claims[]; -- 0054: the batch's claims rows, as locked
  v_slo1 int; -- 0054: the smallest and largest slot they lie in, in each of the two ranges
  v_shi1 int; -- 0054
  v_slo2 int; -- 0054
  v_shi2 int; -- 0054
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'finalize needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF cardinality(p_job_ids) IS DISTINCT FROM cardinality(p_run_leases)
     OR cardinality(p_stale_before) > cardinality(p_job_ids) THEN
    RAISE EXCEPTION 'finalize_completions needs one run lease (and at most one stale_before) per job id (got %, %, %)',
      cardinality(p_job_ids), cardinality(p_run_leases), cardinality(p_stale_before)
      USING ERRCODE = '22023';
  END IF;
  SELECT array_agg(DISTINCT i.job_id) INTO v_ids FROM unnest(p_job_ids) AS i(job_id);
  IF v_ids IS NULL THEN
    RETURN;
  END IF;
  -- 0049: finalize's loop, written out here too (a PL/pgSQL function of its own that both call
  -- cost 36 µs per call, a quarter of a one-job call). 0028: the batch's claims rows, locked FOR NO KEY UPDATE in (job_id, run_lease) order, where
  -- each attempt took an advisory lock (one shared lock-table entry each until commit; a row lock
  -- lives in the tuple header: a lock-only xmax, no dead tuple). Prune tries the same rows (FOR
  -- UPDATE NOWAIT) before it carries or truncates, heartbeat locks them as we do, so once we hold
  -- them they stay in these slots. A prune that committed between our range read and our lock
  -- statement may have carried some, and it changed the ranges: read them again, lock in the new
  -- ranges, until they hold still. After the loop each claim is in a slot of these ranges, or
  -- gone with its pruned slot (stale either way).
  LOOP -- 0028
    SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_lo1, v_hi1, v_lo2, v_hi2 FROM queue_slot_ranges() s;
    v_claims := ARRAY(SELECT c FROM claims c -- 0054: kept, not read again below
                      WHERE c.job_id = ANY (v_ids) AND (c.slot BETWEEN v_lo1 AND v_hi1 OR c.slot BETWEEN v_lo2 AND v_hi2)
                      ORDER BY c.job_id, c.run_lease
                      FOR NO KEY UPDATE OF c);
    SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_now_lo1, v_now_hi1, v_now_lo2, v_now_hi2 FROM queue_slot_ranges() s; -- 0028
    EXIT WHEN v_now_lo1 = v_lo1 AND v_now_hi1 = v_hi1 AND v_now_lo2 = v_lo2 AND v_now_hi2 = v_hi2; -- 0028
  END LOOP;
  -- 0054: their ready rows and their closures lie in their slots (a claims row is written in its
  -- ready row's slot, carried with it, and closed in its own slot), so the statement below looks
  -- for them there only, not in every live slot: from the first to the last slot holding one of
  -- them, in each of the two ranges (the ring's order). Written as the ranges were, two ranges
  -- joined by OR: a single range is also an index condition on ready's primary key (slot is its
  -- last column), and a generic plan made while a child was empty chose a scan of that whole
  -- index over the job_id index (a drain's finalize 2-5× slower).
  SELECT min(c.slot) FILTER (WHERE c.slot BETWEEN v_lo1 AND v_hi1), max(c.slot) FILTER (WHERE c.slot BETWEEN v_lo1 AND v_hi1), -- 0054
         min(c.slot) FILTER (WHERE c.slot BETWEEN v_lo2 AND v_hi2), max(c.slot) FILTER (WHERE c.slot BETWEEN v_lo2 AND v_hi2) -- 0054
    INTO v_slo1, v_shi1, v_slo2, v_shi2 FROM unnest(v_claims) c; -- 0054

  RETURN QUERY
  WITH items AS MATERIALIZED (
    -- 0049: the items from the arrays (a missing or shorter p_stale_before pads with NULL)
    SELECT x.o::int AS o, x.job_id, x.run_lease, x.stale_before -- 0049
    FROM unnest(p_job_ids, p_run_leases, p_stale_before) WITH ORDINALITY AS x(job_id, run_lease, stale_before, o) -- 0049
  ),
  batch_claims AS MATERIALIZED ( -- 0054: the rows locked above (claims rows are never updated)
    SELECT c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.queue, c.priority, c.shard, c.lane_seq
    FROM unnest(v_claims) c -- 0054
  ),
  batch_ready AS MATERIALIZED (
    SELECT r.slot, r.job_id, r.queue, r.priority, r.shard, r.lane_seq, r.unique_key, r.unique_states
    FROM ready r WHERE r.job_id = ANY (v_ids)
      AND (r.slot BETWEEN v_slo1 AND v_shi1 OR r.slot BETWEEN v_slo2 AND v_shi2) -- 0054
  ),
  batch_closures AS MATERIALIZED (
    SELECT z.job_id, z.run_lease FROM closures z WHERE z.job_id = ANY (v_ids)
      AND (z.slot BETWEEN v_slo1 AND v_shi1 OR z.slot BETWEEN v_slo2 AND v_shi2) -- 0054
  ),
  done AS MATERIALIZED (
    SELECT DISTINCT ON (i.job_id, i.run_lease)
           i.o, c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.lane_seq, r.unique_key, r.unique_states,
           a.found AS has_state,
           -- a completion enters the unique mask when the mask omits 'running' and holds 'completed'
           (r.unique_key IS NOT NULL AND (r.unique_states & 4) = 0 AND (r.unique_states & state_bit('completed')) <> 0) AS enters
    FROM items i
    JOIN batch_claims c ON c.job_id = i.job_id AND c.run_lease = i.run_lease
    JOIN batch_ready r ON r.slot = c.slot AND r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard
                      AND r.lane_seq = c.lane_seq
    LEFT JOIN LATERAL (
      SELECT a.heartbeat_at, true AS found FROM attempt_state a
      WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease LIMIT 1
    ) a ON true
    WHERE NOT EXISTS (SELECT 1 FROM batch_closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease)
      AND (i.stale_before IS NULL OR a.heartbeat_at IS NULL OR a.heartbeat_at < i.stale_before)
    ORDER BY i.job_id, i.run_lease, i.o
  ),
  -- a finished job takes its key if it is free, and keeps its end (as the general statement)
  take_key AS (
    INSERT INTO unique_claims (unique_key, job_id)
    SELECT DISTINCT ON (d.unique_key) d.unique_key, d.job_id FROM done d WHERE d.enters ORDER BY d.unique_key, d.job_id
    ON CONFLICT (unique_key) DO NOTHING
  ),
  ins_closures AS (
    INSERT INTO closures (slot, generation, job_id, run_lease, outcome, closed_at)
    SELECT d.slot, d.generation, d.job_id, d.run_lease, 'completed', v_now FROM done d
  ),
  ins_terminal AS (
    INSERT INTO terminal (slot, generation, job_id, run_lease, lane_seq, state, attempt, finalized_at, errors, progress)
    SELECT d.slot, d.generation, d.job_id, d.run_lease, d.lane_seq, 'completed', d.attempt, v_now, NULL, NULL FROM done d
  ),
  del_state AS (
    DELETE FROM attempt_state a USING done d
    WHERE d.has_state AND a.job_id = d.job_id AND a.run_lease = d.run_lease
  ),
  rel_unique AS (
    DELETE FROM unique_claims u USING done d
    WHERE d.unique_key IS NOT NULL AND u.unique_key = d.unique_key AND u.job_id = d.job_id
      AND (d.unique_states & state_bit('completed')) = 0
  )
  SELECT i.o, d.o IS NOT NULL, CASE WHEN d.o IS NOT NULL THEN 'completed' END
  FROM items i LEFT JOIN done d ON d.o = i.o
  ORDER BY i.o;
END
$$;

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.finalize(p_items jsonb)
 RETURNS TABLE(ord integer, applied boolean, state text)
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
 SET enable_nestloop = off SET jit = off
AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_ids bigint[];
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
  v_now_lo1 int; -- 0028
  v_now_hi1 int; -- 0028
  v_now_lo2 int; -- 0028
  v_now_hi2 int; -- 0028
  v_claims claims[]; -- 0054: the batch's claims rows, as locked
  v_slo1 int; -- 0054: the smallest and largest slot they lie in, in each of the two ranges
  v_shi1 int; -- 0054
  v_slo2 int; -- 0054
  v_shi2 int; -- 0054
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'finalize needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  -- 0038: a batch of completions only (the runtime's every-day batch) takes a statement of its
  -- own, 0049: finalize_completions, which takes the items as arrays (the runtime calls it
  -- directly). It locks the batch's claims rows as below.
  IF NOT EXISTS (SELECT 1 FROM jsonb_to_recordset(p_items) AS x(outcome text) WHERE x.outcome IS DISTINCT FROM 'complete') THEN -- 0038
    RETURN QUERY -- 0049
    SELECT f.ord, f.applied, f.state -- 0049
    FROM (SELECT array_agg(x.job_id ORDER BY x_e.o) AS ids, array_agg(x.run_lease ORDER BY x_e.o) AS leases, -- 0049
                 array_agg(x.stale_before ORDER BY x_e.o) AS stale -- 0049: the items read once
          FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x_e(v, o), -- 0049
               jsonb_to_record(x_e.v) AS x(job_id bigint, run_lease bigint, stale_before timestamptz)) a -- 0049
    CROSS JOIN LATERAL finalize_completions(a.ids, a.leases, a.stale) f; -- 0049
    RETURN; -- 0049
  END IF; -- 0038
  SELECT array_agg(DISTINCT i.job_id) INTO v_ids FROM jsonb_to_recordset(p_items) AS i(job_id bigint); -- 0028
  -- 0028: the batch's claims rows, locked FOR NO KEY UPDATE in (job_id, run_lease) order, where
  -- each attempt took an advisory lock (one shared lock-table entry each until commit; a row lock
  -- lives in the tuple header: a lock-only xmax, no dead tuple). Prune tries the same rows (FOR
  -- UPDATE NOWAIT) before it carries or truncates, heartbeat locks them as we do, so once we hold
  -- them they stay in these slots. A prune that committed between our range read and our lock
  -- statement may have carried some, and it changed the ranges: read them again, lock in the new
  -- ranges, until they hold still. After the loop each claim is in a slot of these ranges, or
  -- gone with its pruned slot (stale either way).
  LOOP -- 0028
    SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_lo1, v_hi1, v_lo2, v_hi2 FROM queue_slot_ranges() s;
    v_claims := ARRAY(SELECT c FROM claims c -- 0054: kept, not read again below
                      WHERE c.job_id = ANY (v_ids) AND (c.slot BETWEEN v_lo1 AND v_hi1 OR c.slot BETWEEN v_lo2 AND v_hi2)
                      ORDER BY c.job_id, c.run_lease
                      FOR NO KEY UPDATE OF c);
    SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_now_lo1, v_now_hi1, v_now_lo2, v_now_hi2 FROM queue_slot_ranges() s; -- 0028
    EXIT WHEN v_now_lo1 = v_lo1 AND v_now_hi1 = v_hi1 AND v_now_lo2 = v_lo2 AND v_now_hi2 = v_hi2; -- 0028
  END LOOP;
  -- 0054: their ready rows and closures are read in their slots only, as in finalize_completions
  SELECT min(c.slot) FILTER (WHERE c.slot BETWEEN v_lo1 AND v_hi1), max(c.slot) FILTER (WHERE c.slot BETWEEN v_lo1 AND v_hi1), -- 0054
         min(c.slot) FILTER (WHERE c.slot BETWEEN v_lo2 AND v_hi2), max(c.slot) FILTER (WHERE c.slot BETWEEN v_lo2 AND v_hi2) -- 0054
    INTO v_slo1, v_shi1, v_slo2, v_shi2 FROM unnest(v_claims) c; -- 0054

  RETURN QUERY
  WITH items AS MATERIALIZED (
    SELECT x_e.o::int AS o, x.job_id, x.run_lease, x.outcome, coalesce(x.delay_ms, 0) AS delay_ms, x.message, x.reason,
           x.stale_before, x.progress -- 0022
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x_e(v, o),
         jsonb_to_record(x_e.v) AS x(job_id bigint, run_lease bigint, outcome text, delay_ms bigint, message text, reason text,
                                     stale_before timestamptz, progress jsonb) -- 0022
  ),
  batch_claims AS MATERIALIZED ( -- 0054: the rows locked above (claims rows are never updated)
    SELECT c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.queue, c.priority, c.shard, c.lane_seq
    FROM unnest(v_claims) c -- 0054
  ),
  batch_ready AS MATERIALIZED (
    SELECT r.slot, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata, r.tags, r.errors,
           r.max_attempts, r.created_at, r.run_at, r.unique_key, r.unique_states, r.progress
    FROM ready r WHERE r.job_id = ANY (v_ids)
      AND (r.slot BETWEEN v_slo1 AND v_shi1 OR r.slot BETWEEN v_slo2 AND v_shi2) -- 0054
  ),
  batch_closures AS MATERIALIZED (
    SELECT z.job_id, z.run_lease FROM closures z WHERE z.job_id = ANY (v_ids)
      AND (z.slot BETWEEN v_slo1 AND v_shi1 OR z.slot BETWEEN v_slo2 AND v_shi2) -- 0054
  ),
  open AS (
    SELECT DISTINCT ON (i.job_id, i.run_lease)
           i.o, i.outcome AS outcome0, i.delay_ms, i.message AS message0, i.reason, c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.lane_seq,
           r.kind, r.queue, r.priority, r.shard, r.args, r.metadata, r.tags, r.errors, r.max_attempts, r.created_at, r.run_at,
           r.unique_key, r.unique_states, /* 0022: the outcome's progress first */ coalesce(i.progress, a.progress, r.progress) AS progress, a.found AS has_state,
           CASE i.outcome
             WHEN 'complete' THEN 'completed'
             WHEN 'cancel' THEN 'cancelled'
             WHEN 'fail' THEN 'failed'
             WHEN 'snooze' THEN 'scheduled'
             WHEN 'retry' THEN CASE WHEN c.attempt >= r.max_attempts THEN 'failed' ELSE 'retryable' END
             -- 0023: shutdown's release is a retry that never exhausts
             WHEN 'release' THEN 'retryable'
           END AS new_state0
    FROM items i
    JOIN batch_claims c ON c.job_id = i.job_id AND c.run_lease = i.run_lease
    -- the claimed row by its full key: lane_seq, not run_lease, is unique per ready row (a cancelled
    -- and then retried job has two ready rows with the same lease)
    JOIN batch_ready r ON r.slot = c.slot AND r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard
                      AND r.lane_seq = c.lane_seq
    LEFT JOIN LATERAL (
      SELECT a.progress, a.heartbeat_at, true AS found FROM attempt_state a
      WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease LIMIT 1
    ) a ON true
    WHERE NOT EXISTS (SELECT 1 FROM batch_closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease)
      -- a stale rescue yields to a heartbeat that committed after its scan (we hold the attempt's claims row, 0028)
      AND (i.stale_before IS NULL OR a.heartbeat_at IS NULL OR a.heartbeat_at < i.stale_before)
    ORDER BY i.job_id, i.run_lease, i.o
  ),
  -- Re-entry into the unique mask (capabilities.md §4): a job whose mask omits 'running' takes
  -- its key again when its new state is in the mask; if a newer job holds it and the new state is
  -- retryable or scheduled, this one gives way (cancelled, 'superseded by duplicate <id>'), as in
  -- the simulation. Default masks hold 'running': nothing enters.
  keyed AS MATERIALIZED (
    SELECT o.*, (o.unique_key IS NOT NULL AND (o.unique_states & 4) = 0
                 AND (o.unique_states & state_bit(o.new_state0)) <> 0) AS enters
    FROM open o
  ),
  take_key AS (
    INSERT INTO unique_claims (unique_key, job_id)
    SELECT DISTINCT ON (k.unique_key) k.unique_key, k.job_id FROM keyed k WHERE k.enters ORDER BY k.unique_key, k.job_id
    ON CONFLICT (unique_key) DO NOTHING
    RETURNING job_id
  ),
  settled AS MATERIALIZED (
    SELECT k.*, CASE WHEN s.superseded THEN 'cancel' ELSE k.outcome0 END AS outcome,
           CASE WHEN s.superseded THEN 'superseded by duplicate ' || coalesce(s.holder::text, 'job') ELSE k.message0 END AS message,
           CASE WHEN s.superseded THEN 'cancelled' ELSE k.new_state0 END AS new_state
    FROM keyed k
    CROSS JOIN LATERAL (
      -- only a live state gives way; a finished job takes the key if it is free, and keeps its end
      SELECT CASE WHEN k.enters AND k.new_state0 IN ('retryable', 'scheduled') THEN NOT EXISTS (SELECT 1 FROM take_key t WHERE t.job_id = k.job_id)
                                 AND NOT EXISTS (SELECT 1 FROM unique_claims u WHERE u.unique_key = k.unique_key AND u.job_id = k.job_id)
                  ELSE false END AS superseded,
             CASE WHEN k.enters THEN (SELECT u.job_id FROM unique_claims u WHERE u.unique_key = k.unique_key) END AS holder
    ) s
  ),
  resolved AS MATERIALIZED (
    SELECT o.*,
           o.new_state = 'failed' AND dlq_enabled(o.queue) AS to_dlq,
           CASE WHEN o.outcome = 'fail' THEN 'terminal_error' ELSE coalesce(o.reason, 'max_attempts_exhausted') END AS dlq_reason,
           -- 0023: 'release' records its error entry like 'retry' (never terminal: its state is retryable)
           CASE WHEN o.outcome IN ('retry', 'fail', 'release') THEN
                  append_error(o.errors, jsonb_strip_nulls(jsonb_build_object('error', o.message, 'attempt', o.attempt, 'at', v_now,
                                         'terminal', CASE WHEN o.new_state = 'failed' THEN true END)))
                WHEN o.outcome = 'cancel' THEN
                  append_error(o.errors, jsonb_build_object('error', 'cancelled: ' || o.message, 'attempt', o.attempt, 'at', v_now))
           END AS new_errors
    FROM settled o
  ),
  -- The two plain tables keyed by job_id come first; what they did not take is not applied.
  ins_dlq AS (
    INSERT INTO dlq AS d (job_id, kind, queue, priority, args, metadata, tags, errors, progress, attempt, max_attempts,
                          original_run_lease, run_at, created_at, dlq_at, dlq_reason, unique_key, unique_states)
    SELECT DISTINCT ON (r.job_id)
           r.job_id, r.kind, r.queue, r.priority, r.args, r.metadata, r.tags, coalesce(r.new_errors, r.errors), r.progress,
           r.attempt, r.max_attempts, r.run_lease, r.run_at, r.created_at, v_now, r.dlq_reason, r.unique_key, r.unique_states
    FROM resolved r WHERE r.to_dlq
    ORDER BY r.job_id, r.run_lease DESC
    ON CONFLICT (job_id) DO UPDATE
      SET kind = excluded.kind, queue = excluded.queue, priority = excluded.priority, args = excluded.args,
          metadata = excluded.metadata, tags = excluded.tags, errors = excluded.errors, progress = excluded.progress,
          attempt = excluded.attempt, max_attempts = excluded.max_attempts, original_run_lease = excluded.original_run_lease,
          run_at = excluded.run_at, created_at = excluded.created_at, dlq_at = excluded.dlq_at,
          dlq_reason = excluded.dlq_reason, unique_key = excluded.unique_key, unique_states = excluded.unique_states
      WHERE d.original_run_lease < excluded.original_run_lease
    RETURNING d.job_id, d.original_run_lease AS run_lease
  ),
  ins_deferred AS (
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, progress, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT DISTINCT ON (r.job_id)
           r.job_id, r.new_state, r.kind, r.queue, r.priority, r.shard, r.args, r.metadata, r.tags,
           coalesce(r.new_errors, r.errors), r.progress,
           -- 0023: a released attempt is not counted, as a snoozed one
           CASE WHEN r.new_state = 'scheduled' OR r.outcome = 'release' THEN r.attempt - 1 ELSE r.attempt END,
           r.run_lease, r.max_attempts, v_now + r.delay_ms * interval '1 millisecond', r.created_at, r.unique_key, r.unique_states
    FROM resolved r WHERE r.new_state IN ('retryable', 'scheduled')
    ORDER BY r.job_id, r.run_lease DESC
    ON CONFLICT (job_id) DO NOTHING
    RETURNING job_id, run_lease
  ),
  done AS (
    SELECT r.* FROM resolved r
    WHERE CASE WHEN r.to_dlq THEN EXISTS (SELECT 1 FROM ins_dlq x WHERE x.job_id = r.job_id AND x.run_lease = r.run_lease)
               WHEN r.new_state IN ('retryable', 'scheduled')
                 THEN EXISTS (SELECT 1 FROM ins_deferred x WHERE x.job_id = r.job_id AND x.run_lease = r.run_lease)
               ELSE true END
  ),
  ins_closures AS (
    INSERT INTO closures (slot, generation, job_id, run_lease, outcome, closed_at)
    SELECT r.slot, r.generation, r.job_id, r.run_lease, r.new_state, v_now FROM done r
  ),
  ins_terminal AS (
    INSERT INTO terminal (slot, generation, job_id, run_lease, lane_seq, state, attempt, finalized_at, errors, progress)
    SELECT r.slot, r.generation, r.job_id, r.run_lease, r.lane_seq, r.new_state, r.attempt, v_now, r.new_errors,
           CASE WHEN r.new_state = 'completed' THEN NULL ELSE r.progress END
    FROM done r WHERE r.new_state IN ('completed', 'failed', 'cancelled') AND NOT r.to_dlq
  ),
  -- Primary-key probes, only for attempts that had a row (read above): most attempts never
  -- heartbeat, so most batches delete nothing and probe nothing.
  del_state AS (
    DELETE FROM attempt_state a USING done r
    WHERE r.has_state AND a.job_id = r.job_id AND a.run_lease = r.run_lease
  ),
  rel_unique AS (
    DELETE FROM unique_claims u USING done r
    WHERE r.unique_key IS NOT NULL AND u.unique_key = r.unique_key AND u.job_id = r.job_id
      AND (r.unique_states & state_bit(r.new_state)) = 0
  )
  SELECT i.o, r.o IS NOT NULL, r.new_state
  FROM items i LEFT JOIN done r ON r.o = i.o
  ORDER BY i.o;
END
$$;
