-- 0001: control plane of the storage engine (docs/adr/0004-storage-engine.md).
-- Nothing here is touched per job: ledgers grow per rotation, lanes per new lane, queue_meta per
-- operator action.

-- Job ids. Never reused; a retried job keeps its id.
CREATE SEQUENCE :AWA_SCHEMA.job_id_seq AS bigint;

-- Lane positions. One global sequence (not the job-id sequence: a retried job needs a fresh
-- position). Values are taken only under the lane's enqueue lock, so within a lane they commit
-- in increasing order; aborted transactions leave harmless gaps. Never setval (not transactional).
CREATE SEQUENCE :AWA_SCHEMA.lane_seq AS bigint;

-- A lane is (queue, priority, shard), the unit of strict FIFO. Inserted if absent on first use,
-- never updated.
CREATE TABLE :AWA_SCHEMA.lanes (
  queue    text     NOT NULL,
  priority smallint NOT NULL,
  shard    smallint NOT NULL DEFAULT 0,
  PRIMARY KEY (queue, priority, shard)
);

-- Operator settings per queue. Changes only on operator action.
CREATE TABLE :AWA_SCHEMA.queue_meta (
  queue                text PRIMARY KEY,
  paused               boolean NOT NULL DEFAULT false,
  completed_retention  interval,
  failed_retention     interval,
  cancelled_retention  interval,
  updated_at           timestamptz NOT NULL DEFAULT now()
);

-- Append-only ring ledgers: the current incarnation of a ring is its highest generation;
-- slot = generation mod slot count. An idle ring writes nothing.
CREATE TABLE :AWA_SCHEMA.ring_rotations (
  ring       text        NOT NULL,
  generation bigint      NOT NULL,
  slot       int         NOT NULL,
  rotated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (ring, generation)
);

-- One row per truncated incarnation, with the per-queue/per-state counts folded out of it.
CREATE TABLE :AWA_SCHEMA.ring_prunes (
  ring       text        NOT NULL,
  generation bigint      NOT NULL,
  slot       int         NOT NULL,
  pruned_at  timestamptz NOT NULL DEFAULT now(),
  rollup     jsonb       NOT NULL DEFAULT '{}',
  PRIMARY KEY (ring, generation)
);

INSERT INTO :AWA_SCHEMA.ring_rotations (ring, generation, slot) VALUES ('queue', 0, 0), ('history', 0, 0);
