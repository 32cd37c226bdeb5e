-- 0032: flow control (issue 20 items 1, 2, 4; capabilities.md §12, §13, §25;
-- docs/adr/0028-flow-control.md). No hot-path function changes; one column, one read-only function.
--
-- queue_meta.overrides  the hot overrides of one queue (setQueueOverrides), a jsonb object with
--                       any of pollIntervalMs, claimBatchSize, rateLimit {maxRate, burst},
--                       deadlineMs. NULL = none. Written only by an operator call (a single-row
--                       upsert on queue_meta, never per job or per claim); read by every worker
--                       process once per override refresh interval. Deliberately no CHECK
--                       constraint: values are validated by the client that writes them, and a
--                       value written around it in SQL is logged and ignored by the workers
--                       (§13), not a failed statement. A new key needs no migration.
ALTER TABLE :AWA_SCHEMA.queue_meta ADD COLUMN overrides jsonb;

-- queue_depth(p_queue, p_cap): the capped count of storage-engine.md §9, for backpressure and the
-- paced producer. Counts the queue's claimable rows (as queue_stats's `available`: each lane's
-- ready rows at or beyond its cursor in the unpruned slots, less tombstoned ones, plus its parked
-- rows) but stops at p_cap: every lane's scan and the parked scan carry LIMIT p_cap, and so does
-- the total, so the cost is bounded by p_cap index entries per lane (plus one tombstone probe
-- each), never by the backlog. Returns min(depth, p_cap); a result equal to p_cap means "at
-- least p_cap" (the caller asks for limit + 1 when it must tell "at the limit" from "over it").
-- Locks: ACCESS SHARE only. Guards: none needed, it writes nothing and is one statement (one
-- snapshot at any isolation level), so it has no READ COMMITTED check (listed in
-- packages/sql/test/Catalog.test.ts). PL/pgSQL with a forced generic plan, as queue_stats (0030):
-- the plan over every ready partition is made once per session, not per call.
CREATE FUNCTION :AWA_SCHEMA.queue_depth(p_queue text, p_cap integer)
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = :AWA_SCHEMA, pg_catalog SET plan_cache_mode = force_generic_plan SET jit = off AS $$
DECLARE
  v_n bigint;
BEGIN
  IF p_cap IS NULL OR p_cap < 1 THEN
    RAISE EXCEPTION 'queue_depth: p_cap must be at least 1, got %', p_cap USING ERRCODE = '22023';
  END IF;
  WITH rng AS MATERIALIZED (SELECT s.lo1, s.hi1, s.lo2, s.hi2 FROM queue_slot_ranges() s),
  cursors AS MATERIALIZED (
    -- = lane_cursor(queue, priority, shard), inline, as in queue_stats
    SELECT l.queue, l.priority, l.shard,
           coalesce((SELECT m.next_lane_seq FROM claim_marks m
                     WHERE m.queue = l.queue AND m.priority = l.priority AND m.shard = l.shard
                     ORDER BY m.next_lane_seq DESC LIMIT 1), 0) AS c
    FROM lanes l
    WHERE l.queue = p_queue
  )
  SELECT count(*) INTO v_n FROM (
    (SELECT 1 FROM cursors k
     CROSS JOIN LATERAL (
       SELECT 1 FROM ready r, rng
       WHERE r.queue = k.queue AND r.priority = k.priority AND r.shard = k.shard AND r.lane_seq >= k.c
         AND (r.slot BETWEEN rng.lo1 AND rng.hi1 OR r.slot BETWEEN rng.lo2 AND rng.hi2)
         AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                         WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                           AND t.lane_seq = r.lane_seq)
       LIMIT p_cap
     ) x)
    UNION ALL
    (SELECT 1 FROM parked p WHERE p.queue = p_queue LIMIT p_cap)
    LIMIT p_cap
  ) capped;
  RETURN v_n;
END
$$;

-- Owner only, as every other function (Catalog.test.ts checks).
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.queue_depth(text, integer) FROM PUBLIC;
