-- 0057: a completed attempt's closure is its terminal record (issue 17; ADR 0014's option 2 for
-- completions, docs/adr/0014-hot-path-rows-per-job.md, the 2026-12-05 updates).
--
-- finalize_completions (the completion batcher's statement, which takes nearly every completion)
-- wrote two rows per completed attempt: its closure and a narrow terminal row (state 'completed',
-- the attempt, lane_seq, finalized_at; no errors, no progress: a completion clears them). The
-- terminal insert was the completion's largest per-job write: ~2.6-4 µs of the ~23 µs a claim(200)
-- and its completion cost the server per job (pgbench on Debian's 15, copies of the function side
-- by side; docs/benchmarks.md, "A completion without its terminal row").
--
-- So the closure carries the two columns the terminal row had that the closure lacked, attempt and
-- lane_seq (from the claims row the completion locked), and finalize_completions writes no
-- terminal row. The view terminal_records is what read terminal before: terminal's rows, and for
-- every closure with a lane_seq, the narrow row finalize_completions wrote before (state
-- 'completed', finalized_at = closed_at, errors and progress NULL, not wide). Only
-- finalize_completions writes a closure's lane_seq: finalize's general statement (a batch with
-- retries, failures or cancels) still writes a terminal row beside each closure of a finished
-- attempt, with lane_seq NULL, and closures written before this migration have it NULL with their
-- terminal rows beside them. So each attempt is read once, from one of the two, before and after
-- the upgrade, and a slot's count of terminal_records only grows (append-only tables), as its count
-- of terminal rows did: prune's copy-ahead check (the count the copy saw, 0013) still holds.
-- Joining the claims row instead of widening the closure cost prune ~3 µs per job (its judging and
-- its count, 20,000 completed jobs: 277 → 334 ms), most of what the completion saved.
--
-- Readers moved to the view: job_representations (so jobs), queue_stats, and both prune_queue
-- bodies (judging, the copy-ahead count, the history copy). Not moved, because they read rows a
-- completion never wrote: sample_queue_stats and the storage layer's unique-key lookup (wide rows
-- only), retry_job (failed and cancelled jobs only), rotate (the current slot's idleness: its
-- ready rows and marks answer for its completions; the next slot's emptiness: its closures).
--
-- Locks, guards and writes: the ALTER takes closures and its children exclusively for a moment
-- (nullable columns without a default write no row). finalize_completions as 0055's: a completed
-- attempt is applied under the same guard (its claims row locked in the live ranges, no closure,
-- no heartbeat since stale_before) and writes its closure with two more columns, and no terminal
-- row. The view writes nothing.
--
-- Functions: finalize_completions (0055's text), queue_stats (0037's), prune_queue with 8 and with
-- 4 arguments (0053's), the view job_representations (0034's text); lines marked 0057.

ALTER TABLE :AWA_SCHEMA.closures ADD COLUMN attempt integer, ADD COLUMN lane_seq bigint;

CREATE VIEW :AWA_SCHEMA.terminal_records AS
  SELECT t.slot, t.generation, t.job_id, t.run_lease, t.lane_seq, t.state, t.attempt, t.finalized_at, t.errors,
         t.progress, t.wide, t.kind, t.queue, t.priority, t.args, t.metadata, t.tags, t.max_attempts, t.run_at,
         t.created_at, t.unique_key, t.unique_states
  FROM :AWA_SCHEMA.terminal t
UNION ALL
  -- a completed attempt closed by finalize_completions since 0057: the narrow row it wrote before
  SELECT z.slot, z.generation, z.job_id, z.run_lease, z.lane_seq, 'completed'::text, z.attempt, z.closed_at, NULL::jsonb,
         NULL::jsonb, false, NULL::text, NULL::text, NULL::smallint, NULL::jsonb, NULL::jsonb, NULL::text[], NULL::integer,
         NULL::timestamptz, NULL::timestamptz, NULL::bytea, NULL::integer
  FROM :AWA_SCHEMA.closures z
  WHERE z.lane_seq IS NOT NULL;

-- ---------------------------------------------------------------------------------------------
-- The job views: 0034's text, the terminal branch reading terminal_records (line marked 0057).
CREATE OR REPLACE VIEW :AWA_SCHEMA.job_representations AS
  SELECT q.job_id, 0 AS rank, 'failed'::text AS state, q.kind, q.queue, q.priority, q.args, q.metadata, q.tags, q.errors,
         q.progress, q.attempt, q.max_attempts, q.original_run_lease AS run_lease, q.run_at, q.created_at,
         q.dlq_at AS finalized_at, q.dlq_reason
  FROM :AWA_SCHEMA.dlq q
UNION ALL
  SELECT d.job_id, 1 AS rank, d.state, d.kind, d.queue, d.priority, d.args, d.metadata, d.tags, d.errors, d.progress,
         d.attempt, d.max_attempts, d.run_lease, d.run_at, d.created_at, NULL::timestamptz AS finalized_at, NULL
  FROM :AWA_SCHEMA.deferred d
UNION ALL
  SELECT c.job_id, 2,
         CASE WHEN a.callback_waiting AND a.callback_state = 'pending' THEN 'waiting_external' ELSE 'running' END, -- 0034
         r.kind, r.queue, r.priority, r.args, r.metadata, r.tags, r.errors,
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
  FROM :AWA_SCHEMA.terminal_records t -- 0057
  LEFT JOIN :AWA_SCHEMA.ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
UNION ALL
  SELECT h.job_id, 4, h.state, h.kind, h.queue, h.priority, h.args, h.metadata, h.tags, h.errors, h.progress,
         h.attempt, h.max_attempts, h.run_lease, h.run_at, h.created_at, h.finalized_at, NULL
  FROM :AWA_SCHEMA.history h;

-- finalize_completions: 0055's text, lines marked 0057.
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
  v_unique_ids bigint[]; -- 0055: the jobs whose ready row is read (see the header)
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
  -- index over the job_id index (a drain's finalize 2-5× slower). 0055: and the jobs whose ready
  -- rows are read: those whose claim does not say the job has no unique key.
  SELECT min(c.slot) FILTER (WHERE c.slot BETWEEN v_lo1 AND v_hi1), max(c.slot) FILTER (WHERE c.slot BETWEEN v_lo1 AND v_hi1), -- 0054
         min(c.slot) FILTER (WHERE c.slot BETWEEN v_lo2 AND v_hi2), max(c.slot) FILTER (WHERE c.slot BETWEEN v_lo2 AND v_hi2), -- 0054
         array_agg(c.job_id) FILTER (WHERE c.without_unique_key IS NOT TRUE) -- 0055
    INTO v_slo1, v_shi1, v_slo2, v_shi2, v_unique_ids FROM unnest(v_claims) c; -- 0054, 0055

  RETURN QUERY
  WITH items AS MATERIALIZED (
    -- 0049: the items from the arrays (a missing or shorter p_stale_before pads with NULL)
    SELECT x.o::int AS o, x.job_id, x.run_lease, x.stale_before -- 0049
    FROM unnest(p_job_ids, p_run_leases, p_stale_before) WITH ORDINALITY AS x(job_id, run_lease, stale_before, o) -- 0049
  ),
  batch_claims AS MATERIALIZED ( -- 0054: the rows locked above (claims rows are never updated)
    SELECT c.slot, c.generation, c.job_id, c.run_lease, c.attempt, c.queue, c.priority, c.shard, c.lane_seq,
           c.without_unique_key -- 0055
    FROM unnest(v_claims) c -- 0054
  ),
  batch_ready AS MATERIALIZED ( -- 0055: only the rows that may hold a unique key
    SELECT r.slot, r.job_id, r.queue, r.priority, r.shard, r.lane_seq, r.unique_key, r.unique_states
    FROM ready r WHERE r.job_id = ANY (v_unique_ids) -- 0055
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
    LEFT JOIN batch_ready r ON r.slot = c.slot AND r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard
                           AND r.lane_seq = c.lane_seq -- 0055: LEFT, see the WHERE
    LEFT JOIN LATERAL (
      SELECT a.heartbeat_at, true AS found FROM attempt_state a
      WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease LIMIT 1
    ) a ON true
    -- 0055: a claim without the flag needs its ready row, as before (a claims row lies in its
    -- ready row's slot, so the row is there for every claim of the batch)
    WHERE (c.without_unique_key OR r.job_id IS NOT NULL) -- 0055
      AND NOT EXISTS (SELECT 1 FROM batch_closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease)
      AND (i.stale_before IS NULL OR a.heartbeat_at IS NULL OR a.heartbeat_at < i.stale_before)
    ORDER BY i.job_id, i.run_lease, i.o
  ),
  -- a finished job takes its key if it is free, and keeps its end (as the general statement)
  take_key AS (
    INSERT INTO unique_claims (unique_key, job_id)
    SELECT DISTINCT ON (d.unique_key) d.unique_key, d.job_id FROM done d WHERE d.enters ORDER BY d.unique_key, d.job_id
    ON CONFLICT (unique_key) DO NOTHING
  ),
  -- 0057: the closure is the completed attempt's terminal record (terminal_records): no terminal row
  ins_closures AS (
    INSERT INTO closures (slot, generation, job_id, run_lease, outcome, closed_at, attempt, lane_seq) -- 0057
    SELECT d.slot, d.generation, d.job_id, d.run_lease, 'completed', v_now, d.attempt, d.lane_seq FROM done d -- 0057
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
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.finalize_completions(bigint[], bigint[], timestamptz[]) FROM PUBLIC;

-- queue_stats: 0037's text, the line marked 0057.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.queue_stats(p_window_ms bigint)
 RETURNS TABLE(queue text, paused boolean, available bigint, running bigint, scheduled bigint, retryable bigint, dead_lettered bigint, oldest_available_at timestamp with time zone, completed_total bigint, failed_total bigint, cancelled_total bigint, recent_completed bigint, recent_failed bigint, recent_cancelled bigint, window_start timestamp with time zone, as_of timestamp with time zone)
 LANGUAGE plpgsql
 STABLE
 SET search_path = :AWA_SCHEMA, pg_catalog SET plan_cache_mode = force_generic_plan SET jit = off
AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH rng AS MATERIALIZED (SELECT s.lo1, s.hi1, s.lo2, s.hi2 FROM queue_slot_ranges() s),
  cursors AS MATERIALIZED (
    -- = lane_cursor(queue, priority, shard), inline: a function call per lane plans its query again
    SELECT l.queue, l.priority, l.shard,
           coalesce((SELECT m.next_lane_seq FROM claim_marks m
                     WHERE m.queue = l.queue AND m.priority = l.priority AND m.shard = l.shard
                     ORDER BY m.next_lane_seq DESC LIMIT 1), 0) AS c
    FROM lanes l
  ),
  ready_counts AS (
    SELECT k.queue, sum(n.n - tn.n) AS n, min(h.run_at) AS head_at -- 0037
    FROM cursors k
    -- 0037: the lane's rows from its cursor on, less its tombstones from the cursor on: two range
    -- counts. A tombstone marks exactly one ready row, at its position and in its slot (every
    -- insert of one is for a ready row found at that position, which is then never picked or
    -- tombstoned again). The anti-join it replaces probed the tombstones of all 16 children once
    -- per backlog row when the plan was made before the children had statistics: 1.3 s at
    -- 100,000 available jobs instead of 25 ms, and the leader's stats sample calls this.
    CROSS JOIN LATERAL (
      SELECT count(*) AS n FROM ready r, rng
      WHERE r.queue = k.queue AND r.priority = k.priority AND r.shard = k.shard AND r.lane_seq >= k.c
        AND (r.slot BETWEEN rng.lo1 AND rng.hi1 OR r.slot BETWEEN rng.lo2 AND rng.hi2)
    ) n
    CROSS JOIN LATERAL ( -- 0037
      SELECT count(*) AS n FROM ready_tombstones t, rng
      WHERE t.queue = k.queue AND t.priority = k.priority AND t.shard = k.shard AND t.lane_seq >= k.c
        AND (t.slot BETWEEN rng.lo1 AND rng.hi1 OR t.slot BETWEEN rng.lo2 AND rng.hi2)
    ) tn
    LEFT JOIN LATERAL (
      SELECT r.run_at FROM ready r, rng
      WHERE r.queue = k.queue AND r.priority = k.priority AND r.shard = k.shard AND r.lane_seq >= k.c
        AND (r.slot BETWEEN rng.lo1 AND rng.hi1 OR r.slot BETWEEN rng.lo2 AND rng.hi2)
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          AND t.slot = r.slot AND t.lane_seq >= k.c) -- 0037: its row's slot, past the cursor
      ORDER BY r.lane_seq LIMIT 1
    ) h ON true
    GROUP BY k.queue
  ),
  parked_counts AS (
    SELECT p.queue, count(*) AS n, min(p.run_at) AS head_at FROM parked p GROUP BY p.queue
  ),
  running_counts AS (
    SELECT c.queue, count(*) AS n FROM claims c, rng
    WHERE (c.slot BETWEEN rng.lo1 AND rng.hi1 OR c.slot BETWEEN rng.lo2 AND rng.hi2)
      -- 0037: a closure lives in its claims row's slot (one child probed, not 16)
      AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.slot = c.slot)
    GROUP BY c.queue
  ),
  deferred_counts AS (
    SELECT d.queue, count(*) FILTER (WHERE d.state = 'scheduled') AS scheduled,
           count(*) FILTER (WHERE d.state = 'retryable') AS retryable
    FROM deferred d GROUP BY d.queue
  ),
  dlq_counts AS (SELECT q.queue, count(*) AS n FROM dlq q GROUP BY q.queue),
  -- the rate window: the requested span, or the span the ledger still holds row by row
  win AS MATERIALIZED (
    SELECT greatest(now() - p_window_ms * interval '1 millisecond',
                    CASE WHEN (SELECT t.through_generation FROM ring_ledger_totals t WHERE t.ring = 'queue') >= 0
                         THEN (SELECT min(p.pruned_at) FROM ring_prunes p WHERE p.ring = 'queue') END) AS since
  ),
  -- finalizations in pruned slots: "queue:state" -> count (a queue name may contain ':')
  pruned AS (
    SELECT left(e.key, length(e.key) - length(substring(e.key FROM '[^:]*$')) - 1) AS queue,
           substring(e.key FROM '[^:]*$') AS state, e.value::numeric AS n, x.recent
    FROM (SELECT (ledger_totals('queue')).rollup AS rollup, false AS recent
          UNION ALL
          SELECT p.rollup, true FROM ring_prunes p, win WHERE p.ring = 'queue' AND p.pruned_at >= win.since) x,
         jsonb_each_text(x.rollup) e
  ),
  -- finalizations in unpruned slots (a narrow terminal row takes its queue from its ready row)
  unpruned AS (
    SELECT coalesce(t.queue, r.queue) AS queue, t.state, 1 AS n, t.finalized_at >= win.since AS recent
    FROM terminal_records t -- 0057
    CROSS JOIN rng CROSS JOIN win
    LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
    WHERE (t.slot BETWEEN rng.lo1 AND rng.hi1 OR t.slot BETWEEN rng.lo2 AND rng.hi2)
  ),
  -- a total is the ledger's (every pruned slot) plus every unpruned row; recent is the ledger's
  -- rows in the window plus the unpruned rows finalized in it
  finals AS (
    SELECT f.queue,
           sum(f.n) FILTER (WHERE f.state = 'completed' AND f.total) AS completed_total,
           sum(f.n) FILTER (WHERE f.state = 'failed' AND f.total) AS failed_total,
           sum(f.n) FILTER (WHERE f.state = 'cancelled' AND f.total) AS cancelled_total,
           sum(f.n) FILTER (WHERE f.state = 'completed' AND f.recent) AS recent_completed,
           sum(f.n) FILTER (WHERE f.state = 'failed' AND f.recent) AS recent_failed,
           sum(f.n) FILTER (WHERE f.state = 'cancelled' AND f.recent) AS recent_cancelled
    FROM (SELECT pr.queue, pr.state, pr.n, pr.recent, NOT pr.recent AS total FROM pruned pr
          UNION ALL
          SELECT u.queue, u.state, u.n, u.recent, true FROM unpruned u) f
    GROUP BY f.queue
  ),
  names AS (
    SELECT l.queue FROM lanes l UNION SELECT m.queue FROM queue_meta m UNION SELECT d.queue FROM deferred_counts d
    UNION SELECT q.queue FROM dlq_counts q UNION SELECT f.queue FROM finals f UNION SELECT p.queue FROM parked_counts p
  )
  SELECT n.queue, coalesce(m.paused, false),
         coalesce(rc.n, 0)::bigint + coalesce(pc.n, 0), coalesce(ru.n, 0), coalesce(dc.scheduled, 0),
         coalesce(dc.retryable, 0), coalesce(q.n, 0),
         CASE WHEN rc.head_at IS NULL THEN pc.head_at WHEN pc.head_at IS NULL THEN rc.head_at
              ELSE least(rc.head_at, pc.head_at) END,
         coalesce(f.completed_total, 0)::bigint, coalesce(f.failed_total, 0)::bigint,
         coalesce(f.cancelled_total, 0)::bigint, coalesce(f.recent_completed, 0)::bigint,
         coalesce(f.recent_failed, 0)::bigint, coalesce(f.recent_cancelled, 0)::bigint,
         win.since, now()
  FROM names n
  CROSS JOIN win
  LEFT JOIN queue_meta m ON m.queue = n.queue
  LEFT JOIN ready_counts rc ON rc.queue = n.queue
  LEFT JOIN parked_counts pc ON pc.queue = n.queue
  LEFT JOIN running_counts ru ON ru.queue = n.queue
  LEFT JOIN deferred_counts dc ON dc.queue = n.queue
  LEFT JOIN dlq_counts q ON q.queue = n.queue
  LEFT JOIN finals f ON f.queue = n.queue
  ORDER BY n.queue COLLATE "C";
END
$$;

-- prune_queue, 8 arguments: 0053's text, lines marked 0057.
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
    SELECT * INTO v_hist FROM ring_current('history'); -- 0048
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
    PERFORM set_config('enable_nestloop', v_saved_nestloop, true); -- 0048
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
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.prune_queue(int, bigint, bigint, bigint, bigint, int, int, bigint) FROM PUBLIC;

-- prune_queue, 4 arguments: 0053's text, lines marked 0057.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.prune_queue(p_lock_timeout_ms integer, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
 RETURNS TABLE(outcome text, generation bigint, carried integer)
 LANGUAGE plpgsql
 SET search_path TO ':AWA_SCHEMA', 'pg_catalog'
 SET jit TO 'off'
AS $function$
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
  v_rollup jsonb;
  v_keys jsonb;
  v_children text;
  v_deadline timestamptz;
  v_saved_timeout text := current_setting('lock_timeout');
  v_saved_nestloop text := current_setting('enable_nestloop');
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'prune_queue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
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
    RETURN QUERY SELECT 'Blocked:locked_attempt', v_old, 0;
    RETURN;
  END;

  v_children := format('%1$I.ready_%2$s, %1$I.ready_tombstones_%2$s, %1$I.claims_%2$s, %1$I.claim_marks_%2$s, %1$I.closures_%2$s, %1$I.terminal_%2$s, %1$I.claim_spans_%2$s', -- 0053
                       ':AWA_SCHEMA', v_slot);
  -- Freeze the slot: SHARE waits for writers still inserting into it and keeps new ones out until
  -- commit, but does not conflict with the ACCESS SHARE of claimers and readers. A queued SHARE
  -- request does not hold up later readers either (only ACCESS EXCLUSIVE conflicts with them).
  BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    EXECUTE 'LOCK TABLE ' || v_children || ' IN SHARE MODE';
  EXCEPTION WHEN lock_not_available THEN
    RETURN QUERY SELECT 'Blocked:lock', v_old, 0;
    RETURN;
  END;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);

  -- Re-proof: rows committed while we waited for SHARE are visible now, and no more can come.
  IF slot_has_unclaimed(v_slot) THEN
    RETURN QUERY SELECT 'Blocked:unclaimed', v_old, 0;
    RETURN;
  END IF;

  -- Everything below up to the exclusive lock only reads: a prune that gives up writes nothing.
  -- Open attempts: claims without a closure (ours since step 3, or claimed after it from rows
  -- that arrived late; either way their finalizers need the slot, which is frozen).
  SELECT array_agg(c) INTO v_open_claims FROM claims c
  WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease);
  IF v_open_claims IS NOT NULL THEN
    SELECT array_agg(r) INTO v_open_ready
    FROM unnest(v_open_claims) o
    JOIN ready r ON r.slot = v_slot AND r.queue = o.queue AND r.priority = o.priority AND r.shard = o.shard AND r.lane_seq = o.lane_seq;
  END IF;

  -- The terminal rows: judged here, or already copied ahead by an earlier call (see below). The
  -- slot is frozen, so if it still holds as many terminal rows as the copy saw, they are the same
  -- rows (ring tables are append-only) and the copy's roll-up and keys stand.
  SELECT * INTO v_copy FROM history_copies hc WHERE hc.generation = v_old;
  v_copied := FOUND;
  IF v_copied THEN
    SELECT count(*) INTO v_count FROM terminal_records t WHERE t.slot = v_slot; -- 0057
  END IF;
  IF v_copied AND v_count = v_copy.terminal_rows THEN
    v_rollup := v_copy.rollup;
    v_keys := v_copy.keys;
  ELSE
    -- Judge: widened from their ready row when narrow; kept if inside their state's retention.
    -- After a copy ahead (rows arrived since: rare), rows already in history are neither copied
    -- again nor have their keys released (the history copy holds them).
    -- Fresh ring children have no statistics (estimates of a few rows), so the planner joins
    -- terminal to ready with a nested loop over a seq scan: O(n²), 0.56 s for 2,000 rows. A hash
    -- join is linear whatever the estimates.
    PERFORM set_config('enable_nestloop', 'off', true);
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

    -- Copy ahead: many rows to keep, and nothing left in the slot that could still add a terminal
    -- row (no open attempt). Insert them into history now and COMMIT (the caller calls again at
    -- once): under the exclusive lock the next call then only truncates, instead of inserting
    -- every row (0.9 s for 100k rows). The copy is committed, never rolled back, and recorded in
    -- history_copies, so a later call reuses it instead of copying again: no dead tuples either way.
    IF NOT v_copied AND v_open_claims IS NULL AND coalesce(cardinality(v_kept), 0) >= v_copy_ahead_rows THEN
      SELECT * INTO v_hist FROM ring_current('history');
      INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                           metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
      SELECT v_hist.slot, v_hist.generation, h.job_id, h.run_lease, h.state, h.attempt, h.max_attempts, h.kind, h.queue, h.priority,
             h.args, h.metadata, h.tags, h.errors, h.progress, h.run_at, h.created_at, h.finalized_at, h.unique_key, h.unique_states
      FROM unnest(v_kept) h;
      INSERT INTO history_copies (generation, slot, terminal_rows, rollup, keys)
      VALUES (v_old, v_slot, v_count, coalesce(v_rollup, '{}'), v_keys);
      RETURN QUERY SELECT 'Copied', v_old, 0;
      RETURN;
    END IF;
  END IF;

  -- ACCESS EXCLUSIVE, never queued: a waiting request would make every later claimer wait behind
  -- it (they all read this slot's children). NOWAIT succeeds in a moment when no reader holds the
  -- children; between tries we sleep about a millisecond, so readers come and go freely.
  v_deadline := clock_timestamp() + p_lock_timeout_ms * interval '1 millisecond';
  LOOP
    BEGIN
      EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE NOWAIT';
      EXIT;
    EXCEPTION WHEN lock_not_available THEN
      IF clock_timestamp() >= v_deadline THEN
        RETURN QUERY SELECT 'Blocked:lock', v_old, 0;
        RETURN;
      END IF;
    END;
    PERFORM pg_sleep(0.001);
  END LOOP;

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
    -- the lane's cursor is past every carried row (they were claimed); a mark at it keeps it there
    -- once this slot's marks are gone
    INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
    SELECT v_cur.slot, v_cur.generation, l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard)
    FROM (SELECT DISTINCT o.queue, o.priority, o.shard FROM unnest(v_open_claims) o) l;
  END IF;

  IF v_kept IS NOT NULL THEN
    SELECT * INTO v_hist FROM ring_current('history');
    INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                         metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
    SELECT v_hist.slot, v_hist.generation, h.job_id, h.run_lease, h.state, h.attempt, h.max_attempts, h.kind, h.queue, h.priority,
           h.args, h.metadata, h.tags, h.errors, h.progress, h.run_at, h.created_at, h.finalized_at, h.unique_key, h.unique_states
    FROM unnest(v_kept) h;
  END IF;

  IF v_keys IS NOT NULL THEN
    PERFORM release_keys_of(v_keys);
  END IF;
  EXECUTE 'TRUNCATE ' || v_children;
  INSERT INTO ring_prunes (ring, generation, slot, rollup) VALUES ('queue', v_old, v_slot, coalesce(v_rollup, '{}'));
  RETURN QUERY SELECT 'Pruned', v_old, coalesce(cardinality(v_open_claims), 0);
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.prune_queue(int, bigint, bigint, bigint) FROM PUBLIC;
