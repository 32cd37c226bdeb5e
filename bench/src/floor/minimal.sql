-- A floor for the drain's server work under the delivery contract, not a queue: the fewest rows an
-- append-only hot path can write per job and still guard every completion by its lease
-- (bench/src/serverFloor.ts --systems minimal,minimal-read; docs/adr/0014-hot-path-rows-per-job.md,
-- the 2026-12-05 update).
--
-- What it keeps of Awa's storage: ready rows that are never updated (a lane's FIFO by position),
-- a lane lock held by the claim, a claim that returns the claimed rows with run_lease + 1, and a
-- completion that is a no-op for an attempt already closed (stale or repeated). What it writes:
-- one claim record per claim call (the lane's positions it took, when, until when: ADR 0014's
-- option 1) and one closure per completed attempt that is also its terminal record (option 2).
-- Nothing else. `finalize_completions` reads only the closures' primary key;
-- `finalize_completions_read` also reads each attempt's ready row.
--
-- What it leaves out, each of which a real design pays somewhere: the ring's slots and their
-- ranges (pruning instead of dead tuples), heartbeats and the attempt state they write, rescue's
-- reads, unique keys, key grants, parked rows and tombstones, pause, several lanes, history, the
-- exclusion between a completion and a prune. So read its cost as a lower bound for such a design
-- on this server, not as a design.

CREATE TABLE ready (
  job_id bigint NOT NULL,
  kind text NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL DEFAULT 0,
  lane_seq bigint NOT NULL,
  args jsonb NOT NULL,
  metadata jsonb NOT NULL DEFAULT '{}',
  tags text[] NOT NULL DEFAULT '{}',
  errors jsonb NOT NULL DEFAULT '[]',
  progress jsonb,
  attempt integer NOT NULL DEFAULT 0,
  run_lease bigint NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL DEFAULT 25,
  run_at timestamptz NOT NULL DEFAULT now(),
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (queue, priority, shard, lane_seq)
);
CREATE INDEX ready_job_id ON ready (job_id);

-- One row per claim call: the lane's positions first_seq .. last_seq are claimed with their
-- ready rows' run_lease + 1. The lane's cursor is its newest record's last_seq.
CREATE TABLE claim_calls (
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  first_seq bigint NOT NULL,
  last_seq bigint NOT NULL,
  claimed_at timestamptz NOT NULL,
  deadline_at timestamptz,
  PRIMARY KEY (queue, priority, shard, last_seq)
);

-- One row per closed attempt; its primary key is the guard against a second closer.
CREATE TABLE closures (
  job_id bigint NOT NULL,
  run_lease bigint NOT NULL,
  outcome text NOT NULL,
  closed_at timestamptz NOT NULL,
  PRIMARY KEY (job_id, run_lease)
);

CREATE FUNCTION claim(p_queue text, p_max int, p_deadline_ms bigint)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt int, max_attempts int, kind text, queue text, priority smallint,
               args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamptz, created_at timestamptz,
               claimed_at timestamptz, deadline_at timestamptz, progress jsonb)
LANGUAGE plpgsql SET plan_cache_mode TO 'force_generic_plan' SET jit TO 'off'
AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_deadline timestamptz := CASE WHEN p_deadline_ms > 0 THEN now() + p_deadline_ms * interval '1 millisecond' END;
  v_cursor bigint;
BEGIN
  -- the lane's claim lock (Awa tries it, then waits once): claims of one lane are serial
  PERFORM pg_advisory_xact_lock(1, hashtext(p_queue));
  SELECT c.last_seq INTO v_cursor FROM claim_calls c
  WHERE c.queue = p_queue AND c.priority = 2 AND c.shard = 0 ORDER BY c.last_seq DESC LIMIT 1;
  RETURN QUERY
  WITH picked AS MATERIALIZED (
    SELECT r.* FROM ready r
    WHERE r.queue = p_queue AND r.priority = 2 AND r.shard = 0 AND r.lane_seq > coalesce(v_cursor, 0)
    ORDER BY r.lane_seq LIMIT p_max
  ),
  mark AS (
    INSERT INTO claim_calls (queue, priority, shard, first_seq, last_seq, claimed_at, deadline_at)
    SELECT p_queue, 2, 0, min(p.lane_seq), max(p.lane_seq), v_now, v_deadline FROM picked p HAVING count(*) > 0
  )
  SELECT p.job_id, p.run_lease + 1, p.attempt + 1, p.max_attempts, p.kind, p.queue, p.priority, p.args, p.metadata,
         p.tags, p.errors, p.run_at, p.created_at, v_now, v_deadline, p.progress
  FROM picked p ORDER BY p.lane_seq;
END
$$;

-- Applied for an attempt not closed yet: the closure's primary key is the whole guard. Only the
-- claim hands out a lease, and every other closer of an attempt (rescue, cancel) writes its
-- closure, so a stale or repeated completion finds one and is a no-op; the ready row is not read.
-- Two closers racing would meet at the primary key (one fails and is retried): a floor does not
-- pay for Awa's row locks either.
CREATE FUNCTION finalize_completions(p_job_ids bigint[], p_run_leases bigint[])
RETURNS TABLE (ord int, applied boolean)
LANGUAGE sql SET plan_cache_mode TO 'force_generic_plan' SET jit TO 'off' SET enable_seqscan TO 'off'
AS $$
  WITH items AS MATERIALIZED (
    SELECT x.o::int AS o, x.job_id, x.run_lease FROM unnest(p_job_ids, p_run_leases) WITH ORDINALITY AS x(job_id, run_lease, o)
  ),
  done AS MATERIALIZED (
    SELECT i.o, i.job_id, i.run_lease FROM items i
    WHERE NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = i.job_id AND z.run_lease = i.run_lease)
  ),
  closed AS (
    INSERT INTO closures (job_id, run_lease, outcome, closed_at)
    SELECT d.job_id, d.run_lease, 'completed', now() FROM done d
  )
  SELECT i.o, d.o IS NOT NULL FROM items i LEFT JOIN done d ON d.o = i.o ORDER BY i.o
$$;

-- The same completion that also reads each attempt's ready row, by job id and the lease it was
-- claimed with (the ready row's run_lease + 1): the price of one read by job id per completed job
-- (serverFloor.ts --systems minimal-read). Checking the lane's cursor too, as a correlated probe
-- per row, cost ~6 µs more per job on Debian's 15 (pgbench, 2026-12-05): not what a floor measures.
CREATE FUNCTION finalize_completions_read(p_job_ids bigint[], p_run_leases bigint[])
RETURNS TABLE (ord int, applied boolean)
LANGUAGE sql SET plan_cache_mode TO 'force_generic_plan' SET jit TO 'off' SET enable_seqscan TO 'off'
AS $$
  WITH items AS MATERIALIZED (
    SELECT x.o::int AS o, x.job_id, x.run_lease FROM unnest(p_job_ids, p_run_leases) WITH ORDINALITY AS x(job_id, run_lease, o)
  ),
  done AS MATERIALIZED (
    SELECT i.o, i.job_id, i.run_lease FROM items i
    JOIN ready r ON r.job_id = i.job_id AND r.run_lease = i.run_lease - 1
    WHERE NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = i.job_id AND z.run_lease = i.run_lease)
  ),
  closed AS (
    INSERT INTO closures (job_id, run_lease, outcome, closed_at)
    SELECT d.job_id, d.run_lease, 'completed', now() FROM done d
  )
  SELECT i.o, d.o IS NOT NULL FROM items i LEFT JOIN done d ON d.o = i.o ORDER BY i.o
$$;
