-- 0029: claim's and heartbeat's plans read in proportion to their batch after ANALYZE (issue 17;
-- the drain regression measured in docs/benchmarks.md, "Drain regression after 0021").
--
-- 1. claim (ALTER FUNCTION, below)
--
-- claim runs with plan_cache_mode = force_generic_plan (0011): its statements are planned once
-- per session with parameters unknown, from the statistics of that moment. Once ANALYZE has seen
-- a lane of a few thousand rows, the pick's generic estimate for "this lane from the cursor on,
-- in these slot ranges" is one row, and the cheapest plan for one row became a BitmapOr over the
-- ready child's primary key (the two slot ranges as two bitmap index scans), a hash anti-join
-- with the tombstones and a top-N sort: it reads the WHOLE lane from the cursor on, every call,
-- to return the first p_max rows. 0021's lane barrier (a second bound on lane_seq) is what tipped
-- the pick over; the plan was cheap before it. Measured on embedded 17 with a 20,000-job lane
-- after ANALYZE: claim(256) 28-68 ms per call instead of 0.6 ms, 20,000 heap tuples and 426
-- blocks read for claim(1) instead of 0 and 1; the bench's drain fell from ~20k to ~5k jobs/s.
--
-- The fix pins the plan shape rather than the estimate: without bitmap scans the slot ranges
-- become a filter of the index scan on (queue, priority, shard, lane_seq), which returns the lane
-- in order, so a Merge Append over the live children feeds the LIMIT and stops after p_max rows;
-- without hash or merge joins and without Materialize, the tombstone anti-join is an index probe
-- per picked row (a Materialize of the lane's tombstones would be rescanned once per row). The
-- rarer statements of claim (several lanes' heads, the unique-key-at-claim path) are probes and
-- batch-sized CTE joins already; nested loops over at most p_max rows cost them nothing material.
--
-- ALTER FUNCTION adds these options to claim's existing SET clauses (0025's text, 0027's guard;
-- search_path, plan_cache_mode, enable_seqscan = off, jit = off stay). A later CREATE OR REPLACE
-- of claim must repeat them. Locks, guards, writes: none (catalog only).
ALTER FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) SET enable_bitmapscan = off;
ALTER FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) SET enable_hashjoin = off;
ALTER FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) SET enable_mergejoin = off;
ALTER FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) SET enable_material = off;

-- 2. heartbeat, as 0028 (its guard from 0027, its claims row locks from 0028), with the lines
-- marked 0029. Its "is the attempt open" test was two EXISTS subqueries per item. With statistics
-- of a few thousand claims and closures rows the planner hashed them: each call read every row of
-- both tables, in every slot, to answer for a few hundred items (2,005 claims and 2,000 closures
-- tuples for heartbeat(5) in PgQueueStorage.plansAfterAnalyze.test.ts). Heartbeats run on every
-- worker every interval, so that cost grew with the rows stored, not with the work. Locks, guards
-- and writes are 0028's: the attempts' claims rows FOR NO KEY UPDATE in (job_id, run_lease)
-- order, attempt_state upserted for open attempts only.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.heartbeat(p_items jsonb)
  RETURNS TABLE(job_id bigint, run_lease bigint)
  LANGUAGE plpgsql
  SET search_path = :AWA_SCHEMA, pg_catalog
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  SET jit = off
AS $function$
#variable_conflict use_column
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'heartbeat needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  -- 0028: the attempts' claims rows, locked FOR NO KEY UPDATE in (job_id, run_lease) order as
  -- finalize locks them (where each attempt took an advisory lock): a heartbeat and a finalize of
  -- the same attempt take turns, so no attempt_state row outlives its attempt. A carried claim is
  -- found wherever it is (no slot restriction); prune cannot carry one we hold.
  PERFORM 1 FROM claims c -- 0028
  WHERE (c.job_id, c.run_lease) IN (SELECT i.job_id, i.run_lease FROM jsonb_to_recordset(p_items) AS i(job_id bigint, run_lease bigint))
  ORDER BY c.job_id, c.run_lease
  FOR NO KEY UPDATE OF c;
  RETURN QUERY
  WITH items AS (
    -- 0029: one probe per item into claims and closures (LATERAL ... LIMIT 1 cannot become a
    -- hashed subplan, which read every claims and closures row once the statistics were large)
    SELECT DISTINCT ON (x.job_id, x.run_lease) x.job_id, x.run_lease, x.progress,
           c.found IS NOT NULL AND z.found IS NULL AS open -- 0029
    FROM jsonb_to_recordset(p_items) AS x(job_id bigint, run_lease bigint, progress jsonb)
    LEFT JOIN LATERAL (SELECT true AS found FROM claims c -- 0029
                       WHERE c.job_id = x.job_id AND c.run_lease = x.run_lease LIMIT 1) c ON true
    LEFT JOIN LATERAL (SELECT true AS found FROM closures z -- 0029
                       WHERE z.job_id = x.job_id AND z.run_lease = x.run_lease LIMIT 1) z ON true
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
$function$;
