-- 0037: queue_stats costs its backlog whatever the statistics (issue 17: the leader's stats
-- sample took 2.6 s of server CPU in a 100,000-job drain; issue 18's operator surface).
--
-- queue_stats is 0030's text with two changes, marked "-- 0037":
--   available  per lane, a range count of its ready rows from the cursor less a range count of
--              its tombstones from the cursor (was: an anti-join probing ready_tombstones per row;
--              with a plan made before the ring children had statistics -- a fresh install, a
--              first backlog -- every probe visited all 16 children: 1.3 s at 100,000 available
--              jobs, 25 ms with statistics). Exact: a tombstone marks one ready row, at its
--              position, in its slot (cancel_job, drain_queue_batch, claim's superseded rows and
--              prune's parking each insert one for a ready row they found there, under the lane's
--              claim lock or the slot's freeze; the row is then never picked or tombstoned again).
--              The head's probe names the row's slot and the cursor.
--   running    the closure probe names the claims row's slot (a closure lives there: finalize,
--              the only writer of closures, through which rescue and cancel close, writes it with
--              its claims row's slot; prune carries only open claims, within one transaction).
-- Locks, guards and writes are 0030's: none written, ACCESS SHARE only, no READ COMMITTED guard.
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
    FROM terminal t
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
