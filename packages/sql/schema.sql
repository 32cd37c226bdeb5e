-- The Awa schema as the migrations leave it: every table, index, view and function in its
-- current definition, read from the catalogs of a freshly migrated database (schema "awa").
-- Generated on PostgreSQL 17 (the default test server): do not edit. After adding a migration,
-- regenerate it with
--   npx vitest run packages/sql/test/Schema.test.ts -u
-- and review the diff with the migration.

-- ================================================================================================
-- Sequences
-- ================================================================================================

CREATE SEQUENCE awa.job_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;

CREATE SEQUENCE awa.key_grant_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;

CREATE SEQUENCE awa.lane_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;

CREATE SEQUENCE awa.pending_key_releases_id_seq AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;

CREATE SEQUENCE awa.shard_rotor AS bigint START 1 INCREMENT 1 MINVALUE 1 MAXVALUE 9223372036854775807 CACHE 1;

-- ================================================================================================
-- Tables
-- ================================================================================================

CREATE TABLE awa.attempt_state (
  job_id bigint NOT NULL,
  run_lease bigint NOT NULL,
  heartbeat_at timestamp with time zone NOT NULL,
  progress jsonb,
  callback_id text,
  callback_timeout_at timestamp with time zone,
  callback_config jsonb,
  callback_state text,
  callback_result jsonb,
  callback_waiting boolean DEFAULT false NOT NULL,
  parked_at timestamp with time zone,
  CONSTRAINT attempt_state_pkey PRIMARY KEY (job_id, run_lease)
)
WITH (fillfactor=80);
-- privileges besides the owner: owner only

CREATE TABLE awa.claim_marks (
  slot integer NOT NULL,
  generation bigint NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  next_lane_seq bigint NOT NULL
)
PARTITION BY LIST (slot);
-- partitions: claim_marks_0 … claim_marks_15, one per slot (FOR VALUES IN (k))
-- privileges besides the owner: owner only

CREATE TABLE awa.claim_spans (
  slot integer NOT NULL,
  generation bigint NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  first_lane_seq bigint NOT NULL,
  last_lane_seq bigint NOT NULL,
  claimed_at timestamp with time zone NOT NULL,
  deadline_at timestamp with time zone
)
PARTITION BY LIST (slot);
-- partitions: claim_spans_0 … claim_spans_15, one per slot (FOR VALUES IN (k))
-- privileges besides the owner: owner only

CREATE TABLE awa.claims (
  slot integer NOT NULL,
  generation bigint NOT NULL,
  job_id bigint NOT NULL,
  run_lease bigint NOT NULL,
  attempt integer NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  lane_seq bigint NOT NULL,
  claimed_at timestamp with time zone NOT NULL,
  deadline_at timestamp with time zone,
  key_policy text,
  key_digest bytea,
  key_seq bigint,
  key_horizon bigint,
  without_unique_key boolean,
  CONSTRAINT claims_pkey PRIMARY KEY (job_id, run_lease, slot)
)
PARTITION BY LIST (slot);
-- partitions: claims_0 … claims_15, one per slot (FOR VALUES IN (k))
-- privileges besides the owner: owner only

CREATE TABLE awa.closures (
  slot integer NOT NULL,
  generation bigint NOT NULL,
  job_id bigint NOT NULL,
  run_lease bigint NOT NULL,
  outcome text NOT NULL,
  closed_at timestamp with time zone NOT NULL,
  attempt integer,
  lane_seq bigint,
  CONSTRAINT closures_pkey PRIMARY KEY (job_id, run_lease, slot)
)
PARTITION BY LIST (slot);
-- partitions: closures_0 … closures_15, one per slot (FOR VALUES IN (k))
-- privileges besides the owner: owner only

CREATE TABLE awa.cron_schedules (
  name text NOT NULL,
  expression text NOT NULL,
  timezone text NOT NULL,
  kind text NOT NULL,
  queue text NOT NULL,
  args jsonb NOT NULL,
  options jsonb DEFAULT '{}'::jsonb NOT NULL,
  missed_fire text NOT NULL,
  catch_up_max integer,
  paused boolean DEFAULT false NOT NULL,
  paused_by text,
  paused_at timestamp with time zone,
  last_fire_at timestamp with time zone,
  last_job_id bigint,
  last_triggered_at timestamp with time zone,
  declared_at timestamp with time zone DEFAULT now() NOT NULL,
  updated_at timestamp with time zone DEFAULT now() NOT NULL,
  schedule_changed_at timestamp with time zone DEFAULT now() NOT NULL,
  last_declared_at timestamp with time zone DEFAULT now() NOT NULL,
  stale_since timestamp with time zone,
  CONSTRAINT cron_schedules_catch_up_max_check CHECK (((catch_up_max >= 1) AND (catch_up_max <= 1000))),
  CONSTRAINT cron_schedules_check CHECK (((missed_fire = 'catch_up'::text) = (catch_up_max IS NOT NULL))),
  CONSTRAINT cron_schedules_missed_fire_check CHECK ((missed_fire = ANY (ARRAY['coalesce'::text, 'catch_up'::text]))),
  CONSTRAINT cron_schedules_name_check CHECK (((char_length(name) >= 1) AND (char_length(name) <= 200))),
  CONSTRAINT cron_schedules_pkey PRIMARY KEY (name)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.deferred (
  job_id bigint NOT NULL,
  state text NOT NULL,
  kind text NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint DEFAULT 0 NOT NULL,
  args jsonb NOT NULL,
  metadata jsonb NOT NULL,
  tags text[] NOT NULL,
  errors jsonb NOT NULL,
  progress jsonb,
  attempt integer NOT NULL,
  run_lease bigint NOT NULL,
  max_attempts integer NOT NULL,
  run_at timestamp with time zone NOT NULL,
  created_at timestamp with time zone NOT NULL,
  unique_key bytea,
  unique_states integer DEFAULT 0 NOT NULL,
  CONSTRAINT deferred_pkey PRIMARY KEY (job_id),
  CONSTRAINT deferred_state_check CHECK ((state = ANY (ARRAY['scheduled'::text, 'retryable'::text])))
);
-- privileges besides the owner: owner only

CREATE TABLE awa.dlq (
  job_id bigint NOT NULL,
  kind text NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  args jsonb NOT NULL,
  metadata jsonb NOT NULL,
  tags text[] NOT NULL,
  errors jsonb NOT NULL,
  progress jsonb,
  attempt integer NOT NULL,
  max_attempts integer NOT NULL,
  original_run_lease bigint NOT NULL,
  run_at timestamp with time zone NOT NULL,
  created_at timestamp with time zone NOT NULL,
  dlq_at timestamp with time zone NOT NULL,
  dlq_reason text NOT NULL,
  unique_key bytea,
  unique_states integer DEFAULT 0 NOT NULL,
  CONSTRAINT dlq_pkey PRIMARY KEY (job_id)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.history (
  slot integer NOT NULL,
  generation bigint NOT NULL,
  job_id bigint NOT NULL,
  run_lease bigint NOT NULL,
  state text NOT NULL,
  attempt integer NOT NULL,
  max_attempts integer NOT NULL,
  kind text NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  args jsonb NOT NULL,
  metadata jsonb NOT NULL,
  tags text[] NOT NULL,
  errors jsonb NOT NULL,
  progress jsonb,
  run_at timestamp with time zone NOT NULL,
  created_at timestamp with time zone NOT NULL,
  finalized_at timestamp with time zone NOT NULL,
  unique_key bytea,
  unique_states integer DEFAULT 0 NOT NULL
)
PARTITION BY LIST (slot);
-- partitions: history_0 … history_31, one per slot (FOR VALUES IN (k))
-- privileges besides the owner: owner only

CREATE TABLE awa.history_copies (
  generation bigint NOT NULL,
  slot integer NOT NULL,
  terminal_rows bigint NOT NULL,
  rollup jsonb NOT NULL,
  keys jsonb,
  copied_at timestamp with time zone DEFAULT now() NOT NULL,
  CONSTRAINT history_copies_pkey PRIMARY KEY (generation)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.key_policies (
  id text NOT NULL,
  max_in_flight integer NOT NULL,
  target integer,
  epoch bigint DEFAULT 0 NOT NULL,
  state text DEFAULT 'active'::text NOT NULL,
  created_at timestamp with time zone DEFAULT now() NOT NULL,
  updated_at timestamp with time zone DEFAULT now() NOT NULL,
  CONSTRAINT key_policies_check CHECK (((state = 'draining'::text) = (target IS NOT NULL))),
  CONSTRAINT key_policies_id_check CHECK (((char_length(id) >= 1) AND (char_length(id) <= 200))),
  CONSTRAINT key_policies_max_in_flight_check CHECK ((max_in_flight >= 1)),
  CONSTRAINT key_policies_pkey PRIMARY KEY (id),
  CONSTRAINT key_policies_state_check CHECK ((state = ANY (ARRAY['active'::text, 'draining'::text, 'disabled'::text]))),
  CONSTRAINT key_policies_target_check CHECK ((target >= 1))
);
-- privileges besides the owner: owner only

CREATE TABLE awa.lanes (
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint DEFAULT 0 NOT NULL,
  CONSTRAINT lanes_pkey PRIMARY KEY (queue, priority, shard)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.maintenance_state (
  ring text NOT NULL,
  outcome text NOT NULL,
  reason text,
  since timestamp with time zone DEFAULT now() NOT NULL,
  CONSTRAINT maintenance_state_pkey PRIMARY KEY (ring)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.parked (
  job_id bigint NOT NULL,
  kind text NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  lane_seq bigint NOT NULL,
  args jsonb NOT NULL,
  metadata jsonb NOT NULL,
  tags text[] NOT NULL,
  errors jsonb NOT NULL,
  progress jsonb,
  attempt integer NOT NULL,
  run_lease bigint NOT NULL,
  max_attempts integer NOT NULL,
  run_at timestamp with time zone NOT NULL,
  created_at timestamp with time zone NOT NULL,
  unique_key bytea,
  unique_states integer DEFAULT 0 NOT NULL,
  parked_at timestamp with time zone DEFAULT now() NOT NULL,
  CONSTRAINT parked_pkey PRIMARY KEY (queue, priority, shard, lane_seq)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.pending_key_releases (
  id bigint GENERATED ALWAYS AS IDENTITY NOT NULL,
  ring text NOT NULL,
  generation bigint NOT NULL,
  keys jsonb NOT NULL,
  recorded_at timestamp with time zone DEFAULT now() NOT NULL,
  CONSTRAINT pending_key_releases_pkey PRIMARY KEY (id)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.queue_meta (
  queue text NOT NULL,
  paused boolean DEFAULT false NOT NULL,
  completed_retention interval,
  failed_retention interval,
  cancelled_retention interval,
  updated_at timestamp with time zone DEFAULT now() NOT NULL,
  dlq_enabled boolean,
  dlq_retention interval,
  overrides jsonb,
  enqueue_shards smallint DEFAULT 1 NOT NULL,
  CONSTRAINT queue_meta_enqueue_shards_check CHECK (((enqueue_shards >= 1) AND (enqueue_shards <= 64))),
  CONSTRAINT queue_meta_pkey PRIMARY KEY (queue)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.queue_samples (
  sampled_at timestamp with time zone NOT NULL,
  queue text NOT NULL,
  enqueued bigint NOT NULL,
  completed bigint NOT NULL,
  failed bigint NOT NULL,
  cancelled bigint NOT NULL,
  completed_total bigint NOT NULL,
  failed_total bigint NOT NULL,
  cancelled_total bigint NOT NULL,
  CONSTRAINT queue_samples_pkey PRIMARY KEY (sampled_at, queue)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.rate_marks (
  queue text NOT NULL,
  tat double precision NOT NULL,
  marked_at timestamp with time zone DEFAULT now() NOT NULL
);
-- privileges besides the owner: owner only

CREATE TABLE awa.ready (
  slot integer NOT NULL,
  generation bigint NOT NULL,
  job_id bigint NOT NULL,
  kind text NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint DEFAULT 0 NOT NULL,
  lane_seq bigint NOT NULL,
  args jsonb NOT NULL,
  metadata jsonb NOT NULL,
  tags text[] NOT NULL,
  errors jsonb NOT NULL,
  progress jsonb,
  attempt integer NOT NULL,
  run_lease bigint NOT NULL,
  max_attempts integer NOT NULL,
  run_at timestamp with time zone NOT NULL,
  created_at timestamp with time zone NOT NULL,
  unique_key bytea,
  unique_states integer DEFAULT 0 NOT NULL,
  CONSTRAINT ready_pkey PRIMARY KEY (queue, priority, shard, lane_seq, slot)
)
PARTITION BY LIST (slot);
-- partitions: ready_0 … ready_15, one per slot (FOR VALUES IN (k))
-- privileges besides the owner: owner only

CREATE TABLE awa.ready_tombstones (
  slot integer NOT NULL,
  generation bigint NOT NULL,
  job_id bigint NOT NULL,
  queue text NOT NULL,
  priority smallint NOT NULL,
  shard smallint NOT NULL,
  lane_seq bigint NOT NULL,
  created_at timestamp with time zone DEFAULT now() NOT NULL
)
PARTITION BY LIST (slot);
-- partitions: ready_tombstones_0 … ready_tombstones_15, one per slot (FOR VALUES IN (k))
-- privileges besides the owner: owner only

CREATE TABLE awa.ring_ledger_totals (
  ring text NOT NULL,
  prunes bigint DEFAULT 0 NOT NULL,
  through_generation bigint DEFAULT '-1'::integer NOT NULL,
  rollup jsonb DEFAULT '{}'::jsonb NOT NULL,
  updated_at timestamp with time zone DEFAULT now() NOT NULL,
  CONSTRAINT ring_ledger_totals_pkey PRIMARY KEY (ring)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.ring_prunes (
  ring text NOT NULL,
  generation bigint NOT NULL,
  slot integer NOT NULL,
  pruned_at timestamp with time zone DEFAULT now() NOT NULL,
  rollup jsonb DEFAULT '{}'::jsonb NOT NULL,
  CONSTRAINT ring_prunes_pkey PRIMARY KEY (ring, generation)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.ring_rotations (
  ring text NOT NULL,
  generation bigint NOT NULL,
  slot integer NOT NULL,
  rotated_at timestamp with time zone DEFAULT now() NOT NULL,
  CONSTRAINT ring_rotations_pkey PRIMARY KEY (ring, generation)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.schema_version (
  version integer NOT NULL,
  name text NOT NULL,
  breaking boolean DEFAULT false NOT NULL,
  applied_at timestamp with time zone DEFAULT now() NOT NULL,
  CONSTRAINT schema_version_pkey PRIMARY KEY (version)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.settings (
  key text NOT NULL,
  value jsonb NOT NULL,
  updated_at timestamp with time zone DEFAULT now() NOT NULL,
  CONSTRAINT settings_pkey PRIMARY KEY (key)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.stat_samples (
  sampled_at timestamp with time zone NOT NULL,
  job_id_hw bigint NOT NULL,
  counted_through bigint NOT NULL,
  enqueued_from timestamp with time zone,
  enqueued_until timestamp with time zone,
  CONSTRAINT stat_samples_pkey PRIMARY KEY (sampled_at)
);
-- privileges besides the owner: owner only

CREATE TABLE awa.terminal (
  slot integer NOT NULL,
  generation bigint NOT NULL,
  job_id bigint NOT NULL,
  run_lease bigint NOT NULL,
  lane_seq bigint,
  state text NOT NULL,
  attempt integer NOT NULL,
  finalized_at timestamp with time zone NOT NULL,
  errors jsonb,
  progress jsonb,
  wide boolean DEFAULT false NOT NULL,
  kind text,
  queue text,
  priority smallint,
  args jsonb,
  metadata jsonb,
  tags text[],
  max_attempts integer,
  run_at timestamp with time zone,
  created_at timestamp with time zone,
  unique_key bytea,
  unique_states integer
)
PARTITION BY LIST (slot);
-- partitions: terminal_0 … terminal_15, one per slot (FOR VALUES IN (k))
-- privileges besides the owner: owner only

CREATE TABLE awa.unique_claims (
  unique_key bytea NOT NULL,
  job_id bigint NOT NULL,
  CONSTRAINT unique_claims_pkey PRIMARY KEY (unique_key)
);
-- privileges besides the owner: owner only

-- ================================================================================================
-- Indexes (those not backing a constraint)
-- ================================================================================================

CREATE INDEX attempt_state_callback_timeout ON awa.attempt_state USING btree (callback_timeout_at) WHERE (callback_state = 'pending'::text);

CREATE INDEX attempt_state_resumed ON awa.attempt_state USING btree (job_id) WHERE (callback_waiting AND (callback_state = 'resumed'::text));

CREATE INDEX claim_marks_queue_priority_shard_next_lane_seq_idx ON ONLY awa.claim_marks USING btree (queue, priority, shard, next_lane_seq DESC);

CREATE INDEX claim_spans_claimed_at_idx ON ONLY awa.claim_spans USING btree (claimed_at);

CREATE INDEX claim_spans_deadline_at_idx ON ONLY awa.claim_spans USING btree (deadline_at) WHERE (deadline_at IS NOT NULL);

CREATE INDEX claims_key_seq_idx ON ONLY awa.claims USING btree (key_policy, key_digest, key_seq) WHERE (key_policy IS NOT NULL);

CREATE INDEX deferred_due ON awa.deferred USING btree (run_at, job_id) WHERE (state = ANY (ARRAY['scheduled'::text, 'retryable'::text]));

CREATE INDEX dlq_by_kind ON awa.dlq USING btree (kind, dlq_at);

CREATE INDEX dlq_by_queue ON awa.dlq USING btree (queue, dlq_at);

CREATE INDEX dlq_by_time ON awa.dlq USING btree (dlq_at);

CREATE INDEX history_job_id_idx ON ONLY awa.history USING btree (job_id);

CREATE INDEX history_queue_state_finalized_at_idx ON ONLY awa.history USING btree (queue, state, finalized_at);

CREATE INDEX parked_job_id_idx ON awa.parked USING btree (job_id);

CREATE INDEX rate_marks_queue_tat ON awa.rate_marks USING btree (queue, tat DESC);

CREATE INDEX ready_job_id_idx ON ONLY awa.ready USING btree (job_id);

CREATE INDEX ready_tombstones_job_id_idx ON ONLY awa.ready_tombstones USING btree (job_id);

CREATE INDEX ready_tombstones_queue_priority_shard_lane_seq_idx ON ONLY awa.ready_tombstones USING btree (queue, priority, shard, lane_seq);

CREATE INDEX terminal_job_id_idx ON ONLY awa.terminal USING btree (job_id);

CREATE INDEX unique_claims_job_id_idx ON awa.unique_claims USING btree (job_id);

-- ================================================================================================
-- Views
-- ================================================================================================

CREATE VIEW awa.job_representations AS
 SELECT q.job_id,
    0 AS rank,
    'failed'::text AS state,
    q.kind,
    q.queue,
    q.priority,
    q.args,
    q.metadata,
    q.tags,
    q.errors,
    q.progress,
    q.attempt,
    q.max_attempts,
    q.original_run_lease AS run_lease,
    q.run_at,
    q.created_at,
    q.dlq_at AS finalized_at,
    q.dlq_reason
   FROM awa.dlq q
UNION ALL
 SELECT d.job_id,
    1 AS rank,
    d.state,
    d.kind,
    d.queue,
    d.priority,
    d.args,
    d.metadata,
    d.tags,
    d.errors,
    d.progress,
    d.attempt,
    d.max_attempts,
    d.run_lease,
    d.run_at,
    d.created_at,
    NULL::timestamp with time zone AS finalized_at,
    NULL::text AS dlq_reason
   FROM awa.deferred d
UNION ALL
 SELECT c.job_id,
    2 AS rank,
        CASE
            WHEN a.callback_waiting AND a.callback_state = 'pending'::text THEN 'waiting_external'::text
            ELSE 'running'::text
        END AS state,
    r.kind,
    r.queue,
    r.priority,
    r.args,
    r.metadata,
    r.tags,
    r.errors,
    COALESCE(a.progress, r.progress) AS progress,
    c.attempt,
    r.max_attempts,
    c.run_lease,
    r.run_at,
    r.created_at,
    NULL::timestamp with time zone AS finalized_at,
    NULL::text AS dlq_reason
   FROM awa.claims c
     JOIN awa.ready r ON r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard AND r.lane_seq = c.lane_seq AND r.slot = c.slot
     LEFT JOIN awa.attempt_state a ON a.job_id = c.job_id AND a.run_lease = c.run_lease
  WHERE NOT (EXISTS ( SELECT 1
           FROM awa.closures z
          WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease))
UNION ALL
 SELECT r.job_id,
    3 AS rank,
    'available'::text AS state,
    r.kind,
    r.queue,
    r.priority,
    r.args,
    r.metadata,
    r.tags,
    r.errors,
    r.progress,
    r.attempt,
    r.max_attempts,
    r.run_lease,
    r.run_at,
    r.created_at,
    NULL::timestamp with time zone AS finalized_at,
    NULL::text AS dlq_reason
   FROM awa.ready r
  WHERE NOT (EXISTS ( SELECT 1
           FROM awa.claims c
          WHERE c.job_id = r.job_id AND c.lane_seq = r.lane_seq)) AND NOT (EXISTS ( SELECT 1
           FROM awa.ready_tombstones t
          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq))
UNION ALL
 SELECT p.job_id,
    3 AS rank,
    'available'::text AS state,
    p.kind,
    p.queue,
    p.priority,
    p.args,
    p.metadata,
    p.tags,
    p.errors,
    p.progress,
    p.attempt,
    p.max_attempts,
    p.run_lease,
    p.run_at,
    p.created_at,
    NULL::timestamp with time zone AS finalized_at,
    NULL::text AS dlq_reason
   FROM awa.parked p
UNION ALL
 SELECT t.job_id,
    4 AS rank,
    t.state,
    COALESCE(t.kind, r.kind) AS kind,
    COALESCE(t.queue, r.queue) AS queue,
    COALESCE(t.priority, r.priority) AS priority,
    COALESCE(t.args, r.args) AS args,
    COALESCE(t.metadata, r.metadata) AS metadata,
    COALESCE(t.tags, r.tags) AS tags,
    COALESCE(t.errors, r.errors) AS errors,
    t.progress,
    t.attempt,
    COALESCE(t.max_attempts, r.max_attempts) AS max_attempts,
    t.run_lease,
    COALESCE(t.run_at, r.run_at) AS run_at,
    COALESCE(t.created_at, r.created_at) AS created_at,
    t.finalized_at,
    NULL::text AS dlq_reason
   FROM awa.terminal_records t
     LEFT JOIN awa.ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
UNION ALL
 SELECT h.job_id,
    4 AS rank,
    h.state,
    h.kind,
    h.queue,
    h.priority,
    h.args,
    h.metadata,
    h.tags,
    h.errors,
    h.progress,
    h.attempt,
    h.max_attempts,
    h.run_lease,
    h.run_at,
    h.created_at,
    h.finalized_at,
    NULL::text AS dlq_reason
   FROM awa.history h;
-- privileges besides the owner: owner only

CREATE VIEW awa.jobs AS
 SELECT DISTINCT ON (job_id) job_id,
    state,
    kind,
    queue,
    priority,
    args,
    metadata,
    tags,
    errors,
    progress,
    attempt,
    max_attempts,
    run_lease,
    run_at,
    created_at,
    finalized_at,
    dlq_reason
   FROM awa.job_representations j
  ORDER BY job_id, rank, run_lease DESC, finalized_at DESC NULLS LAST;
-- privileges besides the owner: owner only

CREATE VIEW awa.terminal_records AS
 SELECT t.slot,
    t.generation,
    t.job_id,
    t.run_lease,
    t.lane_seq,
    t.state,
    t.attempt,
    t.finalized_at,
    t.errors,
    t.progress,
    t.wide,
    t.kind,
    t.queue,
    t.priority,
    t.args,
    t.metadata,
    t.tags,
    t.max_attempts,
    t.run_at,
    t.created_at,
    t.unique_key,
    t.unique_states
   FROM awa.terminal t
UNION ALL
 SELECT z.slot,
    z.generation,
    z.job_id,
    z.run_lease,
    z.lane_seq,
    'completed'::text AS state,
    z.attempt,
    z.closed_at AS finalized_at,
    NULL::jsonb AS errors,
    NULL::jsonb AS progress,
    false AS wide,
    NULL::text AS kind,
    NULL::text AS queue,
    NULL::smallint AS priority,
    NULL::jsonb AS args,
    NULL::jsonb AS metadata,
    NULL::text[] AS tags,
    NULL::integer AS max_attempts,
    NULL::timestamp with time zone AS run_at,
    NULL::timestamp with time zone AS created_at,
    NULL::bytea AS unique_key,
    NULL::integer AS unique_states
   FROM awa.closures z
  WHERE z.lane_seq IS NOT NULL;
-- privileges besides the owner: owner only

-- ================================================================================================
-- Functions (who may execute them, after each)
-- ================================================================================================

CREATE OR REPLACE FUNCTION awa.append_error(p_errors jsonb, p_entry jsonb)
 RETURNS jsonb
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  -- keep the newest 100 entries
  SELECT coalesce(jsonb_agg(e ORDER BY n), '[]'::jsonb)
  FROM jsonb_array_elements(coalesce(p_errors, '[]'::jsonb) || jsonb_build_array(p_entry)) WITH ORDINALITY AS x(e, n)
  WHERE n > jsonb_array_length(coalesce(p_errors, '[]'::jsonb)) + 1 - 100
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.attempt_key(p_job_id bigint, p_run_lease bigint)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT hashint8extended(p_job_id, hashtext('awa:attempt') + p_run_lease) $function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.backoff_ms(p_attempt integer, p_random double precision)
 RETURNS bigint
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  SELECT CASE WHEN base >= 86400000 THEN 86400000::bigint
              ELSE floor(base + (least(base * 1.25, 86400000) - base) * p_random)::bigint END
  FROM (SELECT least(power(2::numeric, least(p_attempt, 40)) * 1000, 86400000) AS base) b
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.callback_attempt(p_callback_id text, OUT job_id bigint, OUT run_lease bigint)
 RETURNS record
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  SELECT split_part(p_callback_id, '.', 1)::bigint, split_part(p_callback_id, '.', 2)::bigint
  WHERE p_callback_id ~ '^[0-9]{1,18}\.[0-9]{1,18}\.[0-9a-f]{32}$'
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.callback_info(p_callback_id text, OUT status text, OUT job_id bigint, OUT run_lease bigint, OUT config jsonb, OUT waiting boolean, OUT result jsonb)
 RETURNS record
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_state attempt_state%ROWTYPE;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'callback_info needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  SELECT x.job_id, x.run_lease INTO job_id, run_lease FROM callback_attempt(p_callback_id) x;
  IF job_id IS NULL THEN
    status := 'not_found';
    RETURN;
  END IF;
  SELECT * INTO v_state FROM attempt_state a WHERE a.job_id = callback_info.job_id AND a.run_lease = callback_info.run_lease;
  IF FOUND AND v_state.callback_id = p_callback_id
     AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = callback_info.job_id AND z.run_lease = callback_info.run_lease) THEN
    status := v_state.callback_state;
    config := v_state.callback_config;
    waiting := v_state.callback_waiting;
    result := v_state.callback_result;
  ELSIF EXISTS (SELECT 1 FROM claims c WHERE c.job_id = callback_info.job_id AND c.run_lease = callback_info.run_lease) THEN
    status := 'stale';
  ELSE
    status := 'not_found';
  END IF;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.cancel_by_unique_key(p_key text, p_reason text)
 RETURNS bigint
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_job_id bigint;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'cancel_by_unique_key needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  SELECT u.job_id INTO v_job_id FROM unique_claims u WHERE u.unique_key = decode(p_key, 'hex');
  IF v_job_id IS NULL THEN
    RETURN NULL;
  END IF;
  IF cancel_job(v_job_id, p_reason) = 'cancelled' THEN
    RETURN v_job_id;
  END IF;
  RETURN NULL;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.cancel_callback(p_job_id bigint, p_run_lease bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'cancel_callback needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF lock_attempt(p_job_id, p_run_lease) <> 'open' THEN
    RETURN false;
  END IF;
  UPDATE attempt_state a SET callback_id = NULL, callback_state = NULL, callback_timeout_at = NULL,
                             callback_config = NULL, callback_result = NULL, callback_waiting = false,
                             heartbeat_at = now()
  WHERE a.job_id = p_job_id AND a.run_lease = p_run_lease AND a.callback_state = 'pending';
  RETURN FOUND;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.cancel_job(p_job_id bigint, p_reason text)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_job record;
  v_row record;
  v_ring record;
  v_try int;
  v_state text;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'cancel_job needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  FOR v_try IN 1 .. 100 LOOP
    SELECT * INTO v_job FROM jobs j WHERE j.job_id = p_job_id;
    IF NOT FOUND THEN
      RETURN NULL;
    END IF;
    IF v_job.state IN ('completed', 'failed', 'cancelled') THEN
      RETURN 'terminal:' || v_job.state;
    END IF;

    IF v_job.state IN ('scheduled', 'retryable') THEN
      DELETE FROM deferred d WHERE d.job_id = p_job_id RETURNING d.* INTO v_row;
      IF FOUND THEN
        SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('terminal');
        INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                              kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
        VALUES (v_ring.slot, v_ring.generation, p_job_id, v_row.run_lease, 'cancelled', v_row.attempt, v_now,
                append_error(v_row.errors, jsonb_build_object('error', 'cancelled: ' || p_reason, 'attempt', v_row.attempt, 'at', v_now)),
                v_row.progress, true, v_row.kind, v_row.queue, v_row.priority, v_row.args, v_row.metadata, v_row.tags,
                v_row.max_attempts, v_row.run_at, v_row.created_at, v_row.unique_key, v_row.unique_states);
        DELETE FROM unique_claims u WHERE u.unique_key = v_row.unique_key AND u.job_id = p_job_id
          AND (v_row.unique_states & state_bit('cancelled')) = 0;
        RETURN 'cancelled';
      END IF;

    ELSIF v_job.state = 'running' THEN
      SELECT f.state INTO v_state
      FROM finalize(jsonb_build_array(jsonb_build_object('job_id', p_job_id, 'run_lease', v_job.run_lease,
                                                         'outcome', 'cancel', 'message', p_reason))) f
      WHERE f.applied;
      IF FOUND THEN
        PERFORM pg_notify('awa_cancel_awa', p_job_id || ':' || v_job.run_lease);
        -- 0036: a cancelled keyed attempt freed a grant: wake its queue's gated claimers (at commit)
        -- 0050: and those of every queue under its key policy, in every process (same read)
        PERFORM pg_notify('awa_wake_awa', c.queue), -- 0050
                pg_notify('awa_cancel_awa', 'key-closed:' || c.key_policy) FROM claims c -- 0050
        WHERE c.job_id = p_job_id AND c.run_lease = v_job.run_lease AND c.key_policy IS NOT NULL LIMIT 1; -- 0036
        RETURN v_state;
      END IF;

    ELSIF v_job.state = 'available' THEN
      -- Parked (0021): out of the ring. The lane's claim lock keeps unpark away while we delete it.
      SELECT p.queue, p.priority, p.shard INTO v_row FROM parked p WHERE p.job_id = p_job_id;
      IF FOUND THEN
        PERFORM pg_advisory_xact_lock(lock_ns('claim'), lane_key(v_row.queue, v_row.priority, v_row.shard));
        DELETE FROM parked p WHERE p.job_id = p_job_id RETURNING p.* INTO v_row;
        IF FOUND THEN
          SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('terminal');
          INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                                kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
          VALUES (v_ring.slot, v_ring.generation, p_job_id, v_row.run_lease, 'cancelled', v_row.attempt, v_now,
                  append_error(v_row.errors, jsonb_build_object('error', 'cancelled: ' || p_reason, 'attempt', v_row.attempt, 'at', v_now)),
                  v_row.progress, true, v_row.kind, v_row.queue, v_row.priority, v_row.args, v_row.metadata, v_row.tags,
                  v_row.max_attempts, v_row.run_at, v_row.created_at, v_row.unique_key, v_row.unique_states);
          DELETE FROM unique_claims u WHERE u.unique_key = v_row.unique_key AND u.job_id = p_job_id
            AND (v_row.unique_states & state_bit('cancelled')) = 0;
          RETURN 'cancelled';
        END IF;
        CONTINUE; -- brought back into the ring meanwhile: look again
      END IF;
      SELECT r.* INTO v_row FROM ready r
      WHERE r.job_id = p_job_id AND r.run_lease = v_job.run_lease
        AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.job_id = r.job_id AND c.lane_seq = r.lane_seq)
      ORDER BY r.lane_seq DESC LIMIT 1;
      IF FOUND THEN
        PERFORM pg_advisory_xact_lock(lock_ns('claim'), lane_key(v_row.queue, v_row.priority, v_row.shard));
        -- new statement after the claim lock: sees any claim that committed before we got it
        IF v_row.lane_seq >= lane_cursor(v_row.queue, v_row.priority, v_row.shard) THEN
          INSERT INTO ready_tombstones (slot, generation, job_id, queue, priority, shard, lane_seq)
          VALUES (v_row.slot, v_row.generation, p_job_id, v_row.queue, v_row.priority, v_row.shard, v_row.lane_seq);
          INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                                kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
          VALUES (v_row.slot, v_row.generation, p_job_id, v_row.run_lease, 'cancelled', v_row.attempt, v_now,
                  append_error(v_row.errors, jsonb_build_object('error', 'cancelled: ' || p_reason, 'attempt', v_row.attempt, 'at', v_now)),
                  v_row.progress, true, v_row.kind, v_row.queue, v_row.priority, v_row.args, v_row.metadata, v_row.tags,
                  v_row.max_attempts, v_row.run_at, v_row.created_at, v_row.unique_key, v_row.unique_states);
          DELETE FROM unique_claims u WHERE u.unique_key = v_row.unique_key AND u.job_id = p_job_id
            AND (v_row.unique_states & state_bit('cancelled')) = 0;
          RETURN 'cancelled';
        END IF;
      END IF;
    END IF;
    -- The job moved on between our read and our write (promoted, claimed, finished): look again.
  END LOOP;
  RAISE EXCEPTION 'cancel_job(%): job kept changing state', p_job_id USING ERRCODE = '40001';
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.claim(p_queue text, p_max integer, p_deadline_ms bigint, p_aging_ms bigint)
 RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, deadline_at timestamp with time zone, progress jsonb)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET enable_material TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_deadline timestamptz := CASE WHEN p_deadline_ms > 0 THEN now() + p_deadline_ms * interval '1 millisecond' END;
  v_left int := p_max;
  v_prios smallint[];
  v_shards smallint[];
  v_k int;
  v_cursor bigint;
  v_n int;
  v_ordered boolean := false;
  v_may_wait boolean := true; -- 0025: one wait (100 ms at most) per call for a lane another claimer holds
  v_locked boolean; -- 0025: this lane's claim lock is ours
  v_saved_timeout text := current_setting('lock_timeout');
  -- the queue ring's slots that can hold rows (queue_slot_ranges), read once per call
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
  v_gen bigint; -- 0047: the queue ring's newest generation when v_lo1 … were read
  v_gen_seen bigint; -- 0047: and as the cursor statement saw it
  v_got int; -- 0024: rows returned for the current lane, over its picks
  v_keyed boolean; -- 0024: the last pick left out rows whose key is taken at claim
  v_mark bigint; -- 0024: the lane's cursor after that pick
  -- 0042: the slot ranges for the ranking's head probes, read before it (the pick's own, v_lo1 …,
  -- are still read after its lane's cursor: a range read earlier could miss a row carried since,
  -- and the mark would pass it; a ranking that misses a head only leaves the lane for a later call)
  v_rlo1 int; -- 0042
  v_rhi1 int; -- 0042
  v_rlo2 int; -- 0042
  v_rhi2 int; -- 0042
  v_j int; -- 0042: the last lane of a busy lane's run of same-priority lanes
  v_passed text[] := '{}'; -- 0042: busy lanes moved behind their shards ('priority:shard')
  v_picked ready[]; -- 0063: the lane's picked rows, in lane order
  v_part ready[]; -- 0063: one slot's candidates
  v_merged boolean; -- 0063: more than one slot answered
  v_s int; -- 0063: a live slot
  v_probe_from bigint; -- 0065: a busy lane's cursor, as the probe read it
  v_head boolean; -- 0065: the busy lane has a claimable head
  v_cursors bigint[]; -- 0066: the lanes' cursors, beside v_prios and v_shards
  v_heads ready[]; -- 0066: the lanes' first claimable rows, one per lane and live slot at most
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  -- 0062: the claim commits without waiting for its WAL to reach disk, unless this transaction
  -- wrote before it (a caller's own writes keep their durability); see the header
  IF pg_current_xact_id_if_assigned() IS NULL THEN -- 0062
    PERFORM set_config('synchronous_commit', 'off', true); -- 0062
  END IF; -- 0062
  IF p_max <= 0 THEN
    RETURN;
  END IF;
  -- the queue's lanes; none when it is paused
  SELECT array_agg(l.priority), array_agg(l.shard) INTO v_prios, v_shards FROM lanes l
  WHERE l.queue = p_queue AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused);
  IF v_prios IS NULL THEN
    RETURN;
  END IF;
  IF cardinality(v_prios) > 1 THEN
    v_ordered := true;
    -- Several lanes: those with a claimable head, in claim order. (With one lane the order is
    -- trivial and the pick below finds out whether it has anything.)
    SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_rlo1, v_rhi1, v_rlo2, v_rhi2 FROM queue_slot_ranges() s; -- 0042
    -- 0042: the cursors by a lateral read of claim_marks (lane_cursor's query), not a call of
    -- lane_cursor per lane: its SET clauses and its own executor start cost ~0.1 ms a lane, so a
    -- claim of an 8-shard queue ran at a third of one lane's rate (pgbench, one client).
    SELECT array_agg(l.priority), array_agg(l.shard), array_agg(coalesce(mk.c, 0)) -- 0066
      INTO v_prios, v_shards, v_cursors -- 0066
    FROM lanes l
    LEFT JOIN LATERAL (SELECT m.next_lane_seq AS c FROM claim_marks m -- 0042
                       WHERE m.queue = l.queue AND m.priority = l.priority AND m.shard = l.shard -- 0042
                         AND (m.slot BETWEEN v_rlo1 AND v_rhi1 OR m.slot BETWEEN v_rlo2 AND v_rhi2) -- 0047
                       ORDER BY m.next_lane_seq DESC LIMIT 1) mk ON true -- 0042
    WHERE l.queue = p_queue;
    -- 0066: each lane's first claimable row in each live slot, through that slot's own function
    -- (lane_heads_<slot>, see the header); a lane's head is the first of them in lane order
    v_heads := '{}'; -- 0066
    FOR v_s IN v_rlo1 .. v_rhi1 LOOP -- 0066
      v_heads := v_heads || lane_heads_in_slot(v_s, p_queue, v_prios, v_shards, v_cursors); -- 0066
    END LOOP; -- 0066
    FOR v_s IN v_rlo2 .. v_rhi2 LOOP -- 0066: empty when lo2 > hi2
      v_heads := v_heads || lane_heads_in_slot(v_s, p_queue, v_prios, v_shards, v_cursors); -- 0066
    END LOOP; -- 0066
    SELECT array_agg(o.priority ORDER BY o.n), array_agg(o.shard ORDER BY o.n) INTO v_prios, v_shards
    FROM (
      SELECT head.priority, head.shard,
             row_number() OVER (ORDER BY CASE WHEN p_aging_ms > 0
                                              THEN greatest(1, head.priority - floor(extract(epoch FROM (v_now - head.run_at)) * 1000 / p_aging_ms))
                                              ELSE head.priority END,
                                         head.run_at, head.priority, head.shard) AS n
      FROM (SELECT DISTINCT ON (h.priority, h.shard) h.priority, h.shard, h.run_at -- 0066
            FROM unnest(v_heads) h ORDER BY h.priority, h.shard, h.lane_seq) head -- 0066
    ) o;
    IF v_prios IS NULL THEN
      RETURN;
    END IF;
  END IF;

  -- 0025: one pass over the lanes in rank order. A lane whose claim lock another claimer holds (a
  -- claim in flight: a few ms) is waited for, up to 100 ms and once per call, instead of skipped:
  -- skipping it took a worse-ranked lane's jobs while better-ranked ones waited (priority
  -- inversion under concurrent claimers). A lane still held after the wait, and any busy lane
  -- after it, is skipped, and the batch fills from the next lanes in order, so a claimer stuck
  -- behind a slow one never idles a poll interval for it. (0009 to 0024: pass 1 skipped busy
  -- lanes and claimed the rest at once; pass 2 waited only when pass 1 had claimed nothing.)
  v_k := 0; -- 0042: a WHILE over the lanes, whose order a busy shard may change (below)
  WHILE v_k < cardinality(v_prios) LOOP -- 0042
    v_k := v_k + 1; -- 0042
    EXIT WHEN v_left <= 0;
    -- = lane_key(p_queue, priority, shard), written with immutable operators so it is inlined
    -- (the SQL function is planned again on every call, as 0012 found for enqueue)
    v_locked := pg_try_advisory_xact_lock(lock_ns('claim'),
                                          hashtext(p_queue || chr(31) || v_prios[v_k]::text || chr(31) || v_shards[v_k]::text));
    IF NOT v_locked THEN
      -- With one lane the ordering query was skipped: wait for the busy lane only if it has
      -- a claimable head, as with several lanes (an idle queue still answers empty at once).
      -- 0065: the probe reads the live slots (the ranking's ranges) and each slot through its own
      -- function, lane_picks_<slot> (0063), from the lane's cursor; see the header. It needs no
      -- exact answer: a head it misses leaves the lane for a later call, a head it sees that is
      -- taken by then costs one wait of 100 ms at most.
      IF NOT v_ordered THEN -- 0065
        IF v_rlo1 IS NULL THEN -- 0065
          SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_rlo1, v_rhi1, v_rlo2, v_rhi2 FROM queue_slot_ranges() s; -- 0065
        END IF; -- 0065
        SELECT m.next_lane_seq INTO v_probe_from FROM claim_marks m -- 0065
        WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k] -- 0065
          AND (m.slot BETWEEN v_rlo1 AND v_rhi1 OR m.slot BETWEEN v_rlo2 AND v_rhi2) -- 0065
        ORDER BY m.next_lane_seq DESC LIMIT 1; -- 0065
        v_head := false; -- 0065
        FOR v_s IN v_rlo1 .. v_rhi1 LOOP -- 0065
          v_head := coalesce(cardinality(lane_picks_in_slot(v_s, p_queue, v_prios[v_k], v_shards[v_k], coalesce(v_probe_from, 0), 1)), 0) > 0; -- 0065
          EXIT WHEN v_head; -- 0065
        END LOOP; -- 0065
        FOR v_s IN v_rlo2 .. v_rhi2 LOOP -- 0065: empty when lo2 > hi2
          EXIT WHEN v_head; -- 0065
          v_head := coalesce(cardinality(lane_picks_in_slot(v_s, p_queue, v_prios[v_k], v_shards[v_k], coalesce(v_probe_from, 0), 1)), 0) > 0; -- 0065
        END LOOP; -- 0065
        CONTINUE WHEN NOT v_head; -- 0065
      END IF; -- 0065
      -- 0042: a busy lane followed in the order by lanes of the same priority (other shards of
      -- the queue, capabilities.md §22: not ordered among themselves) goes behind them, once,
      -- instead of being waited for: its claimer is taking its jobs, and this one takes the next
      -- shard's. Met again after them, it is waited for as below (rank order across priorities
      -- is kept: the move never passes a lane of another priority).
      IF v_prios[v_k + 1] = v_prios[v_k] AND NOT (v_prios[v_k] || ':' || v_shards[v_k]) = ANY (v_passed) THEN -- 0042
        v_j := v_k + 1; -- 0042
        WHILE v_prios[v_j + 1] = v_prios[v_k] LOOP -- 0042
          v_j := v_j + 1; -- 0042
        END LOOP; -- 0042
        v_passed := v_passed || (v_prios[v_k] || ':' || v_shards[v_k]); -- 0042
        v_prios := v_prios[1:v_k - 1] || v_prios[v_k + 1:v_j] || v_prios[v_k] || v_prios[v_j + 1:]; -- 0042
        v_shards := v_shards[1:v_k - 1] || v_shards[v_k + 1:v_j] || v_shards[v_k] || v_shards[v_j + 1:]; -- 0042
        v_k := v_k - 1; -- 0042: the lane now at v_k is the next one
        CONTINUE; -- 0042
      END IF; -- 0042
      CONTINUE WHEN NOT v_may_wait; -- 0025
      v_may_wait := false; -- 0025
      BEGIN
        PERFORM set_config('lock_timeout', '100ms', true);
        PERFORM pg_advisory_xact_lock(lock_ns('claim'),
                                      hashtext(p_queue || chr(31) || v_prios[v_k]::text || chr(31) || v_shards[v_k]::text));
        PERFORM set_config('lock_timeout', v_saved_timeout, true);
        v_locked := true; -- 0025
      EXCEPTION WHEN lock_not_available THEN
        -- still held after 100 ms: on to the next lane (0025; the setting rolls back with the block)
        v_locked := false;
      END;
      CONTINUE WHEN NOT v_locked; -- 0025
    END IF;
    v_got := 0; -- 0024
    LOOP -- 0024: once more after a pick that superseded rows (see Keys at claim below)
    -- 0047: the slots that can hold this lane's marks and rows (see Slots above), with the
    -- newest generation, in one snapshot; once per call, after the first lane lock.
    IF v_lo1 IS NULL THEN
      SELECT (SELECT r.generation FROM ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1), -- 0047
             s.lo1, s.hi1, s.lo2, s.hi2 INTO v_gen, v_lo1, v_hi1, v_lo2, v_hi2 -- 0047
      FROM queue_slot_ranges() s; -- 0047: STABLE: its statements read this statement's snapshot
    END IF;
    -- The cursor, in its own statement after the lane lock (see Guard and Mark slot above).
    -- ORDER BY … LIMIT 1 rather than max(): the same index scans, planned once instead of
    -- twice (max() is planned as an aggregate and as this query); re-planned after every
    -- prune, whose TRUNCATE invalidates cached plans.
    -- 0047: read in the live slots only (start-up pruning then opens their claim_marks children
    -- instead of all sixteen: ~0.07 ms of a claim(1)), with the newest generation as this
    -- statement sees it. That is sound while no rotation committed since the ranges were read:
    -- every retained mark lies in an unpruned slot no newer than the newest generation, and a
    -- prune that committed in between carried its marks into the current slot, which the ranges
    -- hold. After a rotation (a mark, ours or a carried one, may sit in a slot the ranges do not
    -- hold) both are read again: this statement's ACCESS SHARE on every claim_marks child keeps
    -- any further prune out, so ranges read now hold for the rest of the transaction, as before.
    SELECT mk.next_lane_seq, g.generation INTO v_cursor, v_gen_seen -- 0047
    FROM (SELECT (SELECT r.generation FROM ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1) AS generation) g -- 0047: one row
    LEFT JOIN LATERAL (SELECT m.next_lane_seq FROM claim_marks m -- 0047
                       WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k]
                         AND (m.slot BETWEEN v_lo1 AND v_hi1 OR m.slot BETWEEN v_lo2 AND v_hi2) -- 0047
                       ORDER BY m.next_lane_seq DESC LIMIT 1) mk ON true; -- 0047
    IF v_gen_seen IS DISTINCT FROM v_gen THEN -- 0047: a rotation since the ranges
      SELECT (SELECT r.generation FROM ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1), -- 0047
             s.lo1, s.hi1, s.lo2, s.hi2 INTO v_gen, v_lo1, v_hi1, v_lo2, v_hi2 -- 0047
      FROM queue_slot_ranges() s; -- 0047
      SELECT m.next_lane_seq INTO v_cursor FROM claim_marks m -- 0047
      WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k] -- 0047
        AND (m.slot BETWEEN v_lo1 AND v_hi1 OR m.slot BETWEEN v_lo2 AND v_hi2) -- 0047
      ORDER BY m.next_lane_seq DESC LIMIT 1; -- 0047
    END IF; -- 0047
    v_cursor := coalesce(v_cursor, 0);
    -- 0063: the pick, slot by slot. Each live slot's candidates come from its own function
    -- (lane_picks_<slot>, see the header), whose statements name that slot's children: planned in
    -- a fraction of the time a plan over all sixteen children takes, and invalidated only by that
    -- slot's own prune. The slots are read in the ring's order; a lane's rows can lie in several
    -- (a carried row sits in the current slot before younger rows of an older one), so when more
    -- than one slot answers, the candidates are merged in lane order and cut to the call's limit.
    -- Each read is its own statement, with its own snapshot, and still sees the lane wholly:
    -- what can change between them under the lane's claim lock and the cursor statement's
    -- ACCESS SHARE on every claim_marks child is only rows appended at the lane's end (an enqueue
    -- or a promotion into the current slot, positions committing in lane order); a cancel's
    -- tombstone, a park and an unpark wait for the claim lock, a carry for the claim_marks lock.
    v_picked := '{}'; -- 0063
    v_merged := false; -- 0063
    FOR v_s IN v_lo1 .. v_hi1 LOOP -- 0063
      v_part := lane_picks_in_slot(v_s, p_queue, v_prios[v_k], v_shards[v_k], v_cursor, v_left); -- 0063
      IF cardinality(v_part) > 0 THEN -- 0063
        v_merged := v_merged OR cardinality(v_picked) > 0; -- 0063
        v_picked := v_picked || v_part; -- 0063
      END IF; -- 0063
    END LOOP; -- 0063
    FOR v_s IN v_lo2 .. v_hi2 LOOP -- 0063: empty when lo2 > hi2
      v_part := lane_picks_in_slot(v_s, p_queue, v_prios[v_k], v_shards[v_k], v_cursor, v_left); -- 0063
      IF cardinality(v_part) > 0 THEN -- 0063
        v_merged := v_merged OR cardinality(v_picked) > 0; -- 0063
        v_picked := v_picked || v_part; -- 0063
      END IF; -- 0063
    END LOOP; -- 0063
    EXIT WHEN cardinality(v_picked) = 0; -- 0063: nothing claimable in this lane (v_n would be 0)
    IF v_merged THEN -- 0063
      v_picked := ARRAY(SELECT p FROM unnest(v_picked) p ORDER BY p.lane_seq LIMIT v_left); -- 0063
    END IF; -- 0063
    -- Mark and claim in one statement, over the picked rows (a MATERIALIZED CTE: the rows
    -- returned are the picked rows themselves, no second lookup of `ready`; the claims rows carry
    -- the same values).
    RETURN QUERY
    WITH picked AS MATERIALIZED (
      SELECT p.slot, p.generation, p.job_id, p.kind, p.queue, p.priority, p.shard, p.lane_seq, p.args, p.metadata, -- 0063
             p.tags, p.errors, p.attempt, p.run_lease, p.max_attempts, p.run_at, p.created_at, p.progress, p.unique_key, p.unique_states -- 0063
      FROM unnest(v_picked) p -- 0063
      -- Paused, checked again after the pick, in this statement's snapshot (0063: after the
      -- reads, not in them: a pause that committed between two reads would leave out the later
      -- slot's rows and not the earlier's, and the mark could pass a row). A job enqueued after a
      -- pause committed, if a read saw it, meets the pause here: nothing is claimed.
      WHERE NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused) -- 0063
    ),
    mark AS (
      INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
      SELECT ring.slot, ring.generation, p_queue, v_prios[v_k], v_shards[v_k], last.lane_seq + 1
      FROM (SELECT max(p.lane_seq) AS lane_seq FROM picked p) last,
           LATERAL (SELECT g.slot, g.generation FROM ring_rotations g WHERE g.ring = 'queue'
                    ORDER BY g.generation DESC LIMIT 1) ring
      WHERE last.lane_seq IS NOT NULL
    ),
    ins AS (
      INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at,
                          without_unique_key) -- 0055
      SELECT p.slot, p.generation, p.job_id, p.run_lease + 1, p.attempt + 1, p.queue, p.priority, p.shard, p.lane_seq,
             v_now, v_deadline, p.unique_key IS NULL -- 0055
      FROM picked p
      WHERE p.unique_key IS NULL OR (p.unique_states & 6) <> 4 -- 0024: not a row whose key is taken at claim
    ),
    -- 0053: the claims' times, once per slot the claimed rows lie in (see claim_spans)
    span AS ( -- 0053
      INSERT INTO claim_spans (slot, generation, queue, priority, shard, first_lane_seq, last_lane_seq, claimed_at, deadline_at) -- 0053
      SELECT p.slot, p.generation, p_queue, v_prios[v_k], v_shards[v_k], min(p.lane_seq), max(p.lane_seq), v_now, v_deadline -- 0053
      FROM picked p -- 0053
      WHERE p.unique_key IS NULL OR (p.unique_states & 6) <> 4 -- 0053: the rows ins claims
      GROUP BY p.slot, p.generation -- 0053
    ),
    -- available -> running leaves a mask that holds 'available' but not 'running': the key goes
    -- (capabilities.md §4). Default masks hold both: the filter finds nothing.
    rel_unique AS (
      DELETE FROM unique_claims u USING picked p
      WHERE p.unique_key IS NOT NULL AND (p.unique_states & 6) = 2
        AND u.unique_key = p.unique_key AND u.job_id = p.job_id
    )
    -- 0061: a lean answer (see the header): empty values and the call's times as NULL
    SELECT p.job_id, p.run_lease + 1, p.attempt + 1, p.max_attempts, p.kind, p.queue, p.priority, p.args,
           nullif(p.metadata, '{}'::jsonb), nullif(p.tags, '{}'::text[]), nullif(p.errors, '[]'::jsonb), -- 0061
           nullif(p.run_at, p.created_at), p.created_at, -- 0061
           CASE WHEN row_number() OVER (ORDER BY p.lane_seq) = 1 THEN v_now END, -- 0061
           CASE WHEN row_number() OVER (ORDER BY p.lane_seq) = 1 THEN v_deadline END, p.progress /* 0022 */ -- 0061
    FROM picked p
    -- 0024: a row whose mask holds 'running' but not 'available' is left to the statement below;
    -- set_config (evaluated only for such a row: OR stops at the first true arm) tells the loop.
    WHERE p.unique_key IS NULL OR (p.unique_states & 6) <> 4
       OR set_config('awa.claim_keyed', 'on', true) IS NULL -- 0024
    ORDER BY p.lane_seq;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_got := v_got + v_n; -- 0024
    v_left := v_left - v_n; -- 0024 (was after the two tests below; v_n = 0 there)
    v_keyed := current_setting('awa.claim_keyed', true) = 'on'; -- 0024
    EXIT WHEN v_keyed IS NOT TRUE; -- 0024: every default-mask call leaves here
    -- 0024: Keys at claim (capabilities.md §4, as the simulation). available -> running enters a
    -- mask that holds 'running' but not 'available': the job takes its key. The pick above marked
    -- these rows as claimed (its mark passes them) but wrote no claims row for them and did not
    -- return them; this statement does, in lane order among them, under the same lane lock.
    -- They are the lane's ready rows from the old cursor up to the new one, in the same slot
    -- ranges, not tombstoned and with no claims row: no other row can be there (positions of a
    -- lane commit in order under its enqueue lock, and no row is carried or unparked into the
    -- lane while we hold its claim lock and ACCESS SHARE on the claim_marks children).
    -- The first row per key inserts it (keys in key order: two such statements cannot deadlock
    -- on each other's keys). A row whose key another job holds -- committed before, taken by an
    -- earlier row here, or inserted by a claim of another lane that the insert waited for -- is
    -- superseded: cancelled 'superseded by duplicate <holder>', a tombstone and a wide terminal
    -- row in its ready row's slot (as cancel_job ends an available job), no attempt used.
    -- DO UPDATE (a no-op write of the holder's key row, on this rare path only) returns the
    -- holder even when it committed after this statement's snapshot, and keeps it from
    -- releasing the key until we commit.
    PERFORM set_config('awa.claim_keyed', '', true);
    SELECT m.next_lane_seq INTO v_mark FROM claim_marks m
    WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k]
    ORDER BY m.next_lane_seq DESC LIMIT 1;
    RETURN QUERY
    WITH keyed AS MATERIALIZED (
      SELECT r.slot, r.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata,
             r.tags, r.errors, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.progress, r.unique_key,
             r.unique_states
      FROM ready r
      WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k]
        AND r.lane_seq >= v_cursor AND r.lane_seq < v_mark
        AND (r.slot BETWEEN v_lo1 AND v_hi1 OR r.slot BETWEEN v_lo2 AND v_hi2)
        AND r.unique_key IS NOT NULL AND (r.unique_states & 6) = 4
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          AND (t.slot BETWEEN v_lo1 AND v_hi1 OR t.slot BETWEEN v_lo2 AND v_hi2))
        AND NOT EXISTS (SELECT 1 FROM claims c WHERE c.job_id = r.job_id AND c.lane_seq = r.lane_seq
                          AND (c.slot BETWEEN v_lo1 AND v_hi1 OR c.slot BETWEEN v_lo2 AND v_hi2))
    ),
    took AS (
      INSERT INTO unique_claims AS u (unique_key, job_id)
      SELECT DISTINCT ON (k.unique_key) k.unique_key, k.job_id FROM keyed k ORDER BY k.unique_key, k.lane_seq
      ON CONFLICT (unique_key) DO UPDATE SET job_id = u.job_id
      RETURNING u.unique_key, u.job_id AS holder
    ),
    settled AS MATERIALIZED (
      SELECT k.*, t.holder FROM keyed k JOIN took t ON t.unique_key = k.unique_key
    ),
    ins AS (
      INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at,
                          without_unique_key) -- 0055
      SELECT s.slot, s.generation, s.job_id, s.run_lease + 1, s.attempt + 1, s.queue, s.priority, s.shard, s.lane_seq,
             v_now, v_deadline, false -- 0055: these rows have a key (taken at claim)
      FROM settled s WHERE s.holder = s.job_id
    ),
    span AS ( -- 0053: as in the pick above
      INSERT INTO claim_spans (slot, generation, queue, priority, shard, first_lane_seq, last_lane_seq, claimed_at, deadline_at) -- 0053
      SELECT s.slot, s.generation, p_queue, v_prios[v_k], v_shards[v_k], min(s.lane_seq), max(s.lane_seq), v_now, v_deadline -- 0053
      FROM settled s WHERE s.holder = s.job_id -- 0053
      GROUP BY s.slot, s.generation -- 0053
    ),
    tomb AS (
      INSERT INTO ready_tombstones (slot, generation, job_id, queue, priority, shard, lane_seq)
      SELECT s.slot, s.generation, s.job_id, s.queue, s.priority, s.shard, s.lane_seq FROM settled s WHERE s.holder <> s.job_id
    ),
    ended AS (
      INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                            kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT s.slot, s.generation, s.job_id, s.run_lease, 'cancelled', s.attempt, v_now,
             append_error(s.errors, jsonb_build_object('error', 'cancelled: superseded by duplicate ' || s.holder,
                                                       'attempt', s.attempt, 'at', v_now)),
             s.progress, true, s.kind, s.queue, s.priority, s.args, s.metadata, s.tags, s.max_attempts, s.run_at,
             s.created_at, s.unique_key, s.unique_states
      FROM settled s WHERE s.holder <> s.job_id
    )
    SELECT s.job_id, s.run_lease + 1, s.attempt + 1, s.max_attempts, s.kind, s.queue, s.priority, s.args,
           nullif(s.metadata, '{}'::jsonb), nullif(s.tags, '{}'::text[]), nullif(s.errors, '[]'::jsonb), -- 0061
           nullif(s.run_at, s.created_at), s.created_at, -- 0061
           CASE WHEN row_number() OVER (ORDER BY s.lane_seq) = 1 THEN v_now END, -- 0061
           CASE WHEN row_number() OVER (ORDER BY s.lane_seq) = 1 THEN v_deadline END, s.progress -- 0061
    FROM settled s WHERE s.holder = s.job_id
    ORDER BY s.lane_seq;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_got := v_got + v_n;
    v_left := v_left - v_n;
    -- Superseded rows used part of the pick's limit: pick again from this lane (a superseded
    -- head must not make the call look empty; the simulation goes on down the lane).
    EXIT WHEN v_left <= 0;
    END LOOP; -- 0024
  END LOOP;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.claim_keyed(p_queue text, p_policy text, p_max integer, p_deadline_ms bigint, p_aging_ms bigint)
 RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, deadline_at timestamp with time zone, progress jsonb, gate text)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
 SET enable_bitmapscan TO 'off'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET enable_material TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_deadline timestamptz := CASE WHEN p_deadline_ms > 0 THEN now() + p_deadline_ms * interval '1 millisecond' END;
  v_left int := least(p_max, 64);
  v_limit int;
  v_state text;
  v_prios smallint[];
  v_shards smallint[];
  v_k int;
  v_i int;
  v_cursor bigint;
  v_n int;
  v_total int := 0;
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
  v_klo1 int; -- 0036: the slot ranges read after the key locks (the count's slots)
  v_khi1 int; -- 0036
  v_klo2 int; -- 0036
  v_khi2 int; -- 0036
  v_rlo1 int; -- 0042: the ranking's slot ranges (as claim's)
  v_rhi1 int; -- 0042
  v_rlo2 int; -- 0042
  v_rhi2 int; -- 0042
  v_gen bigint; -- 0036: the queue ring's newest generation before the pick's ranges were read
  v_gen2 bigint; -- 0036: and after a lane's key locks
  v_gen_seen bigint; -- 0047: the newest generation as a cursor statement saw it
  v_ids bigint[];
  v_rows ready[]; -- 0036: the window's rows, claimed from here (no second read of ready)
  v_ranked boolean := false; -- 0036: the lanes were ranked (more than one)
  v_seqs bigint[];
  v_digests bytea[];
  v_at_claim boolean[];
  v_admit int;
  v_d bytea;
  v_pos int;
  v_keys bytea[] := '{}';        -- keys tried by this call
  v_locked_keys boolean[] := '{}'; -- per key: its lock is ours
  v_held int[] := '{}';          -- per key: open grants plus those admitted in this call
  v_new bytea[];
  v_new_locked boolean[];
  v_new_held int[];
  v_hz bigint[] := '{}';      -- 0036: per key: its horizon (see the header), NULL if not counted
  v_new_hz bigint[];          -- 0036
  v_row_hz bigint[];          -- 0036: per window row: its key's horizon
  v_floor bigint;             -- 0036: this lane's grant sequence value, taken after its key locks
  v_gated boolean := false;
  v_contended boolean := false;
  v_out ready[] := '{}'; -- 0041: the claimed rows of every lane, returned once at the end
  v_s int; -- 0067: a live slot
  v_cursors bigint[]; -- 0067: the lanes' cursors, beside v_prios and v_shards (the ranking)
  v_heads ready[]; -- 0067: the lanes' first claimable rows, one per lane and live slot at most
  v_probe_from bigint; -- 0067: a busy lane's cursor, as the probe read it
  v_head boolean; -- 0067: the busy lane has a claimable head
  v_picked ready[]; -- 0067: the lane's window rows, in lane order
  v_part ready[]; -- 0067: one slot's candidates
  v_merged boolean; -- 0067: more than one slot answered
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim_keyed needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  -- 0062: the claim commits without waiting for its WAL to reach disk, unless this transaction
  -- wrote before it (a caller's own writes keep their durability); see the header
  IF pg_current_xact_id_if_assigned() IS NULL THEN -- 0062
    PERFORM set_config('synchronous_commit', 'off', true); -- 0062
  END IF; -- 0062
  IF p_max <= 0 THEN
    RETURN;
  END IF;
  -- The policy, read in a statement after its lock is held shared (a change of limit waits for us).
  PERFORM pg_advisory_xact_lock_shared(lock_ns('key_policy'), hashtext(p_policy));
  SELECT kp.max_in_flight, kp.state INTO v_limit, v_state FROM key_policies kp WHERE kp.id = p_policy;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'key policy "%" does not exist', p_policy
      USING ERRCODE = 'AWK01', HINT = 'Create it with keyPolicies.create before a queue uses it.';
  END IF;
  -- 0036: the queue's lanes; none when paused. With one lane the ranking below is skipped (as
  -- claim does): the window finds out whether the lane has anything.
  SELECT array_agg(l.priority), array_agg(l.shard) INTO v_prios, v_shards FROM lanes l -- 0036
  WHERE l.queue = p_queue AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused); -- 0036
  IF v_prios IS NULL THEN -- 0036
    RETURN; -- 0036
  END IF; -- 0036
  IF cardinality(v_prios) > 1 THEN -- 0036
  v_ranked := true; -- 0036
  -- The queue's lanes with a claimable head, in claim order; none when paused.
  SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_rlo1, v_rhi1, v_rlo2, v_rhi2 FROM queue_slot_ranges() s; -- 0042
  -- 0042: the cursors by a lateral read of claim_marks, not a lane_cursor call per lane (as claim)
  SELECT array_agg(l.priority), array_agg(l.shard), array_agg(coalesce(mk.c, 0)) -- 0067
    INTO v_prios, v_shards, v_cursors -- 0067
  FROM lanes l
  LEFT JOIN LATERAL (SELECT m.next_lane_seq AS c FROM claim_marks m -- 0042
                     WHERE m.queue = l.queue AND m.priority = l.priority AND m.shard = l.shard -- 0042
                       AND (m.slot BETWEEN v_rlo1 AND v_rhi1 OR m.slot BETWEEN v_rlo2 AND v_rhi2) -- 0047
                     ORDER BY m.next_lane_seq DESC LIMIT 1) mk ON true -- 0042
  WHERE l.queue = p_queue
    AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused);
  IF v_prios IS NULL THEN -- 0067
    RETURN; -- 0067
  END IF; -- 0067
  -- 0067: each lane's first claimable row in each live slot, through that slot's own function
  -- (lane_heads_<slot>, 0066); a lane's head is the first of them in lane order
  v_heads := '{}'; -- 0067
  FOR v_s IN v_rlo1 .. v_rhi1 LOOP -- 0067
    v_heads := v_heads || lane_heads_in_slot(v_s, p_queue, v_prios, v_shards, v_cursors); -- 0067
  END LOOP; -- 0067
  FOR v_s IN v_rlo2 .. v_rhi2 LOOP -- 0067: empty when lo2 > hi2
    v_heads := v_heads || lane_heads_in_slot(v_s, p_queue, v_prios, v_shards, v_cursors); -- 0067
  END LOOP; -- 0067
  SELECT array_agg(o.priority ORDER BY o.n), array_agg(o.shard ORDER BY o.n) INTO v_prios, v_shards
  FROM (
    SELECT head.priority, head.shard,
           row_number() OVER (ORDER BY CASE WHEN p_aging_ms > 0
                                            THEN greatest(1, head.priority - floor(extract(epoch FROM (v_now - head.run_at)) * 1000 / p_aging_ms))
                                            ELSE head.priority END,
                                       head.run_at, head.priority, head.shard) AS n
    FROM (SELECT DISTINCT ON (h.priority, h.shard) h.priority, h.shard, h.run_at -- 0067
          FROM unnest(v_heads) h ORDER BY h.priority, h.shard, h.lane_seq) head -- 0067
  ) o;
  IF v_prios IS NULL THEN
    RETURN;
  END IF;
  END IF; -- 0036

  FOR v_k IN 1 .. cardinality(v_prios) LOOP
    EXIT WHEN v_left <= 0;
    IF NOT pg_try_advisory_xact_lock(lock_ns('claim'),
                                     hashtext(p_queue || chr(31) || v_prios[v_k]::text || chr(31) || v_shards[v_k]::text)) THEN
      -- 0036: an unranked lane is contended only if it has a claimable head (else: idle), as claim
      -- 0067: the probe reads the lane's cursor in the live slots and each slot through its own
      -- function (lane_picks_<slot>, 0063), oldest first, as claim's (0065)
      IF NOT v_ranked THEN -- 0067
        IF v_rlo1 IS NULL THEN -- 0067
          SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_rlo1, v_rhi1, v_rlo2, v_rhi2 FROM queue_slot_ranges() s; -- 0067
        END IF; -- 0067
        SELECT m.next_lane_seq INTO v_probe_from FROM claim_marks m -- 0067
        WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k] -- 0067
          AND (m.slot BETWEEN v_rlo1 AND v_rhi1 OR m.slot BETWEEN v_rlo2 AND v_rhi2) -- 0067
        ORDER BY m.next_lane_seq DESC LIMIT 1; -- 0067
        v_head := false; -- 0067
        FOR v_s IN v_rlo1 .. v_rhi1 LOOP -- 0067
          v_head := coalesce(cardinality(lane_picks_in_slot(v_s, p_queue, v_prios[v_k], v_shards[v_k], coalesce(v_probe_from, 0), 1)), 0) > 0; -- 0067
          EXIT WHEN v_head; -- 0067
        END LOOP; -- 0067
        FOR v_s IN v_rlo2 .. v_rhi2 LOOP -- 0067: empty when lo2 > hi2
          EXIT WHEN v_head; -- 0067
          v_head := coalesce(cardinality(lane_picks_in_slot(v_s, p_queue, v_prios[v_k], v_shards[v_k], coalesce(v_probe_from, 0), 1)), 0) > 0; -- 0067
        END LOOP; -- 0067
        CONTINUE WHEN NOT v_head; -- 0067
      END IF; -- 0067
      v_contended := true;
      CONTINUE;
    END IF;
    -- 0047: the ranges and the newest generation in one snapshot (they reach exactly up to it),
    -- read before the cursor, which is read in them and checked against a rotation, as claim.
    IF v_lo1 IS NULL THEN
      SELECT (SELECT r.generation FROM ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1), -- 0047
             s.lo1, s.hi1, s.lo2, s.hi2 INTO v_gen, v_lo1, v_hi1, v_lo2, v_hi2 -- 0047
      FROM queue_slot_ranges() s; -- 0047
    END IF;
    SELECT mk.next_lane_seq, g.generation INTO v_cursor, v_gen_seen -- 0047
    FROM (SELECT (SELECT r.generation FROM ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1) AS generation) g -- 0047: one row
    LEFT JOIN LATERAL (SELECT m.next_lane_seq FROM claim_marks m -- 0047
                       WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k]
                         AND (m.slot BETWEEN v_lo1 AND v_hi1 OR m.slot BETWEEN v_lo2 AND v_hi2) -- 0047
                       ORDER BY m.next_lane_seq DESC LIMIT 1) mk ON true; -- 0047
    IF v_gen_seen IS DISTINCT FROM v_gen THEN -- 0047: a rotation since the ranges
      SELECT (SELECT r.generation FROM ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1), -- 0047
             s.lo1, s.hi1, s.lo2, s.hi2 INTO v_gen, v_lo1, v_hi1, v_lo2, v_hi2 -- 0047
      FROM queue_slot_ranges() s; -- 0047
      SELECT m.next_lane_seq INTO v_cursor FROM claim_marks m -- 0047
      WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k] -- 0047
        AND (m.slot BETWEEN v_lo1 AND v_hi1 OR m.slot BETWEEN v_lo2 AND v_hi2) -- 0047
      ORDER BY m.next_lane_seq DESC LIMIT 1; -- 0047
    END IF; -- 0047
    v_cursor := coalesce(v_cursor, 0);
    -- The window (claim's pick, without the writes).
    -- 0067: the window's rows, slot by slot, through each live slot's own function
    -- (lane_picks_<slot>, 0063: the tombstone probes and the parked barrier are its), merged in
    -- lane order when more than one slot answers and cut to the call's limit, as claim's pick
    -- (why separate reads see a gap-free run from the cursor: 0063's header, under this lane's
    -- claim lock and the cursor statement's ACCESS SHARE on every claim_marks child)
    v_picked := '{}'; -- 0067
    v_merged := false; -- 0067
    FOR v_s IN v_lo1 .. v_hi1 LOOP -- 0067
      v_part := lane_picks_in_slot(v_s, p_queue, v_prios[v_k], v_shards[v_k], v_cursor, v_left); -- 0067
      IF cardinality(v_part) > 0 THEN -- 0067
        v_merged := v_merged OR cardinality(v_picked) > 0; -- 0067
        v_picked := v_picked || v_part; -- 0067
      END IF; -- 0067
    END LOOP; -- 0067
    FOR v_s IN v_lo2 .. v_hi2 LOOP -- 0067: empty when lo2 > hi2
      v_part := lane_picks_in_slot(v_s, p_queue, v_prios[v_k], v_shards[v_k], v_cursor, v_left); -- 0067
      IF cardinality(v_part) > 0 THEN -- 0067
        v_merged := v_merged OR cardinality(v_picked) > 0; -- 0067
        v_picked := v_picked || v_part; -- 0067
      END IF; -- 0067
    END LOOP; -- 0067
    IF v_merged THEN -- 0067
      v_picked := ARRAY(SELECT p FROM unnest(v_picked) p ORDER BY p.lane_seq LIMIT v_left); -- 0067
    END IF; -- 0067
    WITH w AS MATERIALIZED (
      SELECT r AS rw, r.job_id, r.lane_seq, r.metadata ->> 'awa:concurrencyKey' AS ckey, -- 0036: rw
             (r.unique_key IS NOT NULL AND (r.unique_states & 6) = 4) AS at_claim
      FROM unnest(v_picked) r -- 0067
      -- paused: checked once over the merged rows, in this statement's snapshot (0067: not in
      -- the reads, so a pause cannot cut one slot's rows and not another's)
      WHERE NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused)
    )
    SELECT array_agg(w.job_id ORDER BY w.lane_seq), array_agg(w.lane_seq ORDER BY w.lane_seq),
           -- 0036: key_digest(w.ckey) written out: the function is not inlined (convert_to is
           -- STABLE in an IMMUTABLE function), and a call per row cost ~10 µs of SQL-function setup
           array_agg(CASE WHEN w.ckey IS NOT NULL -- 0036
                          THEN sha256(convert_to('awa.concurrency-key.v1' || chr(31) || 'awa' || chr(31) || w.ckey, 'UTF8')) -- 0036
                     END ORDER BY w.lane_seq), -- 0036
           array_agg(w.at_claim ORDER BY w.lane_seq),
           array_agg(w.rw ORDER BY w.lane_seq) -- 0036
      INTO v_ids, v_seqs, v_digests, v_at_claim, v_rows -- 0036
    FROM w;
    CONTINUE WHEN v_ids IS NULL;
    -- 0056: one lane and a window of one keyed row (a worker claiming as jobs arrive): its key
    -- tried as an expression, then the count, the admission, the mark, the claims row and the
    -- answer in one statement that starts after the lock (the count's guarantee, see the header).
    -- Three statements fewer than the path below, which this one leaves only after a rotation
    -- committed since the ranges were read.
    IF NOT v_ranked AND v_state = 'active' AND cardinality(v_ids) = 1 -- 0056
       AND v_digests[1] IS NOT NULL AND NOT v_at_claim[1] THEN -- 0056
      v_d := v_digests[1]; -- 0056
      IF NOT pg_try_advisory_xact_lock(lock_ns('key'), -- 0056
                                       (get_byte(v_d, 0) << 24) | (get_byte(v_d, 1) << 16) | (get_byte(v_d, 2) << 8) | get_byte(v_d, 3)) THEN -- 0056
        v_contended := true; -- 0056: the only lane: the loop ends and the call answers keyLockContended
        CONTINUE; -- 0056
      END IF; -- 0056
      v_floor := nextval('key_grant_seq'); -- 0056: after the key lock, as below
      RETURN QUERY -- 0056
      WITH g AS MATERIALIZED ( -- 0056: the newest generation and the key's open grants (0036's count), one snapshot (0059: the function is STABLE)
        SELECT (SELECT r.generation FROM ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1) AS gen, -- 0056
               o.n, o.m -- 0056
        FROM (SELECT coalesce(least(sum(s.n), v_limit), 0)::int AS n, min(s.m) AS m -- 0059: slot by slot
              FROM (SELECT v FROM generate_series(v_lo1, v_hi1) v -- 0059
                    UNION ALL SELECT v FROM generate_series(v_lo2, v_hi2) v) ls(slot), -- 0059
                   LATERAL key_grants_in_slot(ls.slot, p_policy, v_d, v_limit) s) o -- 0059
      ),
      picked AS MATERIALIZED ( -- 0056: the row, admitted below the limit while the pick's ranges still hold
        SELECT r.slot, r.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata, -- 0056
               r.tags, r.errors, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.progress, -- 0056
               least(g.m, v_floor) AS hz, r.unique_key IS NULL AS without_unique_key -- 0056
        FROM unnest(v_rows[1:1]) r, g -- 0056
        WHERE g.gen = v_gen AND g.n < v_limit -- 0056
      ),
      mark AS ( -- 0056
        INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq) -- 0056
        SELECT ring.slot, ring.generation, p_queue, v_prios[v_k], v_shards[v_k], p.lane_seq + 1 -- 0056
        FROM picked p, (SELECT g.slot, g.generation FROM ring_rotations g WHERE g.ring = 'queue' -- 0056
                        ORDER BY g.generation DESC LIMIT 1) ring -- 0056
      ),
      ins AS ( -- 0056
        INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, -- 0056
                            deadline_at, key_policy, key_digest, key_seq, key_horizon, without_unique_key) -- 0056
        SELECT p.slot, p.generation, p.job_id, p.run_lease + 1, p.attempt + 1, p.queue, p.priority, p.shard, p.lane_seq, -- 0056
               v_now, v_deadline, p_policy, v_d, v_floor, p.hz, p.without_unique_key -- 0056
        FROM picked p -- 0056
      ),
      span AS ( -- 0056
        INSERT INTO claim_spans (slot, generation, queue, priority, shard, first_lane_seq, last_lane_seq, claimed_at, deadline_at) -- 0056
        SELECT p.slot, p.generation, p_queue, v_prios[v_k], v_shards[v_k], p.lane_seq, p.lane_seq, v_now, v_deadline -- 0056
        FROM picked p -- 0056
      )
      SELECT p.job_id, p.run_lease + 1, p.attempt + 1, p.max_attempts, p.kind, p.queue, p.priority, p.args, -- 0056
             nullif(p.metadata, '{}'::jsonb), nullif(p.tags, '{}'::text[]), nullif(p.errors, '[]'::jsonb), -- 0061: one row, its own times
             nullif(p.run_at, p.created_at), p.created_at, v_now, v_deadline, p.progress, NULL::text -- 0061
      FROM picked p -- 0056
      UNION ALL -- 0056: the key at its limit: 0041's status row
      SELECT NULL::bigint, NULL::bigint, NULL::int, NULL::int, NULL::text, p_queue, NULL::smallint, NULL::jsonb, -- 0056
             NULL::jsonb, NULL::text[], NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz, -- 0056
             NULL::timestamptz, NULL::jsonb, 'keyGated'::text -- 0056
      FROM g WHERE g.gen = v_gen AND g.n >= v_limit; -- 0056
      IF FOUND THEN -- 0056
        RETURN; -- 0056
      END IF; -- 0056
      -- 0056: nothing returned: a rotation committed since the ranges were read (the count may
      -- have missed a slot). The path below reads them again; the key lock is already ours (a
      -- second try succeeds) and its grant sequence value is taken again after it.
    END IF; -- 0056
    -- The window's keys not seen yet in this call, in order of first appearance (at most 64 per
    -- call in all: the lock-table budget, 0036), each try-locked once, in one statement.
    IF v_state = 'active' THEN
      SELECT coalesce(array_agg(k.d ORDER BY k.first), '{}'),
             coalesce(array_agg(pg_try_advisory_xact_lock(lock_ns('key'),
                                  (get_byte(k.d, 0) << 24) | (get_byte(k.d, 1) << 16) | (get_byte(k.d, 2) << 8) | get_byte(k.d, 3))
                                ORDER BY k.first), '{}')
        INTO v_new, v_new_locked
      FROM (SELECT u.d, min(u.i) AS first FROM unnest(v_digests) WITH ORDINALITY u(d, i)
            WHERE u.d IS NOT NULL AND NOT (u.d = ANY (v_keys))
            GROUP BY u.d ORDER BY min(u.i) LIMIT 64 - cardinality(v_keys)) k; -- 0036: 64 keys (was 32)
      -- 0036: the slots that can hold a claim, as seen after the key locks: a grant committed by
      -- an earlier holder of a key's lock sits in a slot rotated in before that. The pick's
      -- ranges do when no rotation committed since v_gen was read before them (the lower end
      -- cannot move while we run, see the header); else they are read again.
      SELECT g.generation INTO v_gen2 FROM ring_rotations g WHERE g.ring = 'queue' ORDER BY g.generation DESC LIMIT 1; -- 0036
      IF v_gen2 IS NOT DISTINCT FROM v_gen THEN -- 0036
        v_klo1 := v_lo1; v_khi1 := v_hi1; v_klo2 := v_lo2; v_khi2 := v_hi2; -- 0036
      ELSE -- 0036
        SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_klo1, v_khi1, v_klo2, v_khi2 FROM queue_slot_ranges() s; -- 0036
      END IF; -- 0036
      -- 0036: this lane's grants' key_seq: taken after its key locks, so above every key_seq an
      -- earlier holder of any of them wrote (the order the horizons rely on).
      v_floor := nextval('key_grant_seq'); -- 0036
      -- Their open grants, in a statement that starts after the locks are held: it sees every
      -- grant committed by an earlier holder of each lock. (Keys whose lock another claimer
      -- holds are not counted: the walk stops at them.) 0036: only the grants from the key's
      -- horizon on (the horizon of its newest grant: every grant of the key below it was closed
      -- when that grant was taken) and those without a key_seq (carried by prune, or written
      -- before 0036), up to the limit (admission only asks whether open + admitted < limit),
      -- in the slots that can hold a claim. Also the smallest key_seq among the open ones. 0059:
      -- slot by slot, each slot from the horizon of the key's newest grant in it
      -- (key_grants_in_slot, see the header).
      SELECT coalesce(array_agg(g.n ORDER BY k.i), '{}'), -- 0036
             coalesce(array_agg(least(g.m, v_floor) ORDER BY k.i), '{}') -- 0036
        INTO v_new_held, v_new_hz -- 0036
      FROM unnest(v_new) WITH ORDINALITY k(d, i)
      LEFT JOIN LATERAL ( -- 0059: slot by slot (key_grants_in_slot)
        SELECT coalesce(least(sum(s.n), v_limit), 0)::int AS n, min(s.m) AS m -- 0059
        FROM (SELECT v FROM generate_series(v_klo1, v_khi1) v -- 0059
              UNION ALL SELECT v FROM generate_series(v_klo2, v_khi2) v) ls(slot), -- 0059
             LATERAL key_grants_in_slot(ls.slot, p_policy, k.d, v_limit) s -- 0059
      ) g ON v_new_locked[k.i]; -- 0036
      v_keys := v_keys || v_new;
      v_locked_keys := v_locked_keys || v_new_locked;
      v_held := v_held || v_new_held;
      v_hz := v_hz || v_new_hz; -- 0036
    END IF;
    -- The admitted prefix.
    v_admit := 0;
    v_row_hz := '{}'; -- 0036
    FOR v_i IN 1 .. cardinality(v_ids) LOOP
      EXIT WHEN v_at_claim[v_i];
      v_d := v_digests[v_i];
      IF v_d IS NOT NULL AND v_state <> 'disabled' THEN
        IF v_state = 'draining' THEN
          v_gated := true;
          EXIT;
        END IF;
        v_pos := array_position(v_keys, v_d);
        EXIT WHEN v_pos IS NULL; -- past the 64 keys of this call (0036)
        IF NOT v_locked_keys[v_pos] THEN
          v_contended := true;
          EXIT;
        END IF;
        IF v_held[v_pos] >= v_limit THEN
          v_gated := true;
          EXIT;
        END IF;
        v_held[v_pos] := v_held[v_pos] + 1;
        v_row_hz[v_i] := v_hz[v_pos]; -- 0036
      END IF;
      v_admit := v_i;
    END LOOP;
    CONTINUE WHEN v_admit = 0;
    -- Mark, claim and return the prefix (the rows of positions v_cursor .. v_seqs[v_admit] read
    -- above: none can appear or go while we hold the lane's claim lock, see claim). 0036: the
    -- window's own rows (ready rows are never updated), not a second lookup of ready.
    WITH picked AS MATERIALIZED ( -- 0041: counted here, returned at the end
      SELECT r.slot, r.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata,
             r.tags, r.errors, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.progress,
             v_digests[r.ordinality] AS digest, v_row_hz[r.ordinality] AS hz, -- 0036
             r.unique_key IS NULL AS without_unique_key -- 0055
      FROM unnest(v_rows[1:v_admit]) WITH ORDINALITY r -- 0036
    ),
    mark AS (
      INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
      SELECT ring.slot, ring.generation, p_queue, v_prios[v_k], v_shards[v_k], v_seqs[v_admit] + 1
      FROM (SELECT g.slot, g.generation FROM ring_rotations g WHERE g.ring = 'queue'
            ORDER BY g.generation DESC LIMIT 1) ring
    ),
    ins AS (
      INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at,
                          deadline_at, key_policy, key_digest, key_seq, key_horizon, without_unique_key) -- 0036, 0055
      SELECT p.slot, p.generation, p.job_id, p.run_lease + 1, p.attempt + 1, p.queue, p.priority, p.shard, p.lane_seq,
             v_now, v_deadline, CASE WHEN p.digest IS NOT NULL THEN p_policy END, p.digest,
             CASE WHEN p.digest IS NOT NULL THEN v_floor END, p.hz, -- 0036: NULL unless counted (active)
             p.without_unique_key -- 0055
      FROM picked p
    ),
    span AS ( -- 0053: the claims' times, once per slot the claimed rows lie in (see claim_spans)
      INSERT INTO claim_spans (slot, generation, queue, priority, shard, first_lane_seq, last_lane_seq, claimed_at, deadline_at) -- 0053
      SELECT p.slot, p.generation, p_queue, v_prios[v_k], v_shards[v_k], min(p.lane_seq), max(p.lane_seq), v_now, v_deadline -- 0053
      FROM picked p -- 0053
      GROUP BY p.slot, p.generation -- 0053
    )
    SELECT count(*)::int INTO v_n FROM picked; -- 0041
    v_out := v_out || v_rows[1:v_admit]; -- 0041: in lane order, each lane's rows by position
    v_total := v_total + v_n;
    v_left := v_left - v_n;
  END LOOP;
  -- 0041: the claimed rows, each carrying why the call stopped short of its window if it did (a
  -- key at its limit, or one whose lock another claimer held); NULL otherwise.
  IF v_total > 0 THEN -- 0041
    RETURN QUERY -- 0041
    SELECT r.job_id, r.run_lease + 1, r.attempt + 1, r.max_attempts, r.kind, r.queue, r.priority, r.args, -- 0041
           nullif(r.metadata, '{}'::jsonb), nullif(r.tags, '{}'::text[]), nullif(r.errors, '[]'::jsonb), -- 0061
           nullif(r.run_at, r.created_at), r.created_at, -- 0061
           CASE WHEN r.ordinality = 1 THEN v_now END, CASE WHEN r.ordinality = 1 THEN v_deadline END, r.progress, -- 0061
           CASE WHEN v_contended THEN 'keyLockContended' WHEN v_gated THEN 'keyGated' END -- 0041
    FROM unnest(v_out) WITH ORDINALITY r -- 0041
    ORDER BY r.ordinality; -- 0041
  ELSIF v_contended OR v_gated THEN -- 0041
    RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::int, NULL::int, NULL::text, p_queue, NULL::smallint, NULL::jsonb,
                        NULL::jsonb, NULL::text[], NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                        NULL::timestamptz, NULL::jsonb,
                        CASE WHEN v_contended THEN 'keyLockContended' ELSE 'keyGated' END;
  END IF;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.claim_keyed_rated(p_queue text, p_policy text, p_max integer, p_deadline_ms bigint, p_aging_ms bigint, p_rate double precision, p_burst integer)
 RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, deadline_at timestamp with time zone, progress jsonb, gate text, next_token_at timestamp with time zone)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  r record;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim_keyed_rated needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  SELECT * INTO r FROM rate_tokens('claim_keyed_rated', p_queue, p_max, p_rate, p_burst);
  IF p_max <= 0 THEN
    RETURN;
  END IF;
  IF r.tokens <= 0 THEN
    RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::int, NULL::int, NULL::text, p_queue, NULL::smallint, NULL::jsonb,
                        NULL::jsonb, NULL::text[], NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                        NULL::timestamptz, NULL::jsonb, NULL::text, r.next_token_at;
    RETURN;
  END IF;
  -- The keyed claim, the mark and the superseded mark's delete in one statement: the jobs taken
  -- (rows with a job; the gate row has none) advance tat.
  RETURN QUERY
  WITH c AS MATERIALIZED (
    SELECT k.* FROM claim_keyed(p_queue, p_policy, least(p_max, r.tokens), p_deadline_ms, p_aging_ms) k
  ),
  taken AS MATERIALIZED (
    SELECT count(c.job_id)::int AS n FROM c
  ),
  new_mark AS (
    INSERT INTO rate_marks (queue, tat) SELECT p_queue, r.base + t.n * r.period FROM taken t WHERE t.n > 0
  ),
  -- by its tuple id, one row, never a scan (as claim_rated)
  superseded AS (
    DELETE FROM rate_marks m WHERE m.ctid = r.mark AND EXISTS (SELECT 1 FROM taken t WHERE t.n > 0)
  )
  SELECT c.*, CASE WHEN t.n = r.tokens AND r.tokens < p_max THEN r.next_token_at END
  FROM c CROSS JOIN taken t;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.claim_rated(p_queue text, p_max integer, p_deadline_ms bigint, p_aging_ms bigint, p_rate double precision, p_burst integer)
 RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, deadline_at timestamp with time zone, progress jsonb, next_token_at timestamp with time zone)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  r record;
  v_n int;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim_rated needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  SELECT * INTO r FROM rate_tokens('claim_rated', p_queue, p_max, p_rate, p_burst);
  IF p_max <= 0 THEN
    RETURN;
  END IF;
  IF r.tokens <= 0 THEN
    RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::int, NULL::int, NULL::text, p_queue, NULL::smallint, NULL::jsonb,
                        NULL::jsonb, NULL::text[], NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                        NULL::timestamptz, NULL::jsonb, r.next_token_at;
    RETURN;
  END IF;
  -- cut by the tokens (fewer than asked): each row says when the next token is due once these
  -- are taken, so the worker claims again then rather than at its poll
  RETURN QUERY SELECT c.*, CASE WHEN r.tokens < p_max THEN r.next_token_at END
               FROM claim(p_queue, least(p_max, r.tokens), p_deadline_ms, p_aging_ms) c;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF v_n > 0 THEN
    INSERT INTO rate_marks (queue, tat) VALUES (p_queue, r.base + v_n * r.period);
    -- the mark read is superseded: deleted by its tuple id, one row, never a scan (a range delete
    -- would walk every mark a pinned horizon keeps dead, on every claim)
    DELETE FROM rate_marks m WHERE m.ctid = r.mark;
  END IF;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.claim_resumed(p_queue text, p_max integer)
 RETURNS TABLE(job_id bigint, run_lease bigint, kind text, queue text, priority smallint, attempt integer, max_attempts integer, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, progress jsonb, callback_result jsonb)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim_resumed needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  -- 0040: nothing resumed is waiting (the usual answer): return before the statement below is
  -- planned (claims, closures and ready: 16 children each, 40-80 ms on a connection's first call).
  IF NOT EXISTS (SELECT 1 FROM attempt_state a WHERE a.callback_waiting AND a.callback_state = 'resumed') THEN -- 0040
    RETURN; -- 0040
  END IF; -- 0040
  -- One statement. A writer of attempt_state holds the claims row while it writes, so a row we
  -- lock here is not being changed; one changed and committed after our snapshot (a take, a
  -- finalize deleting the row) is caught by the UPDATE, which re-checks its WHERE on the newest
  -- version of each attempt_state row.
  RETURN QUERY
  WITH locked AS MATERIALIZED (
    SELECT c.job_id, c.run_lease, c.attempt, c.claimed_at, c.slot, c.queue, c.priority, c.shard, c.lane_seq
    FROM claims c
    WHERE (c.job_id, c.run_lease) IN (SELECT a.job_id, a.run_lease FROM attempt_state a
                                      WHERE a.callback_waiting AND a.callback_state = 'resumed')
      AND c.queue = p_queue
      AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
    ORDER BY c.job_id, c.run_lease
    LIMIT p_max
    FOR NO KEY UPDATE OF c SKIP LOCKED
  ),
  taken AS (
    UPDATE attempt_state a SET callback_waiting = false, heartbeat_at = now(), callback_id = NULL,
                               callback_state = NULL, callback_timeout_at = NULL, callback_config = NULL
    FROM locked l
    WHERE a.job_id = l.job_id AND a.run_lease = l.run_lease AND a.callback_waiting AND a.callback_state = 'resumed'
    RETURNING a.job_id, a.run_lease, a.callback_result, a.progress
  )
  SELECT t.job_id, t.run_lease, r.kind, r.queue, r.priority, l.attempt, r.max_attempts, r.args, r.metadata, r.tags,
         r.errors, r.run_at, r.created_at, l.claimed_at, coalesce(t.progress, r.progress), t.callback_result
  FROM taken t
  JOIN locked l ON l.job_id = t.job_id AND l.run_lease = t.run_lease
  JOIN ready r ON r.slot = l.slot AND r.queue = l.queue AND r.priority = l.priority AND r.shard = l.shard
              AND r.lane_seq = l.lane_seq
  ORDER BY t.job_id;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.cleanup_dlq(p_default_retention_ms bigint, p_batch integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_count int;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'cleanup_dlq needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_0(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_0 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_1(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_1 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_10(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_10 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_11(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_11 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_12(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_12 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_13(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_13 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_14(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_14 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_15(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_15 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_2(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_2 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_3(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_3 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_4(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_4 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_5(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_5 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_6(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_6 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_7(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_7 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_8(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_8 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_9(p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(z.*)::awa.closures FROM awa.closures_9 z WHERE z.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.closures_of_slot(p_slot integer, p_job_ids bigint[])
 RETURNS awa.closures[]
 LANGUAGE sql
 STABLE
AS $function$ SELECT CASE p_slot WHEN 0 THEN awa.closures_of_0(p_job_ids) WHEN 1 THEN awa.closures_of_1(p_job_ids) WHEN 2 THEN awa.closures_of_2(p_job_ids) WHEN 3 THEN awa.closures_of_3(p_job_ids) WHEN 4 THEN awa.closures_of_4(p_job_ids) WHEN 5 THEN awa.closures_of_5(p_job_ids) WHEN 6 THEN awa.closures_of_6(p_job_ids) WHEN 7 THEN awa.closures_of_7(p_job_ids) WHEN 8 THEN awa.closures_of_8(p_job_ids) WHEN 9 THEN awa.closures_of_9(p_job_ids) WHEN 10 THEN awa.closures_of_10(p_job_ids) WHEN 11 THEN awa.closures_of_11(p_job_ids) WHEN 12 THEN awa.closures_of_12(p_job_ids) WHEN 13 THEN awa.closures_of_13(p_job_ids) WHEN 14 THEN awa.closures_of_14(p_job_ids) WHEN 15 THEN awa.closures_of_15(p_job_ids) END $function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.cron_fire(p_name text, p_expected_last timestamp with time zone, p_tick timestamp with time zone, p_job jsonb)
 RETURNS TABLE(outcome text, job_id bigint)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_schedule record;
  v_row jsonb;
  v_job_id bigint;
  v_state text;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'cron_fire needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  SELECT c.paused, c.last_fire_at INTO v_schedule FROM cron_schedules c WHERE c.name = p_name FOR UPDATE;
  IF NOT FOUND THEN
    RETURN QUERY SELECT 'not_found'::text, NULL::bigint;
    RETURN;
  END IF;
  IF v_schedule.paused THEN
    RETURN QUERY SELECT 'paused'::text, NULL::bigint;
    RETURN;
  END IF;
  IF v_schedule.last_fire_at IS DISTINCT FROM p_expected_last OR p_tick <= v_schedule.last_fire_at THEN
    RETURN QUERY SELECT 'stale'::text, NULL::bigint;
    RETURN;
  END IF;
  IF p_tick > now() THEN
    RETURN QUERY SELECT 'not_due'::text, NULL::bigint;
    RETURN;
  END IF;
  v_row := jsonb_set(p_job, '{metadata}', coalesce(p_job -> 'metadata', '{}') || jsonb_build_object(
    'awa:cronName', p_name,
    'awa:cronFireTime', to_char(p_tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')));
  SELECT e.job_id, e.state INTO v_job_id, v_state FROM enqueue(jsonb_build_array(v_row)) e;
  IF v_state = 'duplicate' THEN
    -- the unique key is held (e.g. the previous fire's job still runs): the tick is consumed
    UPDATE cron_schedules c SET last_fire_at = p_tick, last_job_id = NULL WHERE c.name = p_name;
    RETURN QUERY SELECT 'deduplicated'::text, v_job_id;
    RETURN;
  END IF;
  UPDATE cron_schedules c SET last_fire_at = p_tick, last_job_id = v_job_id WHERE c.name = p_name;
  RETURN QUERY SELECT 'fired'::text, v_job_id;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.cron_mark_stale(p_declared text[])
 RETURNS SETOF awa.cron_schedules
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
BEGIN
  RETURN QUERY
  WITH marked AS (
    UPDATE cron_schedules c SET stale_since = coalesce(c.stale_since, now())
    WHERE NOT (c.name = ANY (coalesce(p_declared, '{}')))
    RETURNING c.*
  )
  SELECT * FROM marked m ORDER BY m.name COLLATE "C";
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.cron_remove(p_name text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
BEGIN
  DELETE FROM cron_schedules c WHERE c.name = p_name;
  RETURN FOUND;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.cron_set_paused(p_name text, p_paused boolean, p_by text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
BEGIN
  UPDATE cron_schedules c SET
    paused = p_paused,
    paused_by = CASE WHEN NOT p_paused THEN NULL WHEN c.paused THEN c.paused_by ELSE p_by END,
    paused_at = CASE WHEN NOT p_paused THEN NULL WHEN c.paused THEN c.paused_at ELSE now() END,
    updated_at = CASE WHEN c.paused = p_paused THEN c.updated_at ELSE now() END
  WHERE c.name = p_name;
  RETURN FOUND;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.cron_trigger(p_name text, p_job jsonb)
 RETURNS TABLE(job_id bigint, state text)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_job_id bigint;
  v_state text;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'cron_trigger needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  PERFORM 1 FROM cron_schedules c WHERE c.name = p_name FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  SELECT e.job_id, e.state INTO v_job_id, v_state FROM enqueue(jsonb_build_array(jsonb_set(p_job, '{metadata}',
    coalesce(p_job -> 'metadata', '{}') || jsonb_build_object(
      'awa:cronName', p_name,
      'awa:cronFireTime', to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
      'awa:cronTriggered', true)))) e;
  IF v_state <> 'duplicate' THEN
    UPDATE cron_schedules c SET last_triggered_at = v_now WHERE c.name = p_name;
  END IF;
  RETURN QUERY SELECT v_job_id, v_state;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.cron_upsert(p_rows jsonb)
 RETURNS TABLE(name text, created boolean, changed boolean)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
BEGIN
  RETURN QUERY
  WITH up AS (
    INSERT INTO cron_schedules AS c (name, expression, timezone, kind, queue, args, options, missed_fire, catch_up_max,
                                     declared_at, updated_at, schedule_changed_at, last_declared_at)
    SELECT r.name, r.expression, r.timezone, r.kind, r.queue, r.args, coalesce(r.options, '{}'), r.missed_fire,
           r.catch_up_max, v_now, v_now, v_now, v_now
    FROM jsonb_to_recordset(p_rows) AS r(name text, expression text, timezone text, kind text, queue text, args jsonb,
                                         options jsonb, missed_fire text, catch_up_max int)
    ORDER BY r.name COLLATE "C"
    ON CONFLICT (name) DO UPDATE SET
      expression = excluded.expression,
      timezone = excluded.timezone,
      kind = excluded.kind,
      queue = excluded.queue,
      args = excluded.args,
      options = excluded.options,
      missed_fire = excluded.missed_fire,
      catch_up_max = excluded.catch_up_max,
      updated_at = CASE
        WHEN (c.expression, c.timezone, c.kind, c.queue, c.args, c.options, c.missed_fire, c.catch_up_max)
             IS DISTINCT FROM (excluded.expression, excluded.timezone, excluded.kind, excluded.queue, excluded.args,
                               excluded.options, excluded.missed_fire, excluded.catch_up_max)
        THEN v_now ELSE c.updated_at END,
      schedule_changed_at = CASE
        WHEN (c.expression, c.timezone) IS DISTINCT FROM (excluded.expression, excluded.timezone)
        THEN v_now ELSE c.schedule_changed_at END,
      last_declared_at = v_now,
      stale_since = NULL
    RETURNING c.name, c.declared_at = v_now AS created, c.updated_at = v_now AS changed
  )
  SELECT up.name, up.created, up.changed AND NOT up.created FROM up ORDER BY up.name COLLATE "C";
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.dlq_bulk(p_action text, p_queue text, p_kind text, p_tag text, p_since timestamp with time zone, p_until timestamp with time zone, p_before bigint)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_after bigint := 0;
  v_n int;
  v_last bigint;
  v_count int := 0;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'dlq_bulk needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  LOOP -- 0027: batches, no per-entry lock or sub-transaction
    IF p_action = 'purge' THEN
      SELECT b.purged, b.last_job_id INTO v_n, v_last FROM dlq_purge_batch(p_queue, p_kind, p_tag, p_since, p_until, p_before, v_after, 500) b;
    ELSE
      SELECT b.retried, b.last_job_id INTO v_n, v_last FROM dlq_retry_batch(p_queue, p_kind, p_tag, p_since, p_until, p_before, v_after, 500) b;
    END IF;
    EXIT WHEN v_last IS NULL;
    v_count := v_count + v_n;
    v_after := v_last;
  END LOOP;
  RETURN v_count;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.dlq_enabled(p_queue text)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
  SELECT coalesce(
    (SELECT m.dlq_enabled FROM awa.queue_meta m WHERE m.queue = p_queue),
    (SELECT (s.value #>> '{}')::boolean FROM awa.settings s WHERE s.key = 'dlq_enabled_by_default'),
    false)
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.dlq_matching(p_queue text, p_kind text, p_tag text, p_since timestamp with time zone, p_until timestamp with time zone, p_before bigint)
 RETURNS SETOF awa.dlq
 LANGUAGE sql
 STABLE
AS $function$
  SELECT d.* FROM awa.dlq d
  WHERE (p_queue IS NULL OR d.queue = p_queue)
    AND (p_kind IS NULL OR d.kind = p_kind)
    AND (p_tag IS NULL OR p_tag = ANY (d.tags))
    AND (p_since IS NULL OR d.dlq_at >= p_since)
    AND (p_until IS NULL OR d.dlq_at < p_until)
    AND (p_before IS NULL OR d.job_id < p_before)
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.dlq_purge_batch(p_queue text, p_kind text, p_tag text, p_since timestamp with time zone, p_until timestamp with time zone, p_before bigint, p_after_job_id bigint, p_limit integer, OUT purged integer, OUT last_job_id bigint)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'dlq_purge_batch needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  WITH picked AS (
    SELECT m.job_id FROM dlq m
    WHERE (p_queue IS NULL OR m.queue = p_queue) AND (p_kind IS NULL OR m.kind = p_kind)
      AND (p_tag IS NULL OR p_tag = ANY (m.tags)) AND (p_since IS NULL OR m.dlq_at >= p_since)
      AND (p_until IS NULL OR m.dlq_at < p_until) AND (p_before IS NULL OR m.job_id < p_before)
      AND m.job_id > coalesce(p_after_job_id, 0)
    ORDER BY m.job_id LIMIT p_limit
    FOR UPDATE SKIP LOCKED
  ),
  gone AS (DELETE FROM dlq d USING picked p WHERE d.job_id = p.job_id RETURNING d.job_id, d.unique_key),
  -- a purged job is gone for good: a key it still held (mask with 'failed') is released
  released AS (DELETE FROM unique_claims u USING gone g WHERE u.unique_key = g.unique_key AND u.job_id = g.job_id)
  SELECT count(*)::int, max(g.job_id) INTO purged, last_job_id FROM gone g;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.dlq_retry_batch(p_queue text, p_kind text, p_tag text, p_since timestamp with time zone, p_until timestamp with time zone, p_before bigint, p_after_job_id bigint, p_limit integer, OUT retried integer, OUT last_job_id bigint)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_ids bigint[];
  v_lane record;
  v_slot int;
  v_generation bigint;
  v_pos bigint[];
  v_queues text[];
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'dlq_retry_batch needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  retried := 0;
  SELECT array_agg(d.job_id ORDER BY d.job_id), max(d.job_id) INTO v_ids, last_job_id
  FROM (
    SELECT m.job_id FROM dlq m
    WHERE (p_queue IS NULL OR m.queue = p_queue) AND (p_kind IS NULL OR m.kind = p_kind)
      AND (p_tag IS NULL OR p_tag = ANY (m.tags)) AND (p_since IS NULL OR m.dlq_at >= p_since)
      AND (p_until IS NULL OR m.dlq_at < p_until) AND (p_before IS NULL OR m.job_id < p_before)
      AND m.job_id > coalesce(p_after_job_id, 0)
    ORDER BY m.job_id LIMIT p_limit
    FOR UPDATE SKIP LOCKED
  ) d;
  IF v_ids IS NULL THEN
    RETURN;
  END IF;

  -- the target lanes' enqueue locks, sorted, before the unique keys (enqueue's order)
  -- 0042: each entry's shard as retry_from_dlq chooses it (shard_for: the same answer for the
  -- insert below, within this transaction)
  FOR v_lane IN
    SELECT DISTINCT d.queue COLLATE "C" AS queue, d.priority, shard_for(d.queue, d.metadata) AS shard -- 0042
    FROM dlq d WHERE d.job_id = ANY (v_ids) ORDER BY 1, 2, 3 -- 0042
  LOOP
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_lane.queue, v_lane.priority, v_lane.shard)); -- 0042
    INSERT INTO lanes (queue, priority, shard) VALUES (v_lane.queue, v_lane.priority, v_lane.shard) ON CONFLICT DO NOTHING; -- 0042
  END LOOP;

  -- Keys the retried jobs must hold ('available' in their mask); an entry whose key another job
  -- holds stays in the DLQ (retry_from_dlq raises AWU01 for it; a bulk retry passes it over).
  INSERT INTO unique_claims (unique_key, job_id)
  SELECT d.unique_key, d.job_id FROM dlq d
  WHERE d.job_id = ANY (v_ids) AND d.unique_key IS NOT NULL AND (d.unique_states & state_bit('available')) <> 0
  ORDER BY d.job_id
  ON CONFLICT (unique_key) DO NOTHING;
  SELECT array_agg(d.job_id ORDER BY d.job_id) INTO v_ids FROM dlq d
  WHERE d.job_id = ANY (v_ids)
    AND (d.unique_key IS NULL OR (d.unique_states & state_bit('available')) = 0
         OR EXISTS (SELECT 1 FROM unique_claims u WHERE u.unique_key = d.unique_key AND u.job_id = d.job_id));
  IF v_ids IS NULL THEN
    RETURN;
  END IF;

  SELECT o_generation, o_slot INTO v_generation, v_slot FROM enqueue_ready_slot();
  SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, cardinality(v_ids))) s;
  WITH gone AS (
    DELETE FROM dlq d WHERE d.job_id = ANY (v_ids) RETURNING d.*
  ),
  ranked AS (
    SELECT g.*, row_number() OVER (ORDER BY g.job_id) AS rank FROM gone g
  ),
  ins AS (
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_slot, v_generation, r.job_id, r.kind, r.queue, r.priority, shard_for(r.queue, r.metadata), v_pos[r.rank], r.args, r.metadata, r.tags, -- 0042
           r.errors, r.progress, 0, r.original_run_lease, r.max_attempts, v_now, r.created_at, r.unique_key, r.unique_states
    FROM ranked r
    RETURNING queue
  )
  SELECT count(*)::int, array_agg(DISTINCT ins.queue) INTO retried, v_queues FROM ins;
  PERFORM pg_notify('awa_wake_awa', q) FROM unnest(v_queues) AS q;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.drain_queue(p_queue text, p_reason text)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
DECLARE
  v_max bigint;
  v_n int;
  v_count int := 0;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'drain_queue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  SELECT s.last_value INTO v_max FROM job_id_seq s; -- 0027
  LOOP
    v_n := drain_queue_batch(p_queue, p_reason, 500, v_max); -- 0027
    v_count := v_count + v_n;
    EXIT WHEN v_n = 0;
  END LOOP;
  RETURN v_count;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.drain_queue_batch(p_queue text, p_reason text, p_limit integer, p_max_job_id bigint)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_left int := p_limit;
  v_n int;
  v_ring record;
  v_lane record;
  v_cursor bigint;
  v_last bigint;
  v_lo1 int;
  v_hi1 int;
  v_lo2 int;
  v_hi2 int;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'drain_queue_batch needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF p_limit <= 0 THEN
    RETURN 0;
  END IF;

  -- Deferred jobs (no index by queue: a scan of deferred per call, which holds only what is
  -- scheduled or retrying). FOR UPDATE waits for a promote or cancel holding a row; the DELETE
  -- then finds it gone and the next statements see where it went.
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('terminal');
  WITH picked AS (
    SELECT d.job_id FROM deferred d
    WHERE d.queue = p_queue AND d.job_id <= p_max_job_id
    ORDER BY d.job_id LIMIT v_left
    FOR UPDATE
  ),
  gone AS (
    DELETE FROM deferred d USING picked p WHERE d.job_id = p.job_id RETURNING d.*
  ),
  term AS (
    INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                          kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_ring.slot, v_ring.generation, g.job_id, g.run_lease, 'cancelled', g.attempt, v_now,
           append_error(g.errors, jsonb_build_object('error', 'cancelled: ' || p_reason, 'attempt', g.attempt, 'at', v_now)),
           g.progress, true, g.kind, g.queue, g.priority, g.args, g.metadata, g.tags, g.max_attempts, g.run_at,
           g.created_at, g.unique_key, g.unique_states
    FROM gone g
  ),
  released AS (
    DELETE FROM unique_claims u USING gone g
    WHERE u.unique_key = g.unique_key AND u.job_id = g.job_id AND (g.unique_states & state_bit('cancelled')) = 0
  )
  SELECT count(*) INTO v_n FROM gone;
  v_left := v_left - v_n;

  -- Available jobs, lane by lane under the lane's claim lock (sorted: two drains take them in the
  -- same order).
  FOR v_lane IN SELECT l.priority, l.shard FROM lanes l WHERE l.queue = p_queue ORDER BY l.priority, l.shard LOOP
    EXIT WHEN v_left <= 0;
    PERFORM pg_advisory_xact_lock(lock_ns('claim'), lane_key(p_queue, v_lane.priority, v_lane.shard));

    -- Parked rows (0021): out of the ring, at or past the lane's barrier. Under the claim lock
    -- neither unpark nor prune's park moves them meanwhile (cancel_job deletes them the same way).
    SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('terminal');
    WITH gone AS (
      DELETE FROM parked p
      WHERE p.queue = p_queue AND p.priority = v_lane.priority AND p.shard = v_lane.shard
        AND p.lane_seq IN (SELECT q.lane_seq FROM parked q
                           WHERE q.queue = p_queue AND q.priority = v_lane.priority AND q.shard = v_lane.shard
                             AND q.job_id <= p_max_job_id
                           ORDER BY q.lane_seq LIMIT v_left)
      RETURNING p.*
    ),
    term AS (
      INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                            kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT v_ring.slot, v_ring.generation, g.job_id, g.run_lease, 'cancelled', g.attempt, v_now,
             append_error(g.errors, jsonb_build_object('error', 'cancelled: ' || p_reason, 'attempt', g.attempt, 'at', v_now)),
             g.progress, true, g.kind, g.queue, g.priority, g.args, g.metadata, g.tags, g.max_attempts, g.run_at,
             g.created_at, g.unique_key, g.unique_states
      FROM gone g
    ),
    released AS (
      DELETE FROM unique_claims u USING gone g
      WHERE u.unique_key = g.unique_key AND u.job_id = g.job_id AND (g.unique_states & state_bit('cancelled')) = 0
    )
    SELECT count(*) INTO v_n FROM gone;
    v_left := v_left - v_n;
    EXIT WHEN v_left <= 0;

    -- Ready rows from the cursor, in a new statement after the lock (the previous claimer's mark
    -- is seen), up to the barrier of the parked rows still left (as claim's pick), tombstoned.
    v_cursor := lane_cursor(p_queue, v_lane.priority, v_lane.shard);
    IF v_lo1 IS NULL THEN
      SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_lo1, v_hi1, v_lo2, v_hi2 FROM queue_slot_ranges() s;
    END IF;
    WITH picked AS MATERIALIZED (
      SELECT r.* FROM ready r
      WHERE r.queue = p_queue AND r.priority = v_lane.priority AND r.shard = v_lane.shard AND r.lane_seq >= v_cursor
        AND (r.slot BETWEEN v_lo1 AND v_hi1 OR r.slot BETWEEN v_lo2 AND v_hi2)
        AND r.job_id <= p_max_job_id
        -- (t.lane_seq >= the cursor too: on fresh children without statistics the planner may scan
        -- the lane's tombstones once per row instead of probing, and those below the cursor, a
        -- drain's earlier batches, are most of them)
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          AND t.lane_seq >= v_cursor)
        AND r.lane_seq < coalesce((SELECT p.lane_seq FROM parked p
                                   WHERE p.queue = p_queue AND p.priority = v_lane.priority AND p.shard = v_lane.shard
                                   ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
      ORDER BY r.lane_seq LIMIT v_left
    ),
    tomb AS (
      INSERT INTO ready_tombstones (slot, generation, job_id, queue, priority, shard, lane_seq)
      SELECT p.slot, p.generation, p.job_id, p.queue, p.priority, p.shard, p.lane_seq FROM picked p
    ),
    term AS (
      INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                            kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT p.slot, p.generation, p.job_id, p.run_lease, 'cancelled', p.attempt, v_now,
             append_error(p.errors, jsonb_build_object('error', 'cancelled: ' || p_reason, 'attempt', p.attempt, 'at', v_now)),
             p.progress, true, p.kind, p.queue, p.priority, p.args, p.metadata, p.tags, p.max_attempts, p.run_at,
             p.created_at, p.unique_key, p.unique_states
      FROM picked p
    ),
    released AS (
      DELETE FROM unique_claims u USING picked p
      WHERE u.unique_key = p.unique_key AND u.job_id = p.job_id AND (p.unique_states & state_bit('cancelled')) = 0
    )
    SELECT count(*), max(p.lane_seq) INTO v_n, v_last FROM picked p;
    v_left := v_left - v_n;
    IF v_n > 0 THEN
      -- A claim mark past the last row taken, as claim writes one: every position from the cursor
      -- up to it is now tombstoned or claimed, so the lane's next batch (and claim) starts after it
      -- instead of stepping over ever more tombstones. It stays below the barrier.
      SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('claim_marks');
      INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
      VALUES (v_ring.slot, v_ring.generation, p_queue, v_lane.priority, v_lane.shard, v_last + 1);
    END IF;
  END LOOP;
  RETURN p_limit - v_left;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.end_idle_blockers(p_slot integer, p_idle_ms bigint)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
DECLARE
  v_pid int;
  v_n int := 0;
BEGIN
  FOR v_pid IN
    SELECT DISTINCT l.pid
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
      AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
      AND l.relation IN (SELECT format('%I.%I', 'awa', t || '_' || p_slot)::regclass::oid
                         FROM unnest(ARRAY['ready', 'ready_tombstones', 'claims', 'claim_marks', 'closures', 'terminal', 'claim_spans']) t) -- 0053
      AND a.state IN ('idle in transaction', 'idle in transaction (aborted)')
      AND a.state_change < now() - p_idle_ms * interval '1 millisecond'
  LOOP
    BEGIN
      IF pg_terminate_backend(v_pid) THEN
        v_n := v_n + 1;
        RAISE WARNING 'awa: ended session % (idle in transaction, holding queue-ring slot % against prune)', v_pid, p_slot;
      END IF;
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE WARNING 'awa: session % is idle in transaction and blocks prune of slot %, but may not be ended by this role', v_pid, p_slot;
    END;
  END LOOP;
  RETURN v_n;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.enqueue(p_rows jsonb)
 RETURNS TABLE(ord integer, job_id bigint, state text)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_n int := jsonb_array_length(p_rows);
  v_divert boolean := current_setting('transaction_isolation') <> 'read committed';
  v_lane record;
  v_slot int;
  v_generation bigint;
  v_ids bigint[];
  v_pos bigint[];
  v_n_ready int;
  v_keys int;
  v_inserted int;
BEGIN
  FOR v_lane IN
    -- byte order (C collation): the TypeScript side sorts multi-call batches the same way
    SELECT DISTINCT r.queue COLLATE "C" AS queue, r.priority
    FROM jsonb_to_recordset(p_rows) AS r(queue text, priority int, run_at timestamptz)
    WHERE NOT v_divert AND (r.run_at IS NULL OR r.run_at <= v_now)
    ORDER BY 1, 2
  LOOP
    -- = lane_key(queue, priority, 0), written with immutable operators so it is inlined
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'),
                                  hashtext(v_lane.queue || chr(31) || v_lane.priority::text || chr(31) || '0'));
    INSERT INTO lanes (queue, priority, shard)
    SELECT v_lane.queue, v_lane.priority, 0
    WHERE NOT EXISTS (SELECT 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = 0)
    ON CONFLICT DO NOTHING;
  END LOOP;

  SELECT array_agg(v ORDER BY v) INTO v_ids FROM (SELECT nextval('job_id_seq') AS v FROM generate_series(1, v_n)) s;

  -- Keys first: a batch that loses one writes nothing else (see enqueue_batch).
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_rows) AS e(v) WHERE e.v ->> 'unique_key' IS NOT NULL) THEN
    WITH ins AS (
      INSERT INTO unique_claims (unique_key, job_id)
      SELECT decode(e.v ->> 'unique_key', 'hex'), v_ids[e.o] FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS e(v, o)
      -- only a row whose initial state is in its mask takes its key (capabilities.md §4)
      WHERE e.v ->> 'unique_key' IS NOT NULL AND (coalesce((e.v ->> 'unique_states')::int, 0)
                                                   & CASE WHEN NOT v_divert AND (e.v ->> 'run_at' IS NULL OR (e.v ->> 'run_at')::timestamptz <= v_now)
                                                          THEN 2 ELSE 1 END) <> 0
      ORDER BY e.o
      ON CONFLICT (unique_key) DO NOTHING
      RETURNING 1
    )
    SELECT count(*) INTO v_inserted FROM ins;
    SELECT count(*) INTO v_keys FROM jsonb_array_elements(p_rows) AS e(v)
    WHERE e.v ->> 'unique_key' IS NOT NULL AND (coalesce((e.v ->> 'unique_states')::int, 0)
                                                 & CASE WHEN NOT v_divert AND (e.v ->> 'run_at' IS NULL OR (e.v ->> 'run_at')::timestamptz <= v_now)
                                                        THEN 2 ELSE 1 END) <> 0;
    IF v_inserted < v_keys THEN
      RETURN QUERY
      SELECT e.o::int, u.job_id, 'duplicate'::text
      FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS e(v, o)
      LEFT JOIN unique_claims u ON u.unique_key = decode(e.v ->> 'unique_key', 'hex')
      WHERE e.v ->> 'unique_key' IS NOT NULL AND u.job_id IS DISTINCT FROM v_ids[e.o]
        AND (coalesce((e.v ->> 'unique_states')::int, 0)
               & CASE WHEN NOT v_divert AND (e.v ->> 'run_at' IS NULL OR (e.v ->> 'run_at')::timestamptz <= v_now)
                      THEN 2 ELSE 1 END) <> 0
      ORDER BY e.o LIMIT 1;
      DELETE FROM unique_claims u WHERE u.job_id = ANY (v_ids);
      RETURN;
    END IF;
  END IF;

  SELECT count(*) INTO v_n_ready FROM jsonb_to_recordset(p_rows) AS r(run_at timestamptz)
  WHERE NOT v_divert AND (r.run_at IS NULL OR r.run_at <= v_now);
  IF v_n_ready > 0 THEN
    -- After the lane locks: the slot is never older than the lane's previous rows.
    SELECT o_generation, o_slot INTO v_generation, v_slot FROM enqueue_ready_slot();
    SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, v_n_ready)) s;
  END IF;

  RETURN QUERY
  WITH input AS (
    -- args from the element itself: JSON null stays JSON null (jsonb_to_record made it SQL NULL)
    SELECT x_e.o::int AS o, v_ids[x_e.o] AS id, x.kind, x.queue, x.priority, x_e.v -> 'args' AS args, x.metadata,
           ARRAY(SELECT jsonb_array_elements_text(x.tags)) AS tags, x.max_attempts,
           coalesce(x.run_at, v_now) AS run_at, NOT v_divert AND (x.run_at IS NULL OR x.run_at <= v_now) AS ready,
           decode(x.unique_key, 'hex') AS unique_key, coalesce(x.unique_states, 0) AS unique_states
    FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS x_e(v, o), jsonb_to_record(x_e.v) AS x(kind text, queue text, priority smallint,
         metadata jsonb, tags jsonb, max_attempts int, run_at timestamptz, unique_key text, unique_states int)
  ),
  ranked AS (
    SELECT i.*, row_number() OVER (ORDER BY i.o) AS rank FROM input i WHERE i.ready
  ),
  ins_ready AS (
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_slot, v_generation, r.id, r.kind, r.queue, r.priority, 0, v_pos[r.rank], r.args, r.metadata,
           r.tags, '[]', 0, 0, r.max_attempts, r.run_at, v_now, r.unique_key, r.unique_states
    FROM ranked r
  ),
  ins_deferred AS (
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT i.id, 'scheduled', i.kind, i.queue, i.priority, 0, i.args, i.metadata, i.tags, '[]', 0, 0,
           i.max_attempts, i.run_at, v_now, i.unique_key, i.unique_states
    FROM input i WHERE NOT i.ready
  )
  SELECT i.o, i.id, CASE WHEN i.ready THEN 'available' ELSE 'scheduled' END
  FROM input i
  ORDER BY i.o;

  -- Delivered on commit only; identical (channel, payload) pairs are folded by Postgres.
  PERFORM pg_notify('awa_wake_awa', q.queue)
  FROM (SELECT DISTINCT r.queue FROM jsonb_to_recordset(p_rows) AS r(queue text, run_at timestamptz)
        WHERE NOT v_divert AND (r.run_at IS NULL OR r.run_at <= v_now)) q;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.enqueue_batch(p_headers jsonb, p_args jsonb, p_header_of integer[], p_keys jsonb, OUT job_ids bigint[], OUT scheduled_headers integer[], OUT conflict_key text, OUT conflict_holder bigint)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_n int := jsonb_array_length(p_args);
  -- outside READ COMMITTED every job goes to deferred (see the header of this migration)
  v_divert boolean := current_setting('transaction_isolation') <> 'read committed';
  v_lane record;
  v_slot int;
  v_generation bigint;
  v_pos bigint[];
  v_n_ready int;
  v_h record;
  v_keys int;
  v_inserted int;
  v_shards smallint[]; -- 0042: each header's shard, by header index + 1
BEGIN
  SELECT array_agg(e.o::int - 1 ORDER BY e.o) FILTER (WHERE v_divert OR x.run_at > v_now) INTO scheduled_headers
  FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o), jsonb_to_record(e.v) AS x(run_at timestamptz);

  -- 0042: each header's shard (capabilities.md §22). A queue of width 1 (no queue_meta row, or the
  -- default): shard 0, as before. Otherwise the header's ordering key's digest (else its
  -- concurrency key's) modulo the width; else the transaction's rotor draw (shard_draw) modulo
  -- the width: a batch without keys stays in one lane (per-row fan-out costs more than it
  -- spreads), and so do all chunks of one insertMany.
  WITH h AS MATERIALIZED (
    SELECT e.o, x.queue, x.priority,
           coalesce(x.metadata ->> 'awa:orderingKey', x.metadata ->> 'awa:concurrencyKey') AS k,
           coalesce((SELECT m.enqueue_shards FROM queue_meta m WHERE m.queue = x.queue), 1) AS w
    FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o),
         jsonb_to_record(e.v) AS x(queue text, priority int, metadata jsonb)
  )
  SELECT array_agg((CASE WHEN h.w <= 1 THEN 0
                        WHEN h.k IS NOT NULL
                        THEN (hashtextextended('shard' || chr(31) || h.k, 0) & 9223372036854775807) % h.w
                        ELSE shard_draw() % h.w END)::smallint
                   ORDER BY h.o)
  INTO v_shards FROM h;

  FOR v_lane IN
    SELECT DISTINCT x.queue COLLATE "C" AS queue, x.priority, v_shards[e.o] AS shard -- 0042
    FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o), -- 0042
         jsonb_to_record(e.v) AS x(queue text, priority int, run_at timestamptz) -- 0042
    WHERE NOT v_divert AND (x.run_at IS NULL OR x.run_at <= v_now)
    ORDER BY 1, 2, 3 -- 0042
  LOOP
    -- = lane_key(queue, priority, shard), written with immutable operators so it is inlined
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'),
                                  hashtext(v_lane.queue || chr(31) || v_lane.priority::text || chr(31) || v_lane.shard::text)); -- 0042
    PERFORM 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = v_lane.shard; -- 0042
    IF NOT FOUND THEN
      INSERT INTO lanes (queue, priority, shard) VALUES (v_lane.queue, v_lane.priority, v_lane.shard) ON CONFLICT DO NOTHING; -- 0042
    END IF;
  END LOOP;

  SELECT array_agg(v ORDER BY v) INTO job_ids FROM (SELECT nextval('job_id_seq') AS v FROM generate_series(1, v_n)) s;

  IF p_keys IS NOT NULL THEN
    WITH ins AS (
      INSERT INTO unique_claims (unique_key, job_id)
      SELECT decode(k.v, 'hex'), job_ids[k.o] FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS k(v, o)
      -- only a row whose initial state is in its mask takes its key (capabilities.md §4)
      WHERE k.v IS NOT NULL AND (coalesce((p_headers -> coalesce(p_header_of[k.o], 0) ->> 'unique_states')::int, 0)
                                   & CASE WHEN coalesce(p_header_of[k.o], 0) = ANY (coalesce(scheduled_headers, '{}')) THEN 1 ELSE 2 END) <> 0
      ORDER BY k.o
      ON CONFLICT (unique_key) DO NOTHING
      RETURNING 1
    )
    SELECT count(*) INTO v_inserted FROM ins;
    SELECT count(*) INTO v_keys FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS k(v, o)
    WHERE k.v IS NOT NULL AND (coalesce((p_headers -> coalesce(p_header_of[k.o], 0) ->> 'unique_states')::int, 0)
                                 & CASE WHEN coalesce(p_header_of[k.o], 0) = ANY (coalesce(scheduled_headers, '{}')) THEN 1 ELSE 2 END) <> 0;
    IF v_inserted < v_keys THEN
      -- A key that was not inserted lost to an existing holder (or to an earlier row of this
      -- batch): the whole call is rejected. The holder is read before our own keys are removed.
      SELECT k.v, u.job_id INTO conflict_key, conflict_holder
      FROM jsonb_array_elements_text(p_keys) WITH ORDINALITY AS k(v, o)
      LEFT JOIN unique_claims u ON u.unique_key = decode(k.v, 'hex')
      WHERE k.v IS NOT NULL AND u.job_id IS DISTINCT FROM job_ids[k.o]
        AND (coalesce((p_headers -> coalesce(p_header_of[k.o], 0) ->> 'unique_states')::int, 0)
               & CASE WHEN coalesce(p_header_of[k.o], 0) = ANY (coalesce(scheduled_headers, '{}')) THEN 1 ELSE 2 END) <> 0
      ORDER BY k.o LIMIT 1;
      DELETE FROM unique_claims u WHERE u.job_id = ANY (job_ids);
      job_ids := NULL;
      scheduled_headers := NULL;
      RETURN;
    END IF;
  END IF;

  IF scheduled_headers IS NULL THEN
    -- Every job is available now: positions in input order.
    -- After the lane locks: the slot is never older than the lane's previous rows.
    SELECT o_generation, o_slot INTO v_generation, v_slot FROM enqueue_ready_slot();
    SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, v_n)) s;
    IF p_header_of IS NULL AND jsonb_array_length(p_headers) = 1 THEN
      -- One header (an insertMany): its fields are constants of the insert, no join per row.
      SELECT x.kind, x.queue, x.priority, x.metadata, ARRAY(SELECT jsonb_array_elements_text(x.tags)) AS tags,
             x.max_attempts, coalesce(x.run_at, v_now) AS run_at, coalesce(x.unique_states, 0) AS unique_states
      INTO v_h FROM jsonb_to_record(p_headers -> 0) AS x(kind text, queue text, priority smallint, metadata jsonb,
                                                         tags jsonb, max_attempts int, run_at timestamptz,
                                                         unique_states int);
      INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                         errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT v_slot, v_generation, job_ids[a.o], v_h.kind, v_h.queue, v_h.priority, v_shards[1], v_pos[a.o], a.v, -- 0042
             v_h.metadata, v_h.tags, '[]', 0, 0, v_h.max_attempts, v_h.run_at, v_now,
             CASE WHEN p_keys IS NOT NULL THEN decode(p_keys ->> (a.o::int - 1), 'hex') END, v_h.unique_states
      FROM jsonb_array_elements(p_args) WITH ORDINALITY AS a(v, o);
    ELSE
      INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                         errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT v_slot, v_generation, job_ids[a.o], h.kind, h.queue, h.priority, v_shards[h.i + 1], v_pos[a.o], a.v, -- 0042
             h.metadata, h.tags, '[]', 0, 0, h.max_attempts, h.run_at, v_now,
             CASE WHEN p_keys IS NOT NULL THEN decode(p_keys ->> (a.o::int - 1), 'hex') END, h.unique_states
      FROM jsonb_array_elements(p_args) WITH ORDINALITY AS a(v, o)
      JOIN (SELECT e.o::int - 1 AS i, x.kind, x.queue, x.priority, x.metadata,
                   ARRAY(SELECT jsonb_array_elements_text(x.tags)) AS tags, x.max_attempts,
                   coalesce(x.run_at, v_now) AS run_at, coalesce(x.unique_states, 0) AS unique_states
            FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o),
                 jsonb_to_record(e.v) AS x(kind text, queue text, priority smallint, metadata jsonb, tags jsonb,
                                           max_attempts int, run_at timestamptz, unique_states int)) h
        ON h.i = coalesce(p_header_of[a.o], 0);
    END IF;
  ELSE
    -- Some jobs are deferred: positions go to the available ones, in input order.
    SELECT count(*) INTO v_n_ready FROM generate_series(1, v_n) AS g(o)
    WHERE NOT (coalesce(p_header_of[g.o], 0) = ANY (scheduled_headers));
    IF v_n_ready > 0 THEN
      SELECT o_generation, o_slot INTO v_generation, v_slot FROM enqueue_ready_slot();
      SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, v_n_ready)) s;
    END IF;
    WITH h AS MATERIALIZED (
      SELECT e.o::int - 1 AS i, x.kind, x.queue, x.priority, x.metadata,
             ARRAY(SELECT jsonb_array_elements_text(x.tags)) AS tags, x.max_attempts,
             coalesce(x.run_at, v_now) AS run_at, coalesce(x.unique_states, 0) AS unique_states,
             NOT (e.o::int - 1 = ANY (scheduled_headers)) AS ready
      FROM jsonb_array_elements(p_headers) WITH ORDINALITY AS e(v, o),
           jsonb_to_record(e.v) AS x(kind text, queue text, priority smallint, metadata jsonb, tags jsonb,
                                     max_attempts int, run_at timestamptz, unique_states int)
    ),
    j AS MATERIALIZED (
      SELECT a.o, a.v AS args, h.i, h.kind, h.queue, h.priority, h.metadata, h.tags, h.max_attempts, h.run_at, -- 0042: h.i
             h.unique_states, h.ready,
             CASE WHEN p_keys IS NOT NULL THEN decode(p_keys ->> (a.o::int - 1), 'hex') END AS k
      FROM jsonb_array_elements(p_args) WITH ORDINALITY AS a(v, o)
      JOIN h ON h.i = coalesce(p_header_of[a.o], 0)
    ),
    ranked AS (
      SELECT j.*, row_number() OVER (ORDER BY j.o) AS rank FROM j WHERE j.ready
    ),
    ins_ready AS (
      INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                         errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
      SELECT v_slot, v_generation, job_ids[r.o], r.kind, r.queue, r.priority, v_shards[r.i + 1], v_pos[r.rank], r.args, -- 0042
             r.metadata, r.tags, '[]', 0, 0, r.max_attempts, r.run_at, v_now, r.k, r.unique_states
      FROM ranked r
    )
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT job_ids[j.o], 'scheduled', j.kind, j.queue, j.priority, v_shards[j.i + 1], j.args, j.metadata, j.tags, '[]', 0, 0, -- 0042
           j.max_attempts, j.run_at, v_now, j.k, j.unique_states
    FROM j WHERE NOT j.ready;
  END IF;

  -- Delivered on commit only; identical (channel, payload) pairs are folded by Postgres.
  -- 0051: unless no worker waits for the queue's wake-ups (see the header).
  PERFORM pg_notify('awa_wake_awa', q.queue)
  FROM (SELECT DISTINCT x.queue FROM jsonb_to_recordset(p_headers) AS x(queue text, run_at timestamptz)
        WHERE NOT v_divert AND (x.run_at IS NULL OR x.run_at <= v_now)) q
  WHERE NOT (wake_on_demand() AND pg_try_advisory_xact_lock(lock_ns('waiters'), waiter_bucket(q.queue))); -- 0051
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.enqueue_one(p_kind text, p_queue text, p_priority integer, p_args jsonb, p_metadata jsonb, p_tags jsonb, p_max_attempts integer, p_run_at timestamp with time zone, p_unique_key bytea, p_unique_states integer, OUT job_id bigint, OUT state text)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_id bigint := nextval('job_id_seq');
  v_tags text[];
  v_generation bigint;
  v_slot int;
  v_ready boolean := (p_run_at IS NULL OR p_run_at <= v_now)
                     AND current_setting('transaction_isolation') = 'read committed';
  v_width int; -- 0042: the queue's enqueueShards
  v_shard smallint := 0; -- 0042
  v_key text; -- 0042: the ordering key, else the concurrency key
BEGIN
  -- 0042: the shard (capabilities.md §22). Width 1 (no queue_meta row, or the default): shard 0,
  -- as before. Otherwise the ordering key's digest (else the concurrency key's) modulo the width,
  -- so a key's jobs share a lane; else the rotor's next draw.
  SELECT m.enqueue_shards INTO v_width FROM queue_meta m WHERE m.queue = p_queue; -- 0042
  IF v_width > 1 THEN -- 0042
    v_key := coalesce(p_metadata ->> 'awa:orderingKey', p_metadata ->> 'awa:concurrencyKey'); -- 0042
    v_shard := CASE WHEN v_key IS NOT NULL -- 0042
                    THEN (hashtextextended('shard' || chr(31) || v_key, 0) & 9223372036854775807) % v_width -- 0042
                    ELSE shard_draw() % v_width END; -- 0042
  END IF; -- 0042
  IF p_tags IS NULL OR jsonb_array_length(p_tags) = 0 THEN
    v_tags := '{}';
  ELSE
    v_tags := ARRAY(SELECT jsonb_array_elements_text(p_tags));
  END IF;
  IF v_ready THEN
    -- = lane_key(p_queue, p_priority, v_shard), written with immutable operators so it is inlined
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'),
                                  hashtext(p_queue || chr(31) || p_priority::text || chr(31) || v_shard::text)); -- 0042
    PERFORM 1 FROM lanes l WHERE l.queue = p_queue AND l.priority = p_priority AND l.shard = v_shard; -- 0042
    IF NOT FOUND THEN
      INSERT INTO lanes (queue, priority, shard) VALUES (p_queue, p_priority, v_shard) ON CONFLICT DO NOTHING; -- 0042
    END IF;
  END IF;
  -- only when the initial state is in the job's mask (capabilities.md §4)
  IF p_unique_key IS NOT NULL AND (coalesce(p_unique_states, 0) & CASE WHEN v_ready THEN 2 ELSE 1 END) <> 0 THEN
    INSERT INTO unique_claims (unique_key, job_id) VALUES (p_unique_key, v_id) ON CONFLICT (unique_key) DO NOTHING;
    IF NOT FOUND THEN
      SELECT u.job_id INTO job_id FROM unique_claims u WHERE u.unique_key = p_unique_key;
      state := 'duplicate';
      RETURN;
    END IF;
  END IF;
  IF v_ready THEN
    -- After the lane lock: the slot is never older than the lane's previous rows. As
    -- enqueue_ready_slot, inline (one function call less per job).
    LOOP
      SELECT r.generation, r.slot INTO v_generation, v_slot FROM ring_rotations r
      WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
      CASE v_slot
        WHEN 0 THEN LOCK TABLE awa.ready_0 IN ROW EXCLUSIVE MODE;
        WHEN 1 THEN LOCK TABLE awa.ready_1 IN ROW EXCLUSIVE MODE;
        WHEN 2 THEN LOCK TABLE awa.ready_2 IN ROW EXCLUSIVE MODE;
        WHEN 3 THEN LOCK TABLE awa.ready_3 IN ROW EXCLUSIVE MODE;
        WHEN 4 THEN LOCK TABLE awa.ready_4 IN ROW EXCLUSIVE MODE;
        WHEN 5 THEN LOCK TABLE awa.ready_5 IN ROW EXCLUSIVE MODE;
        WHEN 6 THEN LOCK TABLE awa.ready_6 IN ROW EXCLUSIVE MODE;
        WHEN 7 THEN LOCK TABLE awa.ready_7 IN ROW EXCLUSIVE MODE;
        WHEN 8 THEN LOCK TABLE awa.ready_8 IN ROW EXCLUSIVE MODE;
        WHEN 9 THEN LOCK TABLE awa.ready_9 IN ROW EXCLUSIVE MODE;
        WHEN 10 THEN LOCK TABLE awa.ready_10 IN ROW EXCLUSIVE MODE;
        WHEN 11 THEN LOCK TABLE awa.ready_11 IN ROW EXCLUSIVE MODE;
        WHEN 12 THEN LOCK TABLE awa.ready_12 IN ROW EXCLUSIVE MODE;
        WHEN 13 THEN LOCK TABLE awa.ready_13 IN ROW EXCLUSIVE MODE;
        WHEN 14 THEN LOCK TABLE awa.ready_14 IN ROW EXCLUSIVE MODE;
        WHEN 15 THEN LOCK TABLE awa.ready_15 IN ROW EXCLUSIVE MODE;
        -- a ring installed with more slots than 0002's 16
        ELSE EXECUTE format('LOCK TABLE %I.%I IN ROW EXCLUSIVE MODE', 'awa', 'ready_' || v_slot);
      END CASE;
      EXIT WHEN NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = v_generation);
    END LOOP;
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    VALUES (v_slot, v_generation, v_id, p_kind, p_queue, p_priority, v_shard, nextval('lane_seq'), p_args, -- 0042
            p_metadata, v_tags, '[]', 0, 0, p_max_attempts, coalesce(p_run_at, v_now), v_now, p_unique_key,
            coalesce(p_unique_states, 0));
    state := 'available';
    -- Delivered on commit only. 0051: unless no worker waits for this queue's wake-ups (see the
    -- header): then the try holds the queue's waiter bucket to commit instead.
    IF NOT (wake_on_demand() AND pg_try_advisory_xact_lock(lock_ns('waiters'), waiter_bucket(p_queue))) THEN -- 0051
      PERFORM pg_notify('awa_wake_awa', p_queue);
    END IF; -- 0051
  ELSE
    INSERT INTO deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors, attempt,
                          run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    VALUES (v_id, 'scheduled', p_kind, p_queue, p_priority, v_shard, p_args, p_metadata, v_tags, '[]', 0, 0, -- 0042
            p_max_attempts, coalesce(p_run_at, v_now), v_now, p_unique_key, coalesce(p_unique_states, 0));
    state := 'scheduled';
  END IF;
  job_id := v_id;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.enqueue_ready_slot(OUT o_generation bigint, OUT o_slot integer)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'enqueue_ready_slot needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  LOOP
    SELECT r.generation, r.slot INTO o_generation, o_slot FROM ring_rotations r
    WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
    CASE o_slot
      WHEN 0 THEN LOCK TABLE awa.ready_0 IN ROW EXCLUSIVE MODE;
      WHEN 1 THEN LOCK TABLE awa.ready_1 IN ROW EXCLUSIVE MODE;
      WHEN 2 THEN LOCK TABLE awa.ready_2 IN ROW EXCLUSIVE MODE;
      WHEN 3 THEN LOCK TABLE awa.ready_3 IN ROW EXCLUSIVE MODE;
      WHEN 4 THEN LOCK TABLE awa.ready_4 IN ROW EXCLUSIVE MODE;
      WHEN 5 THEN LOCK TABLE awa.ready_5 IN ROW EXCLUSIVE MODE;
      WHEN 6 THEN LOCK TABLE awa.ready_6 IN ROW EXCLUSIVE MODE;
      WHEN 7 THEN LOCK TABLE awa.ready_7 IN ROW EXCLUSIVE MODE;
      WHEN 8 THEN LOCK TABLE awa.ready_8 IN ROW EXCLUSIVE MODE;
      WHEN 9 THEN LOCK TABLE awa.ready_9 IN ROW EXCLUSIVE MODE;
      WHEN 10 THEN LOCK TABLE awa.ready_10 IN ROW EXCLUSIVE MODE;
      WHEN 11 THEN LOCK TABLE awa.ready_11 IN ROW EXCLUSIVE MODE;
      WHEN 12 THEN LOCK TABLE awa.ready_12 IN ROW EXCLUSIVE MODE;
      WHEN 13 THEN LOCK TABLE awa.ready_13 IN ROW EXCLUSIVE MODE;
      WHEN 14 THEN LOCK TABLE awa.ready_14 IN ROW EXCLUSIVE MODE;
      WHEN 15 THEN LOCK TABLE awa.ready_15 IN ROW EXCLUSIVE MODE;
      -- a ring installed with more slots than 0002's 16
      ELSE EXECUTE format('LOCK TABLE %I.%I IN ROW EXCLUSIVE MODE', 'awa', 'ready_' || o_slot);
    END CASE;
    EXIT WHEN NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = o_generation);
  END LOOP;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.finalize(p_items jsonb)
 RETURNS TABLE(ord integer, applied boolean, state text)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_nestloop TO 'off'
 SET jit TO 'off'
AS $function$
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.finalize_completions(p_job_ids bigint[], p_run_leases bigint[], p_stale_before timestamp with time zone[] DEFAULT NULL::timestamp with time zone[])
 RETURNS TABLE(ord integer, applied boolean, state text)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET plan_cache_mode TO 'force_generic_plan'
 SET enable_seqscan TO 'off'
 SET enable_nestloop TO 'off'
 SET jit TO 'off'
AS $function$
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
  v_closed closures[] := '{}'; -- 0064: the batch's closures, slot by slot
  v_keyed_rows ready[] := '{}'; -- 0064: the ready rows of v_unique_ids, slot by slot
  v_s int; -- 0064: a slot holding the batch's claims
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
  -- 0064: those closures and ready rows, read slot by slot through each slot's own functions
  -- (closures_of_<slot>, ready_rows_of_<slot>; see the header) before the statement, not by the
  -- statement through the parents. Sound in earlier statements: the claims rows locked above keep
  -- every other closer of these attempts out (each locks them first), and ready rows are never
  -- changed.
  IF v_slo1 IS NOT NULL THEN -- 0064
    FOR v_s IN v_slo1 .. v_shi1 LOOP -- 0064
      v_closed := v_closed || closures_of_slot(v_s, v_ids); -- 0064
      IF v_unique_ids IS NOT NULL THEN -- 0064
        v_keyed_rows := v_keyed_rows || ready_rows_of_slot(v_s, v_unique_ids); -- 0064
      END IF; -- 0064
    END LOOP; -- 0064
  END IF; -- 0064
  IF v_slo2 IS NOT NULL THEN -- 0064
    FOR v_s IN v_slo2 .. v_shi2 LOOP -- 0064
      v_closed := v_closed || closures_of_slot(v_s, v_ids); -- 0064
      IF v_unique_ids IS NOT NULL THEN -- 0064
        v_keyed_rows := v_keyed_rows || ready_rows_of_slot(v_s, v_unique_ids); -- 0064
      END IF; -- 0064
    END LOOP; -- 0064
  END IF; -- 0064

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
    FROM unnest(v_keyed_rows) r -- 0064: read above, slot by slot
  ),
  batch_closures AS MATERIALIZED (
    SELECT z.job_id, z.run_lease FROM unnest(v_closed) z -- 0064: read above, slot by slot
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.heartbeat(p_items jsonb)
 RETURNS TABLE(job_id bigint, run_lease bigint)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET jit TO 'off'
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.key_digest(p_key text)
 RETURNS bytea
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT pg_catalog.sha256(pg_catalog.convert_to('awa.concurrency-key.v1' || pg_catalog.chr(31) || 'awa' || pg_catalog.chr(31) || p_key, 'UTF8')) $function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.key_grants_in_slot(p_slot integer, p_policy text, p_digest bytea, p_limit integer, OUT n integer, OUT m bigint)
 RETURNS record
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$
BEGIN
  CASE p_slot
    WHEN 0 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_0 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_0 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_0 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_0 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_0 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 1 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_1 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_1 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_1 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_1 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_1 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 2 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_2 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_2 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_2 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_2 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_2 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 3 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_3 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_3 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_3 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_3 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_3 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 4 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_4 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_4 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_4 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_4 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_4 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 5 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_5 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_5 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_5 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_5 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_5 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 6 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_6 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_6 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_6 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_6 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_6 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 7 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_7 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_7 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_7 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_7 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_7 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 8 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_8 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_8 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_8 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_8 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_8 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 9 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_9 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_9 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_9 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_9 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_9 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 10 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_10 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_10 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_10 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_10 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_10 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 11 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_11 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_11 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_11 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_11 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_11 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 12 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_12 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_12 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_12 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_12 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_12 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 13 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_13 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_13 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_13 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_13 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_13 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 14 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_14 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_14 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_14 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_14 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_14 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
    WHEN 15 THEN
      SELECT count(*)::int, min(o.s) INTO n, m FROM (
        (SELECT c.key_seq AS s FROM claims_15 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest
           AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims_15 h
                                      WHERE h.key_policy = p_policy AND h.key_digest = p_digest AND h.key_seq IS NOT NULL
                                      ORDER BY h.key_seq DESC LIMIT 1), 0)
           AND NOT EXISTS (SELECT 1 FROM closures_15 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        UNION ALL
        (SELECT NULL::bigint FROM claims_15 c
         WHERE c.key_policy = p_policy AND c.key_digest = p_digest AND c.key_seq IS NULL
           AND NOT EXISTS (SELECT 1 FROM closures_15 x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease))
        LIMIT p_limit) o;
  END CASE;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.key_open_grants(p_policy text, p_digest bytea)
 RETURNS integer
 LANGUAGE sql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
  SELECT count(*)::int FROM claims c
  WHERE c.key_policy = p_policy AND c.key_digest = p_digest
    AND NOT EXISTS (SELECT 1 FROM closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease AND x.slot = c.slot)
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.key_policy_activate(p_id text, p_epoch bigint, p_target integer)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
DECLARE
  v_row key_policies;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'key_policy_activate needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  SELECT * INTO v_row FROM key_policies kp WHERE kp.id = p_id FOR UPDATE;
  IF NOT FOUND THEN
    RETURN 'missing';
  END IF;
  IF v_row.epoch <> p_epoch OR v_row.state <> 'draining' OR v_row.target <> p_target THEN
    RETURN 'stale';
  END IF;
  IF key_policy_open_max(p_id) > p_target THEN
    RETURN 'over';
  END IF;
  UPDATE key_policies kp SET state = 'active', max_in_flight = p_target, target = NULL, updated_at = now()
  WHERE kp.id = p_id;
  RETURN 'activated';
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.key_policy_lower(p_id text, p_target integer)
 RETURNS bigint
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
DECLARE
  v_epoch bigint;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'key_policy_lower needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  PERFORM pg_advisory_xact_lock(lock_ns('key_policy'), hashtext(p_id));
  UPDATE key_policies kp SET state = 'draining', target = p_target, epoch = kp.epoch + 1, updated_at = now()
  WHERE kp.id = p_id
  RETURNING kp.epoch INTO v_epoch;
  RETURN v_epoch;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.key_policy_open_max(p_id text)
 RETURNS integer
 LANGUAGE sql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
  SELECT coalesce(max(n), 0)::int FROM (
    SELECT count(*) AS n FROM claims c
    WHERE c.key_policy = p_id
      AND NOT EXISTS (SELECT 1 FROM closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease AND x.slot = c.slot)
    GROUP BY c.key_digest
  ) k
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_cursor(p_queue text, p_priority integer, p_shard integer)
 RETURNS bigint
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$
BEGIN
  -- ORDER BY … LIMIT 1: the plan max() would use, without planning the aggregate too
  RETURN coalesce((SELECT m.next_lane_seq FROM claim_marks m
                   WHERE m.queue = p_queue AND m.priority = p_priority AND m.shard = p_shard
                   ORDER BY m.next_lane_seq DESC LIMIT 1), 0);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_0(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_0 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_0 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_1(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_1 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_1 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_10(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_10 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_10 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_11(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_11 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_11 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_12(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_12 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_12 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_13(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_13 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_13 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_14(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_14 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_14 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_15(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_15 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_15 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_2(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_2 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_2 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_3(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_3 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_3 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_4(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_4 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_4 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_5(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_5 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_5 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_6(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_6 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_6 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_7(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_7 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_7 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_8(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_8 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_8 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_9(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::awa.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM awa.ready_9 r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_9 t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_heads_in_slot(p_slot integer, p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
 RETURNS awa.ready[]
 LANGUAGE sql
 STABLE
AS $function$ SELECT CASE p_slot WHEN 0 THEN awa.lane_heads_0(p_queue, p_priorities, p_shards, p_from) WHEN 1 THEN awa.lane_heads_1(p_queue, p_priorities, p_shards, p_from) WHEN 2 THEN awa.lane_heads_2(p_queue, p_priorities, p_shards, p_from) WHEN 3 THEN awa.lane_heads_3(p_queue, p_priorities, p_shards, p_from) WHEN 4 THEN awa.lane_heads_4(p_queue, p_priorities, p_shards, p_from) WHEN 5 THEN awa.lane_heads_5(p_queue, p_priorities, p_shards, p_from) WHEN 6 THEN awa.lane_heads_6(p_queue, p_priorities, p_shards, p_from) WHEN 7 THEN awa.lane_heads_7(p_queue, p_priorities, p_shards, p_from) WHEN 8 THEN awa.lane_heads_8(p_queue, p_priorities, p_shards, p_from) WHEN 9 THEN awa.lane_heads_9(p_queue, p_priorities, p_shards, p_from) WHEN 10 THEN awa.lane_heads_10(p_queue, p_priorities, p_shards, p_from) WHEN 11 THEN awa.lane_heads_11(p_queue, p_priorities, p_shards, p_from) WHEN 12 THEN awa.lane_heads_12(p_queue, p_priorities, p_shards, p_from) WHEN 13 THEN awa.lane_heads_13(p_queue, p_priorities, p_shards, p_from) WHEN 14 THEN awa.lane_heads_14(p_queue, p_priorities, p_shards, p_from) WHEN 15 THEN awa.lane_heads_15(p_queue, p_priorities, p_shards, p_from) END $function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_key(p_queue text, p_priority integer, p_shard integer)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT hashtext(p_queue || chr(31) || p_priority || chr(31) || p_shard) $function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_0(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_0 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_0 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_0 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_1(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_1 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_1 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_1 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_10(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_10 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_10 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_10 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_11(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_11 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_11 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_11 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_12(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_12 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_12 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_12 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_13(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_13 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_13 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_13 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_14(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_14 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_14 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_14 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_15(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_15 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_15 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_15 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_2(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_2 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_2 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_2 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_3(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_3 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_3 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_3 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_4(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_4 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_4 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_4 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_5(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_5 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_5 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_5 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_6(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_6 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_6 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_6 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_7(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_7 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_7 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_7 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_8(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_8 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_8 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_8 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_9(p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(r.*)::awa.ready
    FROM awa.ready_9 r
    WHERE r.queue = p_queue AND r.priority = p_priority AND r.shard = p_shard AND r.lane_seq >= p_from
      AND (NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_9 t0
                       WHERE t0.queue = p_queue AND t0.priority = p_priority AND t0.shard = p_shard
                         AND t0.lane_seq >= p_from)
           OR NOT EXISTS (SELECT 1 FROM awa.ready_tombstones_9 t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq))
      AND r.lane_seq < coalesce((SELECT p.lane_seq FROM awa.parked p
                                 WHERE p.queue = p_queue AND p.priority = p_priority AND p.shard = p_shard
                                 ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
    ORDER BY r.lane_seq LIMIT p_limit);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lane_picks_in_slot(p_slot integer, p_queue text, p_priority smallint, p_shard smallint, p_from bigint, p_limit integer)
 RETURNS awa.ready[]
 LANGUAGE sql
 STABLE
AS $function$ SELECT CASE p_slot WHEN 0 THEN awa.lane_picks_0(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 1 THEN awa.lane_picks_1(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 2 THEN awa.lane_picks_2(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 3 THEN awa.lane_picks_3(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 4 THEN awa.lane_picks_4(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 5 THEN awa.lane_picks_5(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 6 THEN awa.lane_picks_6(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 7 THEN awa.lane_picks_7(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 8 THEN awa.lane_picks_8(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 9 THEN awa.lane_picks_9(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 10 THEN awa.lane_picks_10(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 11 THEN awa.lane_picks_11(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 12 THEN awa.lane_picks_12(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 13 THEN awa.lane_picks_13(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 14 THEN awa.lane_picks_14(p_queue, p_priority, p_shard, p_from, p_limit) WHEN 15 THEN awa.lane_picks_15(p_queue, p_priority, p_shard, p_from, p_limit) END $function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ledger_totals(p_ring text, OUT prunes bigint, OUT rollup jsonb)
 RETURNS record
 LANGUAGE sql
 STABLE
AS $function$
  SELECT (SELECT t.prunes FROM awa.ring_ledger_totals t WHERE t.ring = p_ring)
           + (SELECT count(*) FROM awa.ring_prunes p WHERE p.ring = p_ring),
         (SELECT coalesce(jsonb_object_agg(s.k, s.n), '{}'::jsonb)
          FROM (SELECT e.key AS k, sum(e.value::numeric) AS n
                FROM (SELECT t.rollup FROM awa.ring_ledger_totals t WHERE t.ring = p_ring
                      UNION ALL
                      SELECT p.rollup FROM awa.ring_prunes p WHERE p.ring = p_ring) x,
                     jsonb_each_text(x.rollup) e
                GROUP BY 1) s)
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lock_attempt(p_job_id bigint, p_run_lease bigint)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'lock_attempt needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  PERFORM 1 FROM claims c WHERE c.job_id = p_job_id AND c.run_lease = p_run_lease FOR NO KEY UPDATE OF c;
  IF NOT FOUND THEN
    RETURN 'unknown';
  END IF;
  -- a new statement after the lock: it sees the closure of whoever held the row before us
  IF EXISTS (SELECT 1 FROM closures z WHERE z.job_id = p_job_id AND z.run_lease = p_run_lease) THEN
    RETURN 'closed';
  END IF;
  RETURN 'open';
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lock_current_slot(p_table text, OUT o_generation bigint, OUT o_slot integer)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'lock_current_slot needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  LOOP
    SELECT r.generation, r.slot INTO o_generation, o_slot FROM ring_rotations r
    WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
    EXECUTE format('LOCK TABLE %I.%I IN ROW EXCLUSIVE MODE', 'awa', p_table || '_' || o_slot);
    EXIT WHEN NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = o_generation);
  END LOOP;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.lock_ns(p_name text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT hashtext('awa:' || p_name) $function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.park_callback(p_job_id bigint, p_run_lease bigint, p_callback_id text, OUT status text, OUT result jsonb)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
DECLARE
  v_state attempt_state%ROWTYPE;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'park_callback needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  status := 'stale';
  IF lock_attempt(p_job_id, p_run_lease) <> 'open' THEN
    RETURN;
  END IF;
  SELECT * INTO v_state FROM attempt_state a WHERE a.job_id = p_job_id AND a.run_lease = p_run_lease;
  IF NOT FOUND OR v_state.callback_id IS DISTINCT FROM p_callback_id THEN
    RETURN;
  END IF;
  -- parked either way; a resume that came first leaves it 'resumed', for claim_resumed to hand
  -- back to a worker (with the payload) as it would after a park
  UPDATE attempt_state a SET callback_waiting = true, parked_at = coalesce(a.parked_at, now())
  WHERE a.job_id = p_job_id AND a.run_lease = p_run_lease;
  status := CASE WHEN v_state.callback_state = 'resumed' THEN 'resumed' ELSE 'parked' END;
  result := v_state.callback_result;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.promote(p_limit integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_lane record;
  v_q text[] := '{}';
  v_p int[] := '{}';
  v_s int[] := '{}'; -- 0042: the lanes' shards
  v_ids bigint[];
  v_pos bigint[];
  v_ring record;
  v_row record;
  v_def record;
  v_holder bigint;
  v_moved int;
  v_round int;
  v_found boolean;
  v_busy_q text[] := '{}';
  v_busy_p int[] := '{}';
  v_busy_s int[] := '{}'; -- 0042
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'promote needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  -- Lanes of the first p_limit due rows, enqueue locks tried. When every one of them is busy (a
  -- producer holds the lane in an open transaction), look further, past those lanes, instead of
  -- promoting nothing while other lanes' rows are due (review m5). Tried locks never wait, so the
  -- order across rounds does not matter.
  FOR v_round IN 1 .. 8 LOOP
    v_found := false;
    FOR v_lane IN
      SELECT DISTINCT d.queue COLLATE "C" AS queue, d.priority, d.shard -- 0042
      FROM (SELECT d.queue, d.priority, d.shard FROM deferred d -- 0042
            WHERE d.state IN ('scheduled', 'retryable') AND d.run_at <= now()
              AND (d.queue, d.priority, d.shard) NOT IN (SELECT * FROM unnest(v_busy_q, v_busy_p, v_busy_s)) -- 0042
            ORDER BY d.run_at, d.job_id LIMIT p_limit) d
      ORDER BY 1, 2, 3 -- 0042
    LOOP
      v_found := true;
      -- 0042: the row's own lane (its shard was chosen at insert and is kept through retries)
      IF pg_try_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_lane.queue, v_lane.priority, v_lane.shard)) THEN -- 0042
        v_q := v_q || v_lane.queue;
        v_p := v_p || v_lane.priority::int;
        v_s := v_s || v_lane.shard::int; -- 0042
        INSERT INTO lanes (queue, priority, shard)
        SELECT v_lane.queue, v_lane.priority, v_lane.shard -- 0042
        WHERE NOT EXISTS (SELECT 1 FROM lanes l WHERE l.queue = v_lane.queue AND l.priority = v_lane.priority AND l.shard = v_lane.shard) -- 0042
        ON CONFLICT DO NOTHING;
      ELSE
        v_busy_q := v_busy_q || v_lane.queue;
        v_busy_p := v_busy_p || v_lane.priority::int;
        v_busy_s := v_busy_s || v_lane.shard::int; -- 0042
      END IF;
    END LOOP;
    EXIT WHEN NOT v_found OR cardinality(v_q) > 0;
  END LOOP;
  IF cardinality(v_q) = 0 THEN
    RETURN 0;
  END IF;

  WITH due AS (
    SELECT d.job_id FROM deferred d
    WHERE d.state IN ('scheduled', 'retryable') AND d.run_at <= now()
      AND (d.queue, d.priority, d.shard) IN (SELECT * FROM unnest(v_q, v_p, v_s)) -- 0042
    ORDER BY d.run_at, d.job_id LIMIT p_limit
    FOR UPDATE SKIP LOCKED
  )
  SELECT array_agg(due.job_id) INTO v_ids FROM due;
  IF v_ids IS NULL THEN
    RETURN 0;
  END IF;
  v_moved := cardinality(v_ids);
  -- Unique masks (capabilities.md §4), only for keyed rows whose mask treats their deferred state
  -- and 'available' differently (never the default mask, so the common path runs one probe):
  -- leaving the mask releases the key; entering it takes the key, and if a newer job holds it this
  -- one gives way, cancelled with 'superseded by duplicate <id>' (a wide terminal row).
  FOR v_row IN
    SELECT d.job_id, d.unique_key, d.unique_states FROM deferred d
    WHERE d.job_id = ANY (v_ids) AND d.unique_key IS NOT NULL
      AND ((d.unique_states & 2) <> 0) <> ((d.unique_states & state_bit(d.state)) <> 0)
    ORDER BY d.job_id
  LOOP
    IF (v_row.unique_states & 2) = 0 THEN
      DELETE FROM unique_claims u WHERE u.unique_key = v_row.unique_key AND u.job_id = v_row.job_id;
      CONTINUE;
    END IF;
    INSERT INTO unique_claims (unique_key, job_id) VALUES (v_row.unique_key, v_row.job_id) ON CONFLICT DO NOTHING;
    SELECT u.job_id INTO v_holder FROM unique_claims u WHERE u.unique_key = v_row.unique_key;
    IF v_holder <> v_row.job_id THEN
      DELETE FROM deferred d WHERE d.job_id = v_row.job_id RETURNING d.* INTO v_def;
      SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('terminal');
      INSERT INTO terminal (slot, generation, job_id, run_lease, state, attempt, finalized_at, errors, progress, wide,
                            kind, queue, priority, args, metadata, tags, max_attempts, run_at, created_at, unique_key, unique_states)
      VALUES (v_ring.slot, v_ring.generation, v_def.job_id, v_def.run_lease, 'cancelled', v_def.attempt, now(),
              append_error(v_def.errors, jsonb_build_object('error', 'cancelled: superseded by duplicate ' || v_holder,
                                                            'attempt', v_def.attempt, 'at', now())),
              v_def.progress, true, v_def.kind, v_def.queue, v_def.priority, v_def.args, v_def.metadata, v_def.tags,
              v_def.max_attempts, v_def.run_at, v_def.created_at, v_def.unique_key, v_def.unique_states);
      v_ids := array_remove(v_ids, v_row.job_id);
    END IF;
  END LOOP;
  IF cardinality(v_ids) = 0 THEN
    RETURN v_moved;
  END IF;
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
  SELECT array_agg(v ORDER BY v) INTO v_pos FROM (SELECT nextval('lane_seq') AS v FROM generate_series(1, cardinality(v_ids))) s;

  WITH moved AS (
    DELETE FROM deferred d WHERE d.job_id = ANY (v_ids) RETURNING d.*
  ),
  ranked AS (
    SELECT m.*, row_number() OVER (ORDER BY m.run_at, m.job_id) AS rank FROM moved m
  ),
  ins AS (
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_ring.slot, v_ring.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, v_pos[r.rank], r.args, r.metadata,
           r.tags, r.errors, r.progress, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.unique_key, r.unique_states
    FROM ranked r
    RETURNING queue
  )
  SELECT array_agg(DISTINCT ins.queue) INTO v_q FROM ins;
  PERFORM pg_notify('awa_wake_awa', q) FROM unnest(v_q) AS q;
  RETURN v_moved;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.prune_history(p_lock_timeout_ms integer, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
 RETURNS TABLE(outcome text, generation bigint, carried integer)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots('history');
  v_cur record;
  v_old bigint;
  v_slot int;
  v_longest interval;
  v_rollup jsonb;
  v_keys jsonb;
  v_saved_timeout text := current_setting('lock_timeout');
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'prune_history needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext('history')) THEN
    RETURN QUERY SELECT 'Blocked:busy', NULL::bigint, 0;
    RETURN;
  END IF;
  SELECT * INTO v_cur FROM ring_current('history');
  SELECT min(g.g) INTO v_old
  FROM generate_series(greatest(0, v_cur.generation - v_n + 1), v_cur.generation - 1) AS g(g)
  WHERE NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'history' AND p.generation = g.g);
  IF v_old IS NULL THEN
    RETURN QUERY SELECT 'Noop', NULL::bigint, 0;
    RETURN;
  END IF;
  v_slot := (v_old % v_n)::int;
  SELECT greatest(max(x), p_completed_ms * interval '1 millisecond', p_failed_ms * interval '1 millisecond',
                  p_cancelled_ms * interval '1 millisecond') INTO v_longest
  FROM (SELECT unnest(ARRAY[m.completed_retention, m.failed_retention, m.cancelled_retention]) AS x FROM queue_meta m) s;
  IF EXISTS (SELECT 1 FROM history h WHERE h.slot = v_slot AND h.finalized_at > now() - v_longest) THEN
    RETURN QUERY SELECT 'Blocked:retention', v_old, 0;
    RETURN;
  END IF;
  SELECT (SELECT jsonb_object_agg(k, n) FROM (SELECT h.queue || ':' || h.state AS k, count(*) AS n FROM history h WHERE h.slot = v_slot GROUP BY 1) c),
         (SELECT jsonb_agg(jsonb_build_object('job_id', h.job_id, 'run_lease', h.run_lease, 'finalized_at', h.finalized_at,
                                              'unique_key', encode(h.unique_key, 'hex')))
          FROM history h WHERE h.slot = v_slot AND h.unique_key IS NOT NULL)
    INTO v_rollup, v_keys;
  BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    EXECUTE format('LOCK TABLE %I.history_%s IN ACCESS EXCLUSIVE MODE', 'awa', v_slot);
  EXCEPTION WHEN lock_not_available THEN
    RETURN QUERY SELECT 'Blocked:lock', v_old, 0;
    RETURN;
  END;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);
  EXECUTE format('TRUNCATE %I.history_%s', 'awa', v_slot);
  IF v_keys IS NOT NULL THEN
    INSERT INTO pending_key_releases (ring, generation, keys) VALUES ('history', v_old, v_keys);
  END IF;
  INSERT INTO ring_prunes (ring, generation, slot, rollup) VALUES ('history', v_old, v_slot, coalesce(v_rollup, '{}'));
  RETURN QUERY SELECT 'Pruned', v_old, 0;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.prune_queue(p_lock_timeout_ms integer, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
 RETURNS TABLE(outcome text, generation bigint, carried integer)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
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
                       'awa', v_slot);
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.prune_queue(p_lock_timeout_ms integer, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint, p_carry_after_ms bigint)
 RETURNS TABLE(outcome text, generation bigint, carried integer)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots('queue');
  v_cur record;
  v_old bigint;
  v_slot int;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'prune_queue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF p_carry_after_ms > 0 THEN
    IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext('queue')) THEN
      RETURN QUERY SELECT 'Blocked:busy', NULL::bigint, 0;
      RETURN;
    END IF;
    -- the generation 0013 would take: the oldest sealed one not yet pruned
    SELECT * INTO v_cur FROM ring_current('queue');
    SELECT min(g.g) INTO v_old
    FROM generate_series(greatest(0, v_cur.generation - v_n + 1), v_cur.generation - 1) AS g(g)
    WHERE NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = g.g);
    IF v_old IS NOT NULL THEN
      v_slot := (v_old % v_n)::int;
      IF EXISTS (
        SELECT 1 FROM claims c
        WHERE c.slot = v_slot AND c.claimed_at > now() - p_carry_after_ms * interval '1 millisecond'
          AND NOT EXISTS (SELECT 1 FROM closures z
                          WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
      ) THEN
        RETURN QUERY SELECT 'Blocked:young_attempts', v_old, 0;
        RETURN;
      END IF;
    END IF;
  END IF;
  RETURN QUERY SELECT * FROM prune_queue(p_lock_timeout_ms, p_completed_ms, p_failed_ms, p_cancelled_ms);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.prune_queue(p_lock_timeout_ms integer, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint, p_carry_after_ms bigint, p_force_timeout_ms integer, p_carry_rows integer, p_end_idle_ms bigint)
 RETURNS TABLE(outcome text, generation bigint, carried integer, moved integer, parked integer)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
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
  v_saved_mergejoin text := current_setting('enable_mergejoin'); -- 0058
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
                       'awa', v_slot); -- 0053: the schema's name (0039-0048 spelled the default one)
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
    PERFORM set_config('enable_mergejoin', 'off', true); -- 0058: the ready rows joined by hash, not both sides sorted
    SELECT * INTO v_hist FROM ring_current('history'); -- 0048
    -- 0060: with no queue's own retention (the usual case), a row's fate is its state and
    -- finalized_at alone: the kept rows go straight from their join to history (no wide row is
    -- kept aside for the counts), and only the dropped rows are joined again, narrow, for the
    -- rollup and their keys. Both in one statement (one snapshot: the same rows and the same now()
    -- decide the copy, the counts and the keys). A queue's own retention needs the row's queue
    -- before its fate: judged as 0048 did, below.
    IF NOT EXISTS (SELECT 1 FROM queue_meta m -- 0060
                   WHERE m.completed_retention IS NOT NULL OR m.failed_retention IS NOT NULL OR m.cancelled_retention IS NOT NULL) THEN -- 0060
    WITH copied AS ( -- 0060: the kept rows, filtered before their join
      INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                           metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
      SELECT v_hist.slot, v_hist.generation, t.job_id, t.run_lease, t.state, t.attempt, coalesce(t.max_attempts, r.max_attempts), -- 0060
             coalesce(t.kind, r.kind), coalesce(t.queue, r.queue), coalesce(t.priority, r.priority), -- 0060
             coalesce(t.args, r.args), coalesce(t.metadata, r.metadata), coalesce(t.tags, r.tags), -- 0060
             coalesce(t.errors, r.errors), t.progress, coalesce(t.run_at, r.run_at), coalesce(t.created_at, r.created_at), -- 0060
             t.finalized_at, coalesce(t.unique_key, r.unique_key), coalesce(t.unique_states, r.unique_states, 0) -- 0060
      FROM terminal_records t -- 0060
      LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq -- 0060
      WHERE t.slot = v_slot -- 0060
        AND t.finalized_at > now() - CASE t.state WHEN 'completed' THEN p_completed_ms * interval '1 millisecond' -- 0060
                                                  WHEN 'failed' THEN p_failed_ms * interval '1 millisecond' -- 0060
                                                  ELSE p_cancelled_ms * interval '1 millisecond' END -- 0060
      RETURNING queue, state -- 0060
    ),
    dropped AS MATERIALIZED ( -- 0060: the others, narrow: their queue for the rollup, their keys to release
      SELECT t.job_id, t.run_lease, t.state, t.finalized_at, coalesce(t.queue, r.queue) AS queue, -- 0060
             coalesce(t.unique_key, r.unique_key) AS unique_key -- 0060
      FROM terminal_records t -- 0060
      LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq -- 0060
      WHERE t.slot = v_slot -- 0060
        AND NOT t.finalized_at > now() - CASE t.state WHEN 'completed' THEN p_completed_ms * interval '1 millisecond' -- 0060
                                                      WHEN 'failed' THEN p_failed_ms * interval '1 millisecond' -- 0060
                                                      ELSE p_cancelled_ms * interval '1 millisecond' END -- 0060
    ),
    counted AS MATERIALIZED ( -- 0060: rows per queue and state, kept and dropped together
      SELECT g.k, sum(g.n)::bigint AS n -- 0060
      FROM (SELECT c.queue || ':' || c.state AS k, count(*) AS n FROM copied c GROUP BY 1 -- 0060
            UNION ALL -- 0060
            SELECT d.queue || ':' || d.state, count(*) FROM dropped d GROUP BY 1) g -- 0060
      GROUP BY g.k -- 0060
    )
    SELECT (SELECT count(*) FROM copied), -- 0060
           (SELECT jsonb_object_agg(c.k, c.n) FROM counted c), -- 0060
           (SELECT jsonb_agg(jsonb_build_object('job_id', d.job_id, 'run_lease', d.run_lease, 'finalized_at', d.finalized_at, -- 0060
                                                'unique_key', encode(d.unique_key, 'hex'))) -- 0060
            FROM dropped d WHERE d.unique_key IS NOT NULL), -- 0060
           (SELECT coalesce(sum(c.n), 0)::bigint FROM counted c) -- 0060
      INTO v_copied_rows, v_rollup, v_keys, v_count; -- 0060
    ELSE -- 0060
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
    END IF; -- 0060
    PERFORM set_config('enable_nestloop', v_saved_nestloop, true); -- 0048
    PERFORM set_config('enable_mergejoin', v_saved_mergejoin, true); -- 0058
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
    FROM ready_lanes_in_slot(v_slot) l -- 0058
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
      SELECT l.queue, l.priority, l.shard FROM ready_lanes_in_slot(v_slot) l ORDER BY 1, 2, 3 -- 0058
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
        FROM ready_lanes_in_slot(v_slot) l -- 0058
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
      EXECUTE format('LOCK TABLE ONLY %1$I.claim_marks, ONLY %1$I.claim_spans, ONLY %1$I.claims IN ACCESS EXCLUSIVE MODE', 'awa'); -- 0053
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
    FROM ready_lanes_in_slot(v_slot) l -- 0058
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.queue_depth(p_queue text, p_cap integer)
 RETURNS bigint
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.queue_history(p_window_ms bigint, p_bucket_ms bigint)
 RETURNS TABLE(queue text, bucket_start timestamp with time zone, enqueued bigint, completed bigint, failed bigint, cancelled bigint)
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.queue_rates(p_window_ms bigint)
 RETURNS TABLE(queue text, enqueued bigint, completed bigint, failed bigint, cancelled bigint, span_start timestamp with time zone, span_end timestamp with time zone, enqueue_span_start timestamp with time zone, enqueue_span_end timestamp with time zone)
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.queue_slot_ranges(OUT lo1 integer, OUT hi1 integer, OUT lo2 integer, OUT hi2 integer)
 RETURNS record
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$
DECLARE
  v_n int := ring_slots('queue');
  v_cur bigint;
  v_old bigint;
BEGIN
  SELECT r.generation INTO v_cur FROM ring_rotations r WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
  SELECT min(g.g) INTO v_old
  FROM generate_series(greatest(0, v_cur - v_n + 1), v_cur) AS g(g)
  WHERE NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = g.g);
  IF v_cur IS NULL OR v_old IS NULL OR v_cur - v_old + 1 >= v_n THEN
    -- the whole ring (or a ledger we cannot read as expected: never narrower than the truth)
    lo1 := 0; hi1 := v_n - 1; lo2 := 1; hi2 := 0;
  ELSIF v_old % v_n <= v_cur % v_n THEN
    lo1 := v_old % v_n; hi1 := v_cur % v_n; lo2 := 1; hi2 := 0;
  ELSE
    lo1 := v_old % v_n; hi1 := v_n - 1; lo2 := 0; hi2 := v_cur % v_n;
  END IF;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.queue_stats(p_window_ms bigint)
 RETURNS TABLE(queue text, paused boolean, available bigint, running bigint, scheduled bigint, retryable bigint, dead_lettered bigint, oldest_available_at timestamp with time zone, completed_total bigint, failed_total bigint, cancelled_total bigint, recent_completed bigint, recent_failed bigint, recent_cancelled bigint, window_start timestamp with time zone, as_of timestamp with time zone)
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET plan_cache_mode TO 'force_generic_plan'
 SET jit TO 'off'
AS $function$
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.rate_tokens(p_caller text, p_queue text, p_max integer, p_rate double precision, p_burst integer, OUT tokens integer, OUT base double precision, OUT period double precision, OUT mark tid, OUT next_token_at timestamp with time zone)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
DECLARE
  v_t double precision := extract(epoch FROM now());
  v_burst int;
  v_tat double precision;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'rate_tokens needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF p_rate IS NULL OR NOT (p_rate > 0 AND p_rate <= 100000) OR p_burst IS NULL OR p_burst < 0 THEN
    RAISE EXCEPTION '% needs 0 < rate <= 100000 and burst >= 0 (got %, %)', p_caller, p_rate, p_burst
      USING ERRCODE = '22023';
  END IF;
  IF p_max <= 0 THEN
    tokens := 0;
    RETURN;
  END IF;
  period := 1 / p_rate;
  v_burst := CASE WHEN p_burst = 0 THEN greatest(1, ceil(p_rate)::int) ELSE p_burst END;
  PERFORM pg_advisory_xact_lock(lock_ns('rate'), hashtext(p_queue));
  -- after the lock: the mark the previous holder committed
  SELECT m.tat, m.ctid INTO v_tat, mark FROM rate_marks m WHERE m.queue = p_queue ORDER BY m.tat DESC LIMIT 1;
  base := greatest(coalesce(v_tat, v_t), v_t);
  tokens := least(v_burst, floor((v_t + v_burst * period - base) / period + 1e-9)::int);
  -- no token: the first is due when tat falls within the burst again (a claimer that waited for
  -- the lock computes with an earlier t, so tokens may come out below 0)
  next_token_at := to_timestamp(CASE WHEN tokens <= 0 THEN v_tat - v_burst * period + period
                                     ELSE base + (tokens - v_burst + 1) * period END);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_lanes_in_slot(p_slot integer)
 RETURNS TABLE(queue text, priority smallint, shard smallint)
 LANGUAGE sql
 STABLE
AS $function$
  WITH RECURSIVE walk AS (
    (SELECT r.queue, r.priority, r.shard, 1 AS n FROM awa.ready r
     WHERE r.slot = p_slot ORDER BY r.queue, r.priority, r.shard LIMIT 1)
    UNION ALL
    SELECT x.queue, x.priority, x.shard, w.n + 1 FROM walk w
    CROSS JOIN LATERAL (SELECT r.queue, r.priority, r.shard FROM awa.ready r
                        WHERE r.slot = p_slot AND (r.queue, r.priority, r.shard) > (w.queue, w.priority, w.shard)
                        ORDER BY r.queue, r.priority, r.shard LIMIT 1) x
    WHERE w.n <= 16
  )
  SELECT w.queue, w.priority, w.shard FROM walk w
  WHERE (SELECT max(v.n) FROM walk v) <= 16
  UNION ALL
  SELECT DISTINCT r.queue, r.priority, r.shard FROM awa.ready r
  WHERE r.slot = p_slot AND (SELECT max(v.n) FROM walk v) > 16
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_0(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_0 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_1(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_1 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_10(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_10 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_11(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_11 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_12(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_12 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_13(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_13 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_14(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_14 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_15(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_15 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_2(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_2 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_3(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_3 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_4(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_4 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_5(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_5 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_6(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_6 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_7(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_7 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_8(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_8 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_9(p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
  RETURN ARRAY(SELECT ROW(r.*)::awa.ready FROM awa.ready_9 r WHERE r.job_id = ANY (p_job_ids));
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ready_rows_of_slot(p_slot integer, p_job_ids bigint[])
 RETURNS awa.ready[]
 LANGUAGE sql
 STABLE
AS $function$ SELECT CASE p_slot WHEN 0 THEN awa.ready_rows_of_0(p_job_ids) WHEN 1 THEN awa.ready_rows_of_1(p_job_ids) WHEN 2 THEN awa.ready_rows_of_2(p_job_ids) WHEN 3 THEN awa.ready_rows_of_3(p_job_ids) WHEN 4 THEN awa.ready_rows_of_4(p_job_ids) WHEN 5 THEN awa.ready_rows_of_5(p_job_ids) WHEN 6 THEN awa.ready_rows_of_6(p_job_ids) WHEN 7 THEN awa.ready_rows_of_7(p_job_ids) WHEN 8 THEN awa.ready_rows_of_8(p_job_ids) WHEN 9 THEN awa.ready_rows_of_9(p_job_ids) WHEN 10 THEN awa.ready_rows_of_10(p_job_ids) WHEN 11 THEN awa.ready_rows_of_11(p_job_ids) WHEN 12 THEN awa.ready_rows_of_12(p_job_ids) WHEN 13 THEN awa.ready_rows_of_13(p_job_ids) WHEN 14 THEN awa.ready_rows_of_14(p_job_ids) WHEN 15 THEN awa.ready_rows_of_15(p_job_ids) END $function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.record_prune_state(p_ring text, p_outcome text, p_reason text)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.register_callback(p_job_id bigint, p_run_lease bigint, p_timeout_ms bigint, p_config jsonb)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
DECLARE
  v_id text := p_job_id || '.' || p_run_lease || '.' || replace(gen_random_uuid()::text, '-', '');
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'register_callback needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF lock_attempt(p_job_id, p_run_lease) <> 'open' THEN
    RETURN NULL;
  END IF;
  INSERT INTO attempt_state AS a (job_id, run_lease, heartbeat_at, callback_id, callback_timeout_at, callback_config,
                                  callback_state, callback_result, callback_waiting)
  VALUES (p_job_id, p_run_lease, now(), v_id, now() + p_timeout_ms * interval '1 millisecond', p_config,
          'pending', NULL, false)
  ON CONFLICT (job_id, run_lease) DO UPDATE
    SET heartbeat_at = excluded.heartbeat_at, callback_id = excluded.callback_id,
        callback_timeout_at = excluded.callback_timeout_at, callback_config = excluded.callback_config,
        callback_state = 'pending', callback_result = NULL, callback_waiting = false;
  RETURN v_id;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.release_keys_of(p_rows jsonb)
 RETURNS void
 LANGUAGE sql
AS $function$
  DELETE FROM awa.unique_claims u
  USING jsonb_to_recordset(p_rows) AS x(job_id bigint, run_lease bigint, finalized_at timestamptz, unique_key text)
  WHERE u.unique_key = decode(x.unique_key, 'hex') AND u.job_id = x.job_id
    AND NOT EXISTS (
      SELECT 1 FROM awa.job_representations j
      WHERE j.job_id = x.job_id
        AND (j.rank < 4 OR j.run_lease > x.run_lease OR (j.run_lease = x.run_lease AND j.finalized_at > x.finalized_at)))
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.release_pending_keys(p_batch integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
DECLARE
  v_row record;
  v_n int := 0;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'release_pending_keys needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  FOR v_row IN
    SELECT k.id, k.keys FROM pending_key_releases k ORDER BY k.id LIMIT p_batch FOR UPDATE SKIP LOCKED
  LOOP
    PERFORM release_keys_of(v_row.keys);
    DELETE FROM pending_key_releases k WHERE k.id = v_row.id;
    v_n := v_n + jsonb_array_length(v_row.keys);
  END LOOP;
  RETURN v_n;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.release_resumed(p_job_id bigint, p_run_lease bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'release_resumed needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF lock_attempt(p_job_id, p_run_lease) <> 'open' THEN
    RETURN false;
  END IF;
  -- taken back by claim_resumed: parked once, no longer waiting, no callback registered since
  UPDATE attempt_state a SET callback_waiting = true, callback_state = 'resumed', heartbeat_at = now()
  WHERE a.job_id = p_job_id AND a.run_lease = p_run_lease
    AND a.parked_at IS NOT NULL AND NOT a.callback_waiting AND a.callback_state IS NULL AND a.callback_id IS NULL;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM pg_notify('awa_cancel_awa', 'resumed:' || p_job_id || ':' || p_run_lease || ':' || c.queue)
  FROM claims c WHERE c.job_id = p_job_id AND c.run_lease = p_run_lease;
  RETURN true;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.rescue(p_kind text, p_staleness_ms bigint, p_limit integer)
 RETURNS TABLE(job_id bigint, run_lease bigint, state text)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_cutoff timestamptz := now() - p_staleness_ms * interval '1 millisecond';
  v_items jsonb;
  v_row record;
  v_closed bigint[] := '{}'; -- 0036: the attempts closed here, to notify the keyed ones' queues
  v_reach bigint; -- 0053: the claims the past spans can cover, counted up to v_span_path_max + 1
  v_span_path_max constant int := 1000; -- 0053: up to this many, the claims are found from their spans
  v_saved_hashjoin text := current_setting('enable_hashjoin'); -- 0053
  v_saved_mergejoin text := current_setting('enable_mergejoin'); -- 0053
  v_saved_collapse text := current_setting('join_collapse_limit'); -- 0053
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'rescue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF p_kind = 'stale' THEN
    -- 0053: the claims older than the cutoff, by one of two statements. Few (the usual sweep:
    -- none): from their spans, a span's lane positions in its slot's ready rows, then their claims
    -- by primary key (the claim has the ready row's lease + 1), in the order written and by nested
    -- loops (the settings around it), each probe reading one row. Many (a slot kept long, a
    -- backlog drained slowly): from the claims themselves, as 0050 read them when its claimed_at
    -- index was not worth a scan (a scan of claims and an anti-join the planner chooses), which
    -- costs about a microsecond per claim in the live slots against several per claim for the probes.
    SELECT coalesce(sum(x.n), 0) INTO v_reach -- 0053
    FROM (SELECT s.last_lane_seq - s.first_lane_seq + 1 AS n FROM claim_spans s -- 0053
          WHERE s.claimed_at < v_cutoff LIMIT v_span_path_max + 1) x; -- 0053
    IF v_reach = 0 THEN -- 0053
      RETURN; -- 0053
    ELSIF v_reach <= v_span_path_max THEN -- 0053
      PERFORM set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true), -- 0053
              set_config('join_collapse_limit', '1', true); -- 0053
      -- Spans may overlap (claim's keys-at-claim span lies inside its pick's): one candidate per attempt.
      WITH cand AS ( -- 0053
        SELECT DISTINCT ON (c.claimed_at, c.job_id, c.run_lease) c.job_id, c.run_lease, c.attempt -- 0053
        FROM claim_spans s -- 0053
        JOIN ready r ON r.slot = s.slot AND r.queue = s.queue AND r.priority = s.priority AND r.shard = s.shard -- 0053
                    AND r.lane_seq BETWEEN s.first_lane_seq AND s.last_lane_seq -- 0053
        JOIN claims c ON c.job_id = r.job_id AND c.run_lease = r.run_lease + 1 AND c.slot = r.slot -- 0053
        LEFT JOIN attempt_state a ON a.job_id = c.job_id AND a.run_lease = c.run_lease -- 0053
        WHERE s.claimed_at < v_cutoff -- 0053
          AND c.claimed_at < v_cutoff AND (a.heartbeat_at IS NULL OR a.heartbeat_at < v_cutoff) -- 0053
          AND NOT (coalesce(a.callback_waiting, false) AND a.callback_state = 'pending') -- 0053 (0034)
          AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.slot = c.slot) -- 0053
        ORDER BY c.claimed_at, c.job_id, c.run_lease LIMIT p_limit -- 0053: DISTINCT ON's order
      ) -- 0053
      SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry', -- 0053
               'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'heartbeat stale: worker presumed dead', -- 0053
               'reason', 'stale_heartbeat', 'stale_before', v_cutoff)) -- 0053
        INTO v_items FROM cand; -- 0053
      PERFORM set_config('enable_hashjoin', v_saved_hashjoin, true), set_config('enable_mergejoin', v_saved_mergejoin, true), -- 0053
              set_config('join_collapse_limit', v_saved_collapse, true); -- 0053
    ELSE -- 0053
    WITH cand AS (
      SELECT c.job_id, c.run_lease, c.attempt FROM claims c
      LEFT JOIN attempt_state a ON a.job_id = c.job_id AND a.run_lease = c.run_lease
      WHERE c.claimed_at < v_cutoff AND (a.heartbeat_at IS NULL OR a.heartbeat_at < v_cutoff)
        AND NOT (coalesce(a.callback_waiting, false) AND a.callback_state = 'pending') -- 0034: parked, no worker heartbeats it
        AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
      ORDER BY c.claimed_at LIMIT p_limit
    )
    SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry',
             'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'heartbeat stale: worker presumed dead',
             'reason', 'stale_heartbeat', 'stale_before', v_cutoff))
      INTO v_items FROM cand;
    END IF; -- 0053
  ELSIF p_kind = 'callback' THEN -- 0034
    -- 0040: no pending callback is past its timeout (the usual answer): return before the two
    -- statements below are planned (claims and closures, 16 children each).
    IF NOT EXISTS (SELECT 1 FROM attempt_state a -- 0040
                   WHERE a.callback_state = 'pending' AND a.callback_timeout_at < now()) THEN -- 0040
      RETURN; -- 0040
    END IF; -- 0040
    -- 0034: pending callbacks past their timeout. Lock their claims rows first (as a resolver or a
    -- callback heartbeat does), then re-read the timeout: an extension committed meanwhile wins.
    PERFORM 1 FROM claims c -- 0034
    WHERE (c.job_id, c.run_lease) IN (SELECT a.job_id, a.run_lease FROM attempt_state a -- 0034
                                      WHERE a.callback_state = 'pending' AND a.callback_timeout_at < now() -- 0034
                                      ORDER BY a.callback_timeout_at LIMIT p_limit) -- 0034
    ORDER BY c.job_id, c.run_lease -- 0034
    FOR NO KEY UPDATE OF c; -- 0034
    WITH cand AS ( -- 0034
      SELECT c.job_id, c.run_lease, c.attempt FROM attempt_state a -- 0034
      JOIN claims c ON c.job_id = a.job_id AND c.run_lease = a.run_lease -- 0034
      WHERE a.callback_state = 'pending' AND a.callback_timeout_at < now() -- 0034
        AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease) -- 0034
      ORDER BY a.callback_timeout_at LIMIT p_limit -- 0034
    ) -- 0034
    SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry', -- 0034
             'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'callback timed out', -- 0034
             'reason', 'callback_timeout')) -- 0034
      INTO v_items FROM cand; -- 0034
  ELSE
    -- 0053: the claims past their deadline, by one of two statements as above
    SELECT coalesce(sum(x.n), 0) INTO v_reach -- 0053
    FROM (SELECT s.last_lane_seq - s.first_lane_seq + 1 AS n FROM claim_spans s -- 0053
          WHERE s.deadline_at < now() LIMIT v_span_path_max + 1) x; -- 0053
    IF v_reach = 0 THEN -- 0053
      RETURN; -- 0053
    ELSIF v_reach <= v_span_path_max THEN -- 0053
      PERFORM set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true), -- 0053
              set_config('join_collapse_limit', '1', true); -- 0053
      WITH cand AS ( -- 0053
        SELECT DISTINCT ON (c.deadline_at, c.job_id, c.run_lease) c.job_id, c.run_lease, c.attempt -- 0053
        FROM claim_spans s -- 0053
        JOIN ready r ON r.slot = s.slot AND r.queue = s.queue AND r.priority = s.priority AND r.shard = s.shard -- 0053
                    AND r.lane_seq BETWEEN s.first_lane_seq AND s.last_lane_seq -- 0053
        JOIN claims c ON c.job_id = r.job_id AND c.run_lease = r.run_lease + 1 AND c.slot = r.slot -- 0053
        WHERE s.deadline_at < now() -- 0053
          AND c.deadline_at < now() -- 0053
          AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.slot = c.slot) -- 0053
          AND NOT EXISTS (SELECT 1 FROM attempt_state a WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease -- 0053 (0034)
                            AND a.parked_at IS NOT NULL) -- 0053 (0034)
        ORDER BY c.deadline_at, c.job_id, c.run_lease LIMIT p_limit -- 0053: DISTINCT ON's order
      ) -- 0053
      SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry', -- 0053
               'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'hard deadline exceeded', -- 0053
               'reason', 'deadline_exceeded')) -- 0053
        INTO v_items FROM cand; -- 0053
      PERFORM set_config('enable_hashjoin', v_saved_hashjoin, true), set_config('enable_mergejoin', v_saved_mergejoin, true), -- 0053
              set_config('join_collapse_limit', v_saved_collapse, true); -- 0053
    ELSE -- 0053
    WITH cand AS (
      SELECT c.job_id, c.run_lease, c.attempt FROM claims c
      WHERE c.deadline_at < now()
        AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)
        -- 0034: a parked attempt's claim deadline is void; its callback timeout bounds it
        AND NOT EXISTS (SELECT 1 FROM attempt_state a WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease -- 0034
                          AND a.parked_at IS NOT NULL) -- 0034
      ORDER BY c.deadline_at LIMIT p_limit
    )
    SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry',
             'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'hard deadline exceeded',
             'reason', 'deadline_exceeded'))
      INTO v_items FROM cand;
    END IF; -- 0053
  END IF;
  IF v_items IS NULL THEN
    RETURN;
  END IF;
  FOR v_row IN
    SELECT (v_items -> (f.ord - 1) ->> 'job_id')::bigint AS j, (v_items -> (f.ord - 1) ->> 'run_lease')::bigint AS l, f.state AS s
    FROM finalize(v_items) f WHERE f.applied
  LOOP
    PERFORM pg_notify('awa_cancel_awa', v_row.j || ':' || v_row.l);
    v_closed := v_closed || v_row.j || v_row.l; -- 0036: (job, lease) pairs, flat
    job_id := v_row.j;
    run_lease := v_row.l;
    state := v_row.s;
    RETURN NEXT;
  END LOOP;
  -- 0036: a rescued keyed attempt freed a grant: wake its queue's gated claimers (at commit).
  -- 0050: and those of every queue under its key policy, in every process; one read of the
  -- claims (a pair's queue or policy repeated is one notification: Postgres folds identical ones)
  PERFORM pg_notify('awa_wake_awa', q.queue), -- 0050
          pg_notify('awa_cancel_awa', 'key-closed:' || q.key_policy) -- 0050
  FROM (SELECT DISTINCT c.queue, c.key_policy FROM generate_series(1, cardinality(v_closed), 2) AS i(i) -- 0050
        JOIN claims c ON c.job_id = v_closed[i.i] AND c.run_lease = v_closed[i.i + 1] -- 0036
        WHERE c.key_policy IS NOT NULL) q; -- 0036
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.resolve_callback(p_callback_id text, p_action text, p_payload jsonb, p_error text, p_timeout_ms bigint)
 RETURNS TABLE(result text, job_id bigint, run_lease bigint, state text)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_job bigint;
  v_lease bigint;
  v_lock text;
  v_state attempt_state%ROWTYPE;
  v_final record;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'resolve_callback needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  SELECT x.job_id, x.run_lease INTO v_job, v_lease FROM callback_attempt(p_callback_id) x;
  IF v_job IS NULL THEN
    RETURN QUERY SELECT 'not_found'::text, NULL::bigint, NULL::bigint, NULL::text;
    RETURN;
  END IF;
  v_lock := lock_attempt(v_job, v_lease);
  IF v_lock = 'unknown' THEN
    RETURN QUERY SELECT 'not_found'::text, v_job, v_lease, NULL::text;
    RETURN;
  END IF;
  SELECT * INTO v_state FROM attempt_state a WHERE a.job_id = v_job AND a.run_lease = v_lease;
  IF v_lock = 'closed' OR v_state.callback_id IS DISTINCT FROM p_callback_id
     OR (v_state.callback_state IS DISTINCT FROM 'pending'
         AND NOT (p_action = 'heartbeat' AND v_state.callback_state = 'resumed')) THEN
    RETURN QUERY SELECT 'stale'::text, v_job, v_lease, NULL::text;
    RETURN;
  END IF;
  IF p_action = 'heartbeat' THEN
    UPDATE attempt_state a SET callback_timeout_at = now() + p_timeout_ms * interval '1 millisecond'
    WHERE a.job_id = v_job AND a.run_lease = v_lease;
    RETURN QUERY SELECT 'applied'::text, v_job, v_lease,
                        CASE WHEN v_state.callback_waiting THEN 'waiting_external' ELSE 'running' END;
    RETURN;
  END IF;
  IF p_action = 'resume' THEN
    -- a parked attempt's heartbeat restarts now: if no worker takes it back (claim_resumed)
    -- within the staleness, the stale sweep retries it (it is no longer a pending park)
    UPDATE attempt_state a SET callback_state = 'resumed', callback_result = p_payload, heartbeat_at = now()
    WHERE a.job_id = v_job AND a.run_lease = v_lease;
    -- 'resumed:<job>:<lease>:<queue>' on the cancel channel (a third channel would cost every
    -- worker a pooled connection for its LISTEN; workers before 0034 ignore the payload): wakes
    -- an in-handler wait, or (parked) the queue's dispatchers, which take it back (claim_resumed)
    PERFORM pg_notify('awa_cancel_awa', 'resumed:' || v_job || ':' || v_lease || ':' || c.queue)
    FROM claims c WHERE c.job_id = v_job AND c.run_lease = v_lease;
    RETURN QUERY SELECT 'applied'::text, v_job, v_lease, 'running'::text;
    RETURN;
  END IF;
  IF p_action = 'retry' AND NOT v_state.callback_waiting THEN
    RETURN QUERY SELECT 'not_waiting'::text, v_job, v_lease, NULL::text;
    RETURN;
  END IF;
  SELECT f.applied, f.state INTO v_final
  FROM finalize(jsonb_build_array(jsonb_strip_nulls(jsonb_build_object(
         'job_id', v_job, 'run_lease', v_lease,
         'outcome', CASE p_action WHEN 'complete' THEN 'complete' WHEN 'fail' THEN 'fail' WHEN 'retry' THEN 'release' END,
         'delay_ms', 0,
         'message', CASE p_action WHEN 'fail' THEN coalesce(p_error, 'failed by callback')
                                  WHEN 'retry' THEN 'retried by callback' END)))) f;
  IF v_final.applied IS NOT TRUE THEN
    RETURN QUERY SELECT 'stale'::text, v_job, v_lease, NULL::text;
    RETURN;
  END IF;
  IF p_action = 'retry' THEN
    -- "attempt reset to 0" (§17): the deferred row is the job's newest representation
    UPDATE deferred d SET attempt = 0 WHERE d.job_id = v_job AND d.run_lease = v_lease;
  ELSE
    PERFORM pg_notify('awa_cancel_awa', v_job || ':' || v_lease);
  END IF;
  RETURN QUERY SELECT 'applied'::text, v_job, v_lease, v_final.state;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.retention(p_state text, p_queue text, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
 RETURNS interval
 LANGUAGE sql
 STABLE
AS $function$
  SELECT CASE p_state
    WHEN 'completed' THEN coalesce(m.completed_retention, p_completed_ms * interval '1 millisecond')
    WHEN 'failed' THEN coalesce(m.failed_retention, p_failed_ms * interval '1 millisecond')
    ELSE coalesce(m.cancelled_retention, p_cancelled_ms * interval '1 millisecond') END
  FROM (SELECT 1) one LEFT JOIN awa.queue_meta m ON m.queue = p_queue
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.retry_from_dlq(p_job_id bigint, p_queue text, p_priority integer, p_run_at timestamp with time zone)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
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
  v_shard smallint; -- 0042
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'retry_from_dlq needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  DELETE FROM dlq d WHERE d.job_id = p_job_id RETURNING d.* INTO v_row;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  v_queue := coalesce(p_queue, v_row.queue);
  v_priority := coalesce(p_priority, v_row.priority);
  v_run_at := coalesce(p_run_at, v_now);
  v_state := CASE WHEN v_run_at > v_now THEN 'scheduled' ELSE 'available' END;
  -- 0042: the destination queue's shard for the job's ordering (else concurrency) key, as an insert
  -- chooses it: a key's retried job joins its key's lane; at width 1, shard 0 as before
  v_shard := shard_for(v_queue, v_row.metadata); -- 0042
  IF v_state = 'available' THEN
    PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_queue, v_priority, v_shard)); -- 0042
  END IF;
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
    VALUES (p_job_id, 'scheduled', v_row.kind, v_queue, v_priority, v_shard, v_row.args, v_row.metadata, v_row.tags, v_row.errors, -- 0042
            v_row.progress, 0, v_row.original_run_lease, v_row.max_attempts, v_run_at, v_row.created_at,
            v_row.unique_key, v_row.unique_states);
    RETURN v_state;
  END IF;
  INSERT INTO lanes (queue, priority, shard) VALUES (v_queue, v_priority, v_shard) ON CONFLICT DO NOTHING; -- 0042
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
  INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                     errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
  VALUES (v_ring.slot, v_ring.generation, p_job_id, v_row.kind, v_queue, v_priority, v_shard, nextval('lane_seq'), -- 0042
          v_row.args, v_row.metadata, v_row.tags, v_row.errors, v_row.progress, 0, v_row.original_run_lease,
          v_row.max_attempts, v_run_at, v_row.created_at, v_row.unique_key, v_row.unique_states);
  PERFORM pg_notify('awa_wake_awa', v_queue);
  RETURN v_state;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.retry_job(p_job_id bigint)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
  v_job record;
  v_key record;
  v_ring record;
  v_holder bigint;
  v_shard smallint; -- 0042
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'retry_job needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  SELECT * INTO v_job FROM jobs j WHERE j.job_id = p_job_id;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF v_job.dlq_reason IS NOT NULL THEN
    -- the newest representation is the DLQ row: move it out, never copy it beside the entry
    RETURN retry_from_dlq(p_job_id, NULL, NULL, NULL);
  END IF;
  IF v_job.state NOT IN ('failed', 'cancelled') THEN
    RETURN v_job.state;
  END IF;
  SELECT x.unique_key, x.unique_states INTO v_key FROM (
    SELECT coalesce(t.unique_key, r.unique_key) AS unique_key, coalesce(t.unique_states, r.unique_states) AS unique_states, t.run_lease, t.finalized_at
    FROM terminal t LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
    WHERE t.job_id = p_job_id
    UNION ALL
    SELECT h.unique_key, h.unique_states, h.run_lease, h.finalized_at FROM history h WHERE h.job_id = p_job_id
  ) x ORDER BY x.run_lease DESC, x.finalized_at DESC LIMIT 1;
  v_shard := shard_for(v_job.queue, v_job.metadata); -- 0042: as retry_from_dlq
  PERFORM pg_advisory_xact_lock(lock_ns('enqueue'), lane_key(v_job.queue, v_job.priority, v_shard)); -- 0042
  IF v_key.unique_key IS NOT NULL AND (v_key.unique_states & state_bit('available')) <> 0 THEN
    INSERT INTO unique_claims (unique_key, job_id) VALUES (v_key.unique_key, p_job_id) ON CONFLICT DO NOTHING;
    SELECT u.job_id INTO v_holder FROM unique_claims u WHERE u.unique_key = v_key.unique_key;
    IF v_holder <> p_job_id THEN
      RAISE EXCEPTION 'unique key % is held by job %', encode(v_key.unique_key, 'hex'), v_holder
        USING ERRCODE = 'AWU01', DETAIL = encode(v_key.unique_key, 'hex'), HINT = v_holder::text;
    END IF;
  END IF;
  INSERT INTO lanes (queue, priority, shard) VALUES (v_job.queue, v_job.priority, v_shard) ON CONFLICT DO NOTHING; -- 0042
  SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
  INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                     errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
  VALUES (v_ring.slot, v_ring.generation, p_job_id, v_job.kind, v_job.queue, v_job.priority, v_shard, nextval('lane_seq'), -- 0042
          v_job.args, v_job.metadata, v_job.tags, v_job.errors, v_job.progress, 0, v_job.run_lease, v_job.max_attempts,
          v_now, v_job.created_at, v_key.unique_key, coalesce(v_key.unique_states, 0));
  PERFORM pg_notify('awa_wake_awa', v_job.queue);
  RETURN 'available';
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.retry_job_or_dlq(p_job_id bigint)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'retry_job_or_dlq needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  PERFORM pg_advisory_xact_lock(lock_ns('job'), hashint8(p_job_id));
  -- a new statement after the lock: a move to the DLQ that committed before it is seen
  IF EXISTS (SELECT 1 FROM dlq d WHERE d.job_id = p_job_id) THEN
    RETURN retry_from_dlq(p_job_id, NULL, NULL, NULL);
  END IF;
  RETURN retry_job(p_job_id);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ring_current(p_ring text, OUT generation bigint, OUT slot integer)
 RETURNS record
 LANGUAGE sql
 STABLE
AS $function$
  SELECT r.generation, r.slot FROM awa.ring_rotations r
  WHERE r.ring = p_ring ORDER BY r.generation DESC LIMIT 1
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ring_pruned(p_ring text, p_generation bigint)
 RETURNS boolean
 LANGUAGE sql
 STABLE
AS $function$
  SELECT EXISTS (SELECT 1 FROM awa.ring_ledger_totals t WHERE t.ring = p_ring AND p_generation <= t.through_generation)
      OR EXISTS (SELECT 1 FROM awa.ring_prunes p WHERE p.ring = p_ring AND p.generation = p_generation)
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.ring_slots(p_ring text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  SELECT CASE p_ring WHEN 'queue' THEN 16 WHEN 'history' THEN 32 END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.rotate(p_ring text, p_min_age_ms bigint)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots(p_ring);
  v_cur record;
  v_next int;
  v_rotated_at timestamptz;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'rotate needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext(p_ring)) THEN
    RETURN 'SkippedLocked';
  END IF;
  SELECT r.generation, r.slot, r.rotated_at INTO v_cur FROM ring_rotations r
  WHERE r.ring = p_ring ORDER BY r.generation DESC LIMIT 1;
  IF p_ring = 'queue' THEN
    IF NOT EXISTS (SELECT 1 FROM ready r WHERE r.slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM terminal t WHERE t.slot = v_cur.slot)
       AND NOT EXISTS (SELECT 1 FROM claim_marks m WHERE m.slot = v_cur.slot) THEN
      RETURN 'SkippedIdle';
    END IF;
  ELSIF NOT EXISTS (SELECT 1 FROM history h WHERE h.slot = v_cur.slot) THEN
    RETURN 'SkippedIdle';
  END IF;
  IF v_cur.rotated_at > now() - p_min_age_ms * interval '1 millisecond' THEN
    RETURN 'SkippedIdle';
  END IF;
  v_next := ((v_cur.generation + 1) % v_n)::int;
  IF v_cur.generation + 1 - v_n >= 0 AND NOT EXISTS (
       SELECT 1 FROM ring_prunes p WHERE p.ring = p_ring AND p.generation = v_cur.generation + 1 - v_n) THEN
    RETURN 'SkippedBusy';
  END IF;
  IF p_ring = 'queue' THEN
    IF EXISTS (SELECT 1 FROM ready r WHERE r.slot = v_next) OR EXISTS (SELECT 1 FROM claims c WHERE c.slot = v_next)
       OR EXISTS (SELECT 1 FROM claim_marks m WHERE m.slot = v_next) OR EXISTS (SELECT 1 FROM terminal t WHERE t.slot = v_next)
       OR EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_next) OR EXISTS (SELECT 1 FROM ready_tombstones t WHERE t.slot = v_next) THEN
      RETURN 'SkippedBusy';
    END IF;
  ELSIF EXISTS (SELECT 1 FROM history h WHERE h.slot = v_next) THEN
    RETURN 'SkippedBusy';
  END IF;
  INSERT INTO ring_rotations (ring, generation, slot) VALUES (p_ring, v_cur.generation + 1, v_next)
  ON CONFLICT DO NOTHING;
  IF NOT FOUND THEN
    RETURN 'SkippedBusy';
  END IF;
  RETURN 'Rotated';
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.rotate_queue_when_due(p_min_rows integer, p_max_age_ms bigint)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_cur record;
  v_rows bigint;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'rotate_queue_when_due needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  SELECT r.generation, r.slot, r.rotated_at INTO v_cur FROM ring_rotations r
  WHERE r.ring = 'queue' ORDER BY r.generation DESC LIMIT 1;
  IF v_cur.rotated_at > now() - p_max_age_ms * interval '1 millisecond' THEN
    EXECUTE format('SELECT count(*) FROM (SELECT FROM %I.%I LIMIT %s) s', 'awa', 'ready_' || v_cur.slot, p_min_rows)
      INTO v_rows;
    IF v_rows < p_min_rows THEN
      RETURN 'SkippedIdle';
    END IF;
  END IF;
  RETURN rotate('queue', 0);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.sample_queue_stats(p_min_interval_ms bigint, p_keep_ms bigint)
 RETURNS timestamp with time zone
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
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
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.set_wake_on_demand(p_on boolean)
 RETURNS void
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
BEGIN
  PERFORM pg_advisory_xact_lock(lock_ns('wake_on_demand'), 0);
  EXECUTE format('CREATE OR REPLACE FUNCTION %I.wake_on_demand() RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS %L',
                 'awa', 'SELECT ' || CASE WHEN p_on THEN 'true' ELSE 'false' END);
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.shard_draw()
 RETURNS bigint
 LANGUAGE sql
AS $function$
  SELECT coalesce(nullif(pg_catalog.current_setting('awa.shard_draw', true), '')::bigint,
                  pg_catalog.set_config('awa.shard_draw', pg_catalog.nextval('awa.shard_rotor')::text, true)::bigint)
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.shard_for(p_queue text, p_metadata jsonb)
 RETURNS smallint
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
DECLARE
  v_width int;
  v_key text := coalesce(p_metadata ->> 'awa:orderingKey', p_metadata ->> 'awa:concurrencyKey');
BEGIN
  SELECT m.enqueue_shards INTO v_width FROM queue_meta m WHERE m.queue = p_queue;
  IF v_width IS NULL OR v_width <= 1 THEN
    RETURN 0;
  END IF;
  RETURN CASE WHEN v_key IS NOT NULL
              THEN (hashtextextended('shard' || chr(31) || v_key, 0) & 9223372036854775807) % v_width
              ELSE shard_draw() % v_width END;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.slot_has_unclaimed(p_slot integer)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
 SET search_path TO 'awa', 'pg_catalog'
 SET enable_hashjoin TO 'off'
 SET enable_mergejoin TO 'off'
 SET enable_seqscan TO 'off'
 SET jit TO 'off'
AS $function$
DECLARE
  v_found boolean;
BEGIN
  -- the child by name: a plan for one small table, and no partition pruning at run time
  EXECUTE format($q$
    WITH RECURSIVE lanes AS (
      (SELECT r.queue, r.priority, r.shard FROM %1$I.%2$I r ORDER BY r.queue, r.priority, r.shard LIMIT 1)
      UNION ALL
      SELECT n.queue, n.priority, n.shard
      FROM lanes p CROSS JOIN LATERAL (
        SELECT r.queue, r.priority, r.shard FROM %1$I.%2$I r
        WHERE (r.queue, r.priority, r.shard) > (p.queue, p.priority, p.shard)
        ORDER BY r.queue, r.priority, r.shard LIMIT 1) n
    )
    SELECT EXISTS (
      SELECT 1 FROM lanes l
      CROSS JOIN LATERAL (SELECT %1$I.lane_cursor(l.queue, l.priority, l.shard) AS c) cur
      WHERE EXISTS (
        SELECT 1 FROM %1$I.%2$I r
        WHERE r.queue = l.queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= cur.c
          AND NOT EXISTS (SELECT 1 FROM %1$I.ready_tombstones t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq = r.lane_seq)))$q$,
    'awa', 'ready_' || p_slot) INTO v_found;
  RETURN v_found;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.state_bit(p_state text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
  SELECT CASE p_state
    WHEN 'scheduled' THEN 1 WHEN 'available' THEN 2 WHEN 'running' THEN 4
    WHEN 'waiting_external' THEN 8 WHEN 'retryable' THEN 16 WHEN 'completed' THEN 32
    WHEN 'failed' THEN 64 WHEN 'cancelled' THEN 128 WHEN 'waiting_on' THEN 256 ELSE 0 END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.take_callback(p_job_id bigint, p_run_lease bigint, p_callback_id text, OUT status text, OUT result jsonb)
 RETURNS record
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
DECLARE
  v_state attempt_state%ROWTYPE;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'take_callback needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  status := 'stale';
  -- cheap unlocked look first: the common answer while waiting is 'pending'
  SELECT * INTO v_state FROM attempt_state a WHERE a.job_id = p_job_id AND a.run_lease = p_run_lease;
  IF FOUND AND v_state.callback_id = p_callback_id AND v_state.callback_state = 'pending'
     AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = p_job_id AND z.run_lease = p_run_lease) THEN
    status := 'pending';
    RETURN;
  END IF;
  IF lock_attempt(p_job_id, p_run_lease) <> 'open' THEN
    RETURN;
  END IF;
  SELECT * INTO v_state FROM attempt_state a WHERE a.job_id = p_job_id AND a.run_lease = p_run_lease;
  IF NOT FOUND OR v_state.callback_id IS DISTINCT FROM p_callback_id THEN
    RETURN;
  END IF;
  IF v_state.callback_state = 'resumed' THEN
    UPDATE attempt_state a SET callback_id = NULL, callback_state = NULL, callback_timeout_at = NULL,
                               callback_config = NULL, callback_waiting = false
    WHERE a.job_id = p_job_id AND a.run_lease = p_run_lease;
    status := 'resumed';
    result := v_state.callback_result;
    RETURN;
  END IF;
  status := v_state.callback_state;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.trim_ledgers(p_batch integer)
 RETURNS TABLE(ring text, outcome text, rotations integer, prunes integer, copies integer)
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_ring text;
  v_n int;
  v_cur record;
  v_keep_from bigint;
  v_oldest bigint;
  v_rotations int;
  v_prunes int;
  v_copies int;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'trim_ledgers needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  FOREACH v_ring IN ARRAY ARRAY['queue', 'history'] LOOP
    IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext(v_ring)) THEN
      RETURN QUERY SELECT v_ring, 'Busy', 0, 0, 0;
      CONTINUE;
    END IF;
    v_n := ring_slots(v_ring);
    SELECT * INTO v_cur FROM ring_current(v_ring);
    -- the newest wrap, [g − N + 1, g], answers every reader's question
    v_keep_from := v_cur.generation - v_n + 1;
    SELECT least((SELECT min(r.generation) FROM ring_rotations r WHERE r.ring = v_ring),
                 (SELECT min(p.generation) FROM ring_prunes p WHERE p.ring = v_ring),
                 CASE WHEN v_ring = 'queue' THEN (SELECT min(c.generation) FROM history_copies c) END)
      INTO v_oldest;
    IF v_oldest IS NULL OR v_oldest >= v_keep_from - v_n THEN
      RETURN QUERY SELECT v_ring, 'Kept', 0, 0, 0;
      CONTINUE;
    END IF;

    DELETE FROM ring_rotations r
    WHERE r.ring = v_ring AND r.generation IN (
      SELECT o.generation FROM ring_rotations o WHERE o.ring = v_ring AND o.generation < v_keep_from
      ORDER BY o.generation LIMIT p_batch);
    GET DIAGNOSTICS v_rotations = ROW_COUNT;

    -- the deleted roll-ups go into the carried totals in the same statement (a reader of
    -- ledger_totals sees both or neither)
    WITH gone AS (
      DELETE FROM ring_prunes p
      WHERE p.ring = v_ring AND p.generation IN (
        SELECT o.generation FROM ring_prunes o WHERE o.ring = v_ring AND o.generation < v_keep_from
        ORDER BY o.generation LIMIT p_batch)
      RETURNING p.generation, p.rollup
    ),
    folded AS (
      SELECT coalesce(jsonb_object_agg(s.k, s.n), '{}'::jsonb) AS rollup
      FROM (SELECT e.key AS k, sum(e.value::numeric) AS n
            FROM (SELECT g.rollup FROM gone g
                  UNION ALL
                  SELECT t.rollup FROM ring_ledger_totals t WHERE t.ring = v_ring) x,
                 jsonb_each_text(x.rollup) e
            GROUP BY 1) s
    ),
    summary AS (SELECT count(*) AS n, max(g.generation) AS through FROM gone g),
    carried AS (
      UPDATE ring_ledger_totals t
      SET prunes = t.prunes + m.n, through_generation = greatest(t.through_generation, m.through),
          rollup = f.rollup, updated_at = now()
      FROM folded f, summary m
      WHERE t.ring = v_ring AND m.n > 0
    )
    SELECT m.n INTO v_prunes FROM summary m;

    v_copies := 0;
    IF v_ring = 'queue' THEN
      -- a copy ahead serves only the prune of its own incarnation, done below the newest wrap
      DELETE FROM history_copies c
      WHERE c.generation IN (
        SELECT o.generation FROM history_copies o WHERE o.generation < v_keep_from
        ORDER BY o.generation LIMIT p_batch);
      GET DIAGNOSTICS v_copies = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT v_ring, 'Trimmed', v_rotations, v_prunes, v_copies;
  END LOOP;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.unpark(p_limit integer)
 RETURNS integer
 LANGUAGE plpgsql
 SET search_path TO 'awa', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_lane record;
  v_moved int := 0;
  v_n int;
  v_cursor bigint;
  v_barrier bigint;
  v_have int;
  v_stop bigint;
  v_ring record;
  v_last bigint; -- 0026: the batch's last position
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'unpark needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  FOR v_lane IN
    WITH RECURSIVE l AS (
      (SELECT p.queue, p.priority, p.shard FROM parked p ORDER BY p.queue, p.priority, p.shard LIMIT 1)
      UNION ALL
      SELECT n.queue, n.priority, n.shard
      FROM l CROSS JOIN LATERAL (
        SELECT p.queue, p.priority, p.shard FROM parked p
        WHERE (p.queue, p.priority, p.shard) > (l.queue, l.priority, l.shard)
        ORDER BY p.queue, p.priority, p.shard LIMIT 1) n
    )
    SELECT l.queue, l.priority, l.shard FROM l
    WHERE NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = l.queue AND m.paused)
  LOOP
    EXIT WHEN v_moved >= p_limit;
    CONTINUE WHEN NOT pg_try_advisory_xact_lock(lock_ns('claim'), lane_key(v_lane.queue, v_lane.priority, v_lane.shard));
    -- new statements after the lock: the previous claimer's mark is visible
    v_cursor := lane_cursor(v_lane.queue, v_lane.priority, v_lane.shard);
    SELECT min(p.lane_seq) INTO v_barrier FROM parked p
    WHERE p.queue = v_lane.queue AND p.priority = v_lane.priority AND p.shard = v_lane.shard;
    CONTINUE WHEN v_barrier IS NULL;
    SELECT count(*) INTO v_have FROM (
      SELECT 1 FROM ready r
      WHERE r.queue = v_lane.queue AND r.priority = v_lane.priority AND r.shard = v_lane.shard
        AND r.lane_seq >= v_cursor AND r.lane_seq < v_barrier
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t WHERE t.queue = r.queue AND t.priority = r.priority
                          AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          -- 0026: implied by the equality; bounds a hash join's build side to the window
                          AND t.lane_seq >= v_cursor AND t.lane_seq < v_barrier)
      LIMIT greatest(1, p_limit / 2)) x;
    CONTINUE WHEN v_have >= greatest(1, p_limit / 2);
    -- 0026: the batch's last position first (one ordered scan of the primary key over at most the
    -- batch); the tombstone check and the move below are bounded by it. The lane's parked rows
    -- cannot change meanwhile: we hold its claim lock (park ahead and cancel take it) and ACCESS
    -- SHARE on every ready child since the count above (prune's exclusive phase, which may park,
    -- needs ACCESS EXCLUSIVE).
    SELECT q.lane_seq INTO v_last FROM parked q
    WHERE q.queue = v_lane.queue AND q.priority = v_lane.priority AND q.shard = v_lane.shard
    ORDER BY q.lane_seq OFFSET p_limit - v_moved - 1 LIMIT 1; -- 0026 (NULL: fewer rows than the batch)
    -- A row parked ahead keeps a tombstone ("moved") in its old slot until that slot is truncated;
    -- tombstones match by lane position, whatever the slot, so a copy brought back before then
    -- would count as tombstoned and be skipped (and passed by the cursor). Bring back only the
    -- parked rows below the first one whose tombstone is still there.
    SELECT t.lane_seq INTO v_stop FROM ready_tombstones t
    WHERE t.queue = v_lane.queue AND t.priority = v_lane.priority AND t.shard = v_lane.shard AND t.lane_seq >= v_barrier
      AND t.lane_seq <= coalesce(v_last, 9223372036854775807) -- 0026: only the batch's range matters
      AND EXISTS (SELECT 1 FROM parked p WHERE p.queue = t.queue AND p.priority = t.priority AND p.shard = t.shard
                                           AND p.lane_seq = t.lane_seq)
    ORDER BY t.lane_seq LIMIT 1;
    CONTINUE WHEN v_stop = v_barrier;
    SELECT o_generation AS generation, o_slot AS slot INTO v_ring FROM lock_current_slot('ready');
    WITH moved AS (
      DELETE FROM parked p
      WHERE p.queue = v_lane.queue AND p.priority = v_lane.priority AND p.shard = v_lane.shard
        AND p.lane_seq < coalesce(v_stop, 9223372036854775807) -- 0026
        AND p.lane_seq <= coalesce(v_last, 9223372036854775807) -- 0026: the batch, as a key range
      RETURNING p.*
    )
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_ring.slot, v_ring.generation, m.job_id, m.kind, m.queue, m.priority, m.shard, m.lane_seq, m.args, m.metadata,
           m.tags, m.errors, m.progress, m.attempt, m.run_lease, m.max_attempts, m.run_at, m.created_at, m.unique_key,
           m.unique_states
    FROM moved m;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_moved := v_moved + v_n;
    IF v_n > 0 THEN
      PERFORM pg_notify('awa_wake_awa', v_lane.queue);
    END IF;
  END LOOP;
  RETURN v_moved;
END
$function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.waiter_bucket(p_queue text)
 RETURNS integer
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$ SELECT hashtext(p_queue) & 63 $function$
-- execute besides the owner: owner only

CREATE OR REPLACE FUNCTION awa.wake_on_demand()
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$SELECT true$function$
-- execute besides the owner: owner only
