-- 0031: per-queue rate history sampled by the maintenance leader, and the last prune outcome
-- written where `awa status` can read it (issue 18 items 1 and 3, issue 19's sparklines;
-- docs/adr/0024-operator-surface.md, "Amendment 2026-12-02"). New tables and new functions only:
-- no function of an earlier migration is redefined, and nothing on the enqueue, claim or
-- finalize path writes or reads anything here.
--
-- stat_samples / queue_samples: every sample period (15 s by default) the leader calls
-- sample_queue_stats, which writes one stat_samples row and one queue_samples row per queue:
--   completed, failed, cancelled  finalizations since the previous sample: the difference of
--                                 queue_stats' *_total (ledger roll-ups plus unpruned terminal
--                                 rows, which a prune moves between without changing the sum).
--   enqueued                      jobs whose id lies in (previous counted_through, previous
--                                 job_id_hw]: ids the sequence had handed out before the PREVIOUS
--                                 sample, counted one period later so that the transactions that
--                                 took them have committed (or rolled back: then they are not
--                                 counted, rightly). Counted by job_id index range over ready,
--                                 deferred, parked, terminal (wide rows), history and dlq, each
--                                 job once. Enqueue itself writes nothing new: job_id_seq is read
--                                 with a plain SELECT of its last_value (no nextval).
--   Not counted: a job whose transaction stayed open longer than a sample period, and one
--   purged from the DLQ or from history within that period. Rows older than p_keep_ms are
--   deleted by the same call (DELETE: dead tuples for autovacuum, off the hot path, once a period).
-- Locks and guards of sample_queue_stats: READ COMMITTED only (it writes); SHARE ROW EXCLUSIVE
-- on stat_samples (self-conflicting: a second leader of a split brain waits, then sees the new
-- sample and skips), ACCESS SHARE on what queue_stats and the enqueue count read.
--
-- maintenance_state: one row per ring with its prune state ('ok', or 'blocked' and the reason,
-- and since when). record_prune_state writes it only when the state changes (the leader also
-- calls it only on a change, not every tick): an UPDATE or INSERT of one row, READ COMMITTED.
--
-- queue_rates / queue_history: reads of the samples in a window (one statement each, any
-- isolation level, no writes): sums per queue, and sums per queue and time bucket.
CREATE TABLE :AWA_SCHEMA.stat_samples (
  sampled_at timestamptz PRIMARY KEY,
  -- job_id_seq's last handed-out id at this sample
  job_id_hw bigint NOT NULL,
  -- ids at or below this were counted into some sample's `enqueued`
  counted_through bigint NOT NULL,
  -- the span this sample's enqueue count describes (the previous period)
  enqueued_from timestamptz,
  enqueued_until timestamptz
);
CREATE TABLE :AWA_SCHEMA.queue_samples (
  sampled_at timestamptz NOT NULL,
  queue text NOT NULL,
  enqueued bigint NOT NULL,
  completed bigint NOT NULL,
  failed bigint NOT NULL,
  cancelled bigint NOT NULL,
  completed_total bigint NOT NULL,
  failed_total bigint NOT NULL,
  cancelled_total bigint NOT NULL,
  PRIMARY KEY (sampled_at, queue)
);
CREATE TABLE :AWA_SCHEMA.maintenance_state (
  ring text PRIMARY KEY,
  outcome text NOT NULL,
  reason text,
  since timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION :AWA_SCHEMA.sample_queue_stats(p_min_interval_ms bigint, p_keep_ms bigint)
RETURNS timestamptz
LANGUAGE plpgsql
SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_prev stat_samples;
  v_hw bigint;
  v_from bigint;
  v_to bigint;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'sample_queue_stats needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  -- one sampler at a time; the next statement's snapshot sees what a predecessor committed
  LOCK TABLE stat_samples IN SHARE ROW EXCLUSIVE MODE;
  SELECT * INTO v_prev FROM stat_samples ORDER BY sampled_at DESC LIMIT 1;
  IF FOUND AND v_prev.sampled_at > v_now - p_min_interval_ms * interval '1 millisecond' THEN
    RETURN NULL;
  END IF;
  SELECT CASE WHEN q.is_called THEN q.last_value ELSE 0 END INTO v_hw FROM job_id_seq q;
  IF v_prev.sampled_at IS NOT NULL THEN
    v_from := v_prev.counted_through;
    v_to := v_prev.job_id_hw;
  ELSE
    -- the first sample is the baseline: nothing handed out before it is counted
    v_from := v_hw;
    v_to := v_hw;
  END IF;
  INSERT INTO stat_samples (sampled_at, job_id_hw, counted_through, enqueued_from, enqueued_until)
  SELECT v_now, v_hw, v_to,
         (SELECT s.sampled_at FROM stat_samples s WHERE s.sampled_at < v_prev.sampled_at ORDER BY s.sampled_at DESC LIMIT 1),
         v_prev.sampled_at;
  INSERT INTO queue_samples (sampled_at, queue, enqueued, completed, failed, cancelled,
                             completed_total, failed_total, cancelled_total)
  WITH st AS (SELECT * FROM queue_stats(60000)),
  born AS (
    SELECT x.queue, count(DISTINCT x.job_id) AS n FROM (
      SELECT r.job_id, r.queue FROM ready r WHERE r.job_id > v_from AND r.job_id <= v_to
      UNION ALL SELECT d.job_id, d.queue FROM deferred d WHERE d.job_id > v_from AND d.job_id <= v_to
      UNION ALL SELECT p.job_id, p.queue FROM parked p WHERE p.job_id > v_from AND p.job_id <= v_to
      UNION ALL SELECT t.job_id, t.queue FROM terminal t WHERE t.wide AND t.job_id > v_from AND t.job_id <= v_to
      UNION ALL SELECT h.job_id, h.queue FROM history h WHERE h.job_id > v_from AND h.job_id <= v_to
      UNION ALL SELECT q.job_id, q.queue FROM dlq q WHERE q.job_id > v_from AND q.job_id <= v_to
    ) x GROUP BY x.queue
  ),
  prev AS (SELECT * FROM queue_samples p WHERE p.sampled_at = v_prev.sampled_at)
  SELECT v_now, coalesce(st.queue, b.queue), coalesce(b.n, 0),
         -- no previous sample: a baseline of zeros; a queue new since it: all its finalizations are new
         CASE WHEN v_prev.sampled_at IS NULL THEN 0 ELSE greatest(0, coalesce(st.completed_total, 0) - coalesce(p.completed_total, 0)) END,
         CASE WHEN v_prev.sampled_at IS NULL THEN 0 ELSE greatest(0, coalesce(st.failed_total, 0) - coalesce(p.failed_total, 0)) END,
         CASE WHEN v_prev.sampled_at IS NULL THEN 0 ELSE greatest(0, coalesce(st.cancelled_total, 0) - coalesce(p.cancelled_total, 0)) END,
         coalesce(st.completed_total, 0), coalesce(st.failed_total, 0), coalesce(st.cancelled_total, 0)
  FROM st FULL JOIN born b ON b.queue = st.queue
  LEFT JOIN prev p ON p.queue = coalesce(st.queue, b.queue);
  DELETE FROM queue_samples WHERE sampled_at < v_now - p_keep_ms * interval '1 millisecond';
  DELETE FROM stat_samples WHERE sampled_at < v_now - p_keep_ms * interval '1 millisecond';
  RETURN v_now;
END
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.sample_queue_stats(bigint, bigint) FROM PUBLIC;

-- Sums per queue over the samples taken in the last p_window_ms, and the span they cover (from
-- the sample before the first one in the window to the last one; enqueue counts describe the
-- period before each sample: enqueued_from .. enqueued_until).
CREATE FUNCTION :AWA_SCHEMA.queue_rates(p_window_ms bigint)
RETURNS TABLE (queue text, enqueued bigint, completed bigint, failed bigint, cancelled bigint,
               span_start timestamptz, span_end timestamptz, enqueue_span_start timestamptz,
               enqueue_span_end timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH win AS MATERIALIZED (
    SELECT s.sampled_at, s.enqueued_from, s.enqueued_until,
           (SELECT p.sampled_at FROM stat_samples p WHERE p.sampled_at < s.sampled_at ORDER BY p.sampled_at DESC LIMIT 1) AS prev_at
    FROM stat_samples s WHERE s.sampled_at > now() - p_window_ms * interval '1 millisecond'
  ),
  span AS (
    SELECT min(w.prev_at) AS a, max(w.sampled_at) AS b, min(w.enqueued_from) AS ea, max(w.enqueued_until) AS eb
    FROM win w WHERE w.prev_at IS NOT NULL
  )
  SELECT q.queue, sum(q.enqueued)::bigint, sum(q.completed)::bigint, sum(q.failed)::bigint, sum(q.cancelled)::bigint,
         span.a, span.b, span.ea, span.eb
  FROM queue_samples q JOIN win w ON w.sampled_at = q.sampled_at AND w.prev_at IS NOT NULL CROSS JOIN span
  GROUP BY q.queue, span.a, span.b, span.ea, span.eb
  ORDER BY q.queue COLLATE "C";
END
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.queue_rates(bigint) FROM PUBLIC;

-- Sums per queue and bucket (bucket_start = sampled_at floored to p_bucket_ms) over the last
-- p_window_ms: the sparklines' series. Buckets without a sample are absent.
CREATE FUNCTION :AWA_SCHEMA.queue_history(p_window_ms bigint, p_bucket_ms bigint)
RETURNS TABLE (queue text, bucket_start timestamptz, enqueued bigint, completed bigint, failed bigint, cancelled bigint)
LANGUAGE plpgsql STABLE
SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  SELECT q.queue,
         to_timestamp(floor(extract(epoch FROM q.sampled_at) * 1000 / p_bucket_ms) * p_bucket_ms / 1000.0) AS b,
         sum(q.enqueued)::bigint, sum(q.completed)::bigint, sum(q.failed)::bigint, sum(q.cancelled)::bigint
  FROM queue_samples q
  WHERE q.sampled_at > now() - p_window_ms * interval '1 millisecond'
  GROUP BY q.queue, b
  ORDER BY q.queue COLLATE "C", b;
END
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.queue_history(bigint, bigint) FROM PUBLIC;

-- The ring's prune state, written when it changes: returns whether a row changed.
CREATE FUNCTION :AWA_SCHEMA.record_prune_state(p_ring text, p_outcome text, p_reason text)
RETURNS boolean
LANGUAGE plpgsql
SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
DECLARE
  v_n int;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'record_prune_state needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  INSERT INTO maintenance_state AS m (ring, outcome, reason) VALUES (p_ring, p_outcome, p_reason)
  ON CONFLICT (ring) DO UPDATE SET outcome = excluded.outcome, reason = excluded.reason, since = now()
  WHERE (m.outcome, m.reason) IS DISTINCT FROM (excluded.outcome, excluded.reason);
  GET DIAGNOSTICS v_n = ROW_COUNT;
  RETURN v_n > 0;
END
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.record_prune_state(text, text, text) FROM PUBLIC;
