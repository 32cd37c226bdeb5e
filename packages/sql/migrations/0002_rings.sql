-- 0002: the queue ring, the history ring and the plain tables of the storage engine
-- (storage-engine.md §4, docs/adr/0004-storage-engine.md).
--
-- Ring tables are LIST-partitioned by slot with children pre-created here: no DDL at run time.
-- Claim and completion only INSERT into ring tables; space returns by TRUNCATE of a whole slot
-- after prune proves it holds nothing live. Ring sizes are fixed at install:
-- queue ring 16 slots (rotated every ~1 s), history ring 32 slots.

CREATE FUNCTION :AWA_SCHEMA.ring_slots(p_ring text) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT CASE p_ring WHEN 'queue' THEN 16 WHEN 'history' THEN 32 END
$$;

-- Job body for one attempt. Written at enqueue, promotion and operator retry; never updated.
-- lane_seq is the FIFO position inside (queue, priority, shard).
CREATE TABLE :AWA_SCHEMA.ready (
  slot          int         NOT NULL,
  generation    bigint      NOT NULL,
  job_id        bigint      NOT NULL,
  kind          text        NOT NULL,
  queue         text        NOT NULL,
  priority      smallint    NOT NULL,
  shard         smallint    NOT NULL DEFAULT 0,
  lane_seq      bigint      NOT NULL,
  args          jsonb       NOT NULL,
  metadata      jsonb       NOT NULL,
  tags          text[]      NOT NULL,
  errors        jsonb       NOT NULL,
  progress      jsonb,
  attempt       int         NOT NULL,
  -- the previous attempt's lease: the claim of this row writes run_lease + 1
  run_lease     bigint      NOT NULL,
  max_attempts  int         NOT NULL,
  run_at        timestamptz NOT NULL,
  created_at    timestamptz NOT NULL,
  unique_key    bytea,
  unique_states int         NOT NULL DEFAULT 0,
  -- slot last: the partition key must be in the key, and lookups by lane must not need it
  PRIMARY KEY (queue, priority, shard, lane_seq, slot)
) PARTITION BY LIST (slot);
CREATE INDEX ON :AWA_SCHEMA.ready (job_id);

-- A cancelled (or moved) unclaimed ready row: claim skips it.
CREATE TABLE :AWA_SCHEMA.ready_tombstones (
  slot       int         NOT NULL,
  generation bigint      NOT NULL,
  job_id     bigint      NOT NULL,
  queue      text        NOT NULL,
  priority   smallint    NOT NULL,
  shard      smallint    NOT NULL,
  lane_seq   bigint      NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
) PARTITION BY LIST (slot);
CREATE INDEX ON :AWA_SCHEMA.ready_tombstones (queue, priority, shard, lane_seq);
CREATE INDEX ON :AWA_SCHEMA.ready_tombstones (job_id);

-- Attempt (job_id, run_lease) handed to a worker; lives in its ready row's slot.
-- Open = no closure with the same (job_id, run_lease). Nothing is ever updated.
CREATE TABLE :AWA_SCHEMA.claims (
  slot        int         NOT NULL,
  generation  bigint      NOT NULL,
  job_id      bigint      NOT NULL,
  run_lease   bigint      NOT NULL,
  attempt     int         NOT NULL,
  queue       text        NOT NULL,
  priority    smallint    NOT NULL,
  shard       smallint    NOT NULL,
  lane_seq    bigint      NOT NULL,
  claimed_at  timestamptz NOT NULL,
  deadline_at timestamptz,
  PRIMARY KEY (job_id, run_lease, slot)
) PARTITION BY LIST (slot);
CREATE INDEX ON :AWA_SCHEMA.claims (claimed_at);
CREATE INDEX ON :AWA_SCHEMA.claims (deadline_at) WHERE deadline_at IS NOT NULL;

-- A claim call consumed its lane's positions up to (not including) next_lane_seq. The lane
-- cursor is the largest retained mark. Marks go to the ring's current slot, which is never
-- older than the rows they cover, so oldest-first prune never drops a mark before its rows.
CREATE TABLE :AWA_SCHEMA.claim_marks (
  slot          int      NOT NULL,
  generation    bigint   NOT NULL,
  queue         text     NOT NULL,
  priority      smallint NOT NULL,
  shard         smallint NOT NULL,
  next_lane_seq bigint   NOT NULL
) PARTITION BY LIST (slot);
CREATE INDEX ON :AWA_SCHEMA.claim_marks (queue, priority, shard, next_lane_seq DESC);

-- A finished attempt, in the same slot as its claim.
CREATE TABLE :AWA_SCHEMA.closures (
  slot       int         NOT NULL,
  generation bigint      NOT NULL,
  job_id     bigint      NOT NULL,
  run_lease  bigint      NOT NULL,
  outcome    text        NOT NULL,
  closed_at  timestamptz NOT NULL,
  PRIMARY KEY (job_id, run_lease, slot)
) PARTITION BY LIST (slot);

-- Terminal outcome. Narrow for claimed attempts (body read back from the ready row of the same
-- slot and lane position; errors only when they changed); wide (body columns set)
-- when no claim stands behind it (cancel of an unclaimed or deferred job).
CREATE TABLE :AWA_SCHEMA.terminal (
  slot          int         NOT NULL,
  generation    bigint      NOT NULL,
  job_id        bigint      NOT NULL,
  run_lease     bigint      NOT NULL,
  -- the claimed ready row's position (narrow rows join their body by it); NULL when wide
  lane_seq      bigint,
  state         text        NOT NULL,
  attempt       int         NOT NULL,
  finalized_at  timestamptz NOT NULL,
  errors        jsonb,
  progress      jsonb,
  wide          boolean     NOT NULL DEFAULT false,
  kind          text,
  queue         text,
  priority      smallint,
  args          jsonb,
  metadata      jsonb,
  tags          text[],
  max_attempts  int,
  run_at        timestamptz,
  created_at    timestamptz,
  unique_key    bytea,
  unique_states int
) PARTITION BY LIST (slot);
CREATE INDEX ON :AWA_SCHEMA.terminal (job_id);

-- Terminal history beyond the queue-ring window: rows inside their retention are copied here
-- once, widened, when their queue-ring slot is pruned. Reclaimed by TRUNCATE per slot.
CREATE TABLE :AWA_SCHEMA.history (
  slot          int         NOT NULL,
  generation    bigint      NOT NULL,
  job_id        bigint      NOT NULL,
  run_lease     bigint      NOT NULL,
  state         text        NOT NULL,
  attempt       int         NOT NULL,
  max_attempts  int         NOT NULL,
  kind          text        NOT NULL,
  queue         text        NOT NULL,
  priority      smallint    NOT NULL,
  args          jsonb       NOT NULL,
  metadata      jsonb       NOT NULL,
  tags          text[]      NOT NULL,
  errors        jsonb       NOT NULL,
  progress      jsonb,
  run_at        timestamptz NOT NULL,
  created_at    timestamptz NOT NULL,
  finalized_at  timestamptz NOT NULL,
  unique_key    bytea,
  unique_states int         NOT NULL DEFAULT 0
) PARTITION BY LIST (slot);
CREATE INDEX ON :AWA_SCHEMA.history (job_id);
CREATE INDEX ON :AWA_SCHEMA.history (queue, state, finalized_at);

DO $$
DECLARE
  t text;
  s int;
BEGIN
  FOREACH t IN ARRAY ARRAY['ready', 'ready_tombstones', 'claims', 'claim_marks', 'closures', 'terminal'] LOOP
    FOR s IN 0 .. :AWA_SCHEMA.ring_slots('queue') - 1 LOOP
      EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I FOR VALUES IN (%s)', ':AWA_SCHEMA', t || '_' || s, ':AWA_SCHEMA', t, s);
    END LOOP;
  END LOOP;
  FOR s IN 0 .. :AWA_SCHEMA.ring_slots('history') - 1 LOOP
    EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.history FOR VALUES IN (%s)', ':AWA_SCHEMA', 'history_' || s, ':AWA_SCHEMA', s);
  END LOOP;
END
$$;

-- Future, backoff and snoozed jobs. Mutable: churn scales with scheduled + retried jobs, not
-- with completions.
CREATE TABLE :AWA_SCHEMA.deferred (
  job_id        bigint      PRIMARY KEY,
  state         text        NOT NULL CHECK (state IN ('scheduled', 'retryable')),
  kind          text        NOT NULL,
  queue         text        NOT NULL,
  priority      smallint    NOT NULL,
  shard         smallint    NOT NULL DEFAULT 0,
  args          jsonb       NOT NULL,
  metadata      jsonb       NOT NULL,
  tags          text[]      NOT NULL,
  errors        jsonb       NOT NULL,
  progress      jsonb,
  attempt       int         NOT NULL,
  run_lease     bigint      NOT NULL,
  max_attempts  int         NOT NULL,
  run_at        timestamptz NOT NULL,
  created_at    timestamptz NOT NULL,
  unique_key    bytea,
  unique_states int         NOT NULL DEFAULT 0
);
-- Promotion scans due rows with literal states so this partial index applies under generic plans.
CREATE INDEX deferred_due ON :AWA_SCHEMA.deferred (run_at, job_id) WHERE state IN ('scheduled', 'retryable');

-- Lazy mutable attempt state: a row appears only when an attempt heartbeats (outlives one
-- heartbeat interval) or reports progress; deleted at finalization. fillfactor leaves room for
-- HOT updates of heartbeat_at.
CREATE TABLE :AWA_SCHEMA.attempt_state (
  job_id       bigint      NOT NULL,
  run_lease    bigint      NOT NULL,
  heartbeat_at timestamptz NOT NULL,
  progress     jsonb,
  PRIMARY KEY (job_id, run_lease)
) WITH (fillfactor = 80);

-- Which job holds each unique key (only jobs that ask for uniqueness).
CREATE TABLE :AWA_SCHEMA.unique_claims (
  unique_key bytea  PRIMARY KEY,
  job_id     bigint NOT NULL
);
CREATE INDEX ON :AWA_SCHEMA.unique_claims (job_id);
