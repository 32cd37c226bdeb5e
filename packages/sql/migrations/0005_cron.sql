-- 0005: periodic (cron) schedules (capability 9, docs/adr/0006-cron.md).
--
-- A control table, touched per schedule per tick (a fire), per worker start (upsert) and per
-- operator action: never per job. The maintenance leader evaluates the schedules in TypeScript
-- (croner) and fires each due tick through cron_fire, which checks and advances last_fire_at and
-- enqueues the job through enqueue(jsonb) in one transaction.
--
-- Lock order: schedule row (FOR UPDATE) → enqueue's lane enqueue lock → ring slot. Nothing takes
-- a schedule row while holding an engine lock.

CREATE TABLE :AWA_SCHEMA.cron_schedules (
  name                text        PRIMARY KEY CHECK (char_length(name) BETWEEN 1 AND 200),
  -- 5 fields, or 6 with seconds (croner syntax), evaluated in `timezone` (IANA name)
  expression          text        NOT NULL,
  timezone            text        NOT NULL,
  -- the job: kind, queue and Schema-encoded args; options = {priority, max_attempts, tags,
  -- metadata, unique?} as the declaring code resolved them
  kind                text        NOT NULL,
  queue               text        NOT NULL,
  args                jsonb       NOT NULL,
  options             jsonb       NOT NULL DEFAULT '{}',
  missed_fire         text        NOT NULL CHECK (missed_fire IN ('coalesce', 'catch_up')),
  catch_up_max        int         CHECK (catch_up_max BETWEEN 1 AND 1000),
  paused              boolean     NOT NULL DEFAULT false,
  paused_by           text,
  paused_at           timestamptz,
  -- the last tick fired (whole seconds, written only by cron_fire): the compare-and-swap value
  last_fire_at        timestamptz,
  last_job_id         bigint,
  last_triggered_at   timestamptz,
  -- first declared; definition or pause state last changed; expression or zone last changed
  -- (ticks before it minus one minute are never due); last declared by a starting worker
  declared_at         timestamptz NOT NULL DEFAULT now(),
  updated_at          timestamptz NOT NULL DEFAULT now(),
  schedule_changed_at timestamptz NOT NULL DEFAULT now(),
  last_declared_at    timestamptz NOT NULL DEFAULT now(),
  -- set when a starting worker does not declare the schedule, cleared when one does; a report,
  -- never a deletion
  stale_since         timestamptz,
  CHECK ((missed_fire = 'catch_up') = (catch_up_max IS NOT NULL))
);

-- ---------------------------------------------------------------------------------------------
-- cron_upsert(rows jsonb) -> (name, created, changed)
-- Input: JSON array of {name, expression, timezone, kind, queue, args, options, missed_fire,
--        catch_up_max}. Additive: never deletes; pause state and last_fire_at are kept.
-- Locks: the row of every named schedule (ON CONFLICT DO UPDATE), in byte order of the name, so
--        two workers starting together cannot deadlock.
-- Writes: the definition; updated_at when it changed; schedule_changed_at when the expression or
--         zone changed; last_declared_at; clears stale_since.
CREATE FUNCTION :AWA_SCHEMA.cron_upsert(p_rows jsonb)
RETURNS TABLE (name text, created boolean, changed boolean)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
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
$$;

-- ---------------------------------------------------------------------------------------------
-- cron_mark_stale(declared text[]) -> the schedules not in `declared`, marked.
-- Locks: the rows it marks. Writes: stale_since (kept when already set). Never deletes.
CREATE FUNCTION :AWA_SCHEMA.cron_mark_stale(p_declared text[])
RETURNS SETOF :AWA_SCHEMA.cron_schedules
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
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
$$;

-- ---------------------------------------------------------------------------------------------
-- cron_set_paused(name, paused, by) -> false when the schedule does not exist.
-- Locks: the schedule's row: waits for a fire in progress, and a fire waiting behind it re-reads
--        `paused` after the lock (so a pause that commits first always blocks the fire).
-- Writes: paused, paused_by/paused_at (kept when already paused; cleared on resume), updated_at.
CREATE FUNCTION :AWA_SCHEMA.cron_set_paused(p_name text, p_paused boolean, p_by text)
RETURNS boolean
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
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
$$;

-- ---------------------------------------------------------------------------------------------
-- cron_fire(name, expected_last, tick, job jsonb) -> (outcome, job_id)
-- One fire of one tick, atomically.
-- Input: `job` is one row in enqueue's input format; awa:cronName and awa:cronFireTime (the tick,
--        ISO 8601 UTC with milliseconds) are added to its metadata here.
-- Locks: the schedule's row (FOR UPDATE, blocking), then those of enqueue.
-- Guard: read after the row lock, so it includes whatever a concurrent fire, pause or upsert
--        committed first: the schedule exists, is not paused, last_fire_at IS NOT DISTINCT FROM
--        expected_last, tick > last_fire_at, tick <= now(). Two leaders firing the same tick
--        from the same expected value: the second sees the first's last_fire_at and is 'stale'.
-- Writes: last_fire_at = tick and last_job_id; the job through enqueue(jsonb), in this
--         transaction: both commit or neither does, so a crash loses no tick and repeats none.
-- Outcomes: 'fired' (job_id = the new job), 'deduplicated' (the job's unique key is held: the
--         tick is consumed, job_id = the holder), 'not_found', 'paused', 'stale', 'not_due'.
CREATE FUNCTION :AWA_SCHEMA.cron_fire(p_name text, p_expected_last timestamptz, p_tick timestamptz, p_job jsonb)
RETURNS TABLE (outcome text, job_id bigint)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_schedule record;
  v_row jsonb;
  v_job_id bigint;
  v_holder text;
BEGIN
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
  BEGIN
    SELECT e.job_id INTO v_job_id FROM enqueue(jsonb_build_array(v_row)) e;
  EXCEPTION WHEN SQLSTATE 'AWU01' THEN
    -- the unique key is held (e.g. the previous fire's job still runs): the tick is consumed
    GET STACKED DIAGNOSTICS v_holder = PG_EXCEPTION_HINT;
    UPDATE cron_schedules c SET last_fire_at = p_tick, last_job_id = NULL WHERE c.name = p_name;
    RETURN QUERY SELECT 'deduplicated'::text, v_holder::bigint;
    RETURN;
  END;
  UPDATE cron_schedules c SET last_fire_at = p_tick, last_job_id = v_job_id WHERE c.name = p_name;
  RETURN QUERY SELECT 'fired'::text, v_job_id;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- cron_trigger(name, job jsonb) -> the new job's id; no row when the schedule does not exist.
-- A manual fire: ignores pause and does not move last_fire_at (the schedule keeps its ticks).
-- Locks: the schedule's row (FOR UPDATE), then those of enqueue.
-- Writes: last_triggered_at; the job through enqueue(jsonb) with awa:cronName, awa:cronFireTime
--         (now) and awa:cronTriggered = true. Errors: AWU01 from enqueue (unique conflict).
CREATE FUNCTION :AWA_SCHEMA.cron_trigger(p_name text, p_job jsonb)
RETURNS TABLE (job_id bigint)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_now timestamptz := now();
BEGIN
  PERFORM 1 FROM cron_schedules c WHERE c.name = p_name FOR UPDATE;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  UPDATE cron_schedules c SET last_triggered_at = v_now WHERE c.name = p_name;
  RETURN QUERY
  SELECT e.job_id FROM enqueue(jsonb_build_array(jsonb_set(p_job, '{metadata}',
    coalesce(p_job -> 'metadata', '{}') || jsonb_build_object(
      'awa:cronName', p_name,
      'awa:cronFireTime', to_char(v_now AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
      'awa:cronTriggered', true)))) e;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- cron_remove(name) -> whether it existed. Locks: the row. A worker that still declares the
-- schedule re-creates it (without its last fire) when it next starts.
CREATE FUNCTION :AWA_SCHEMA.cron_remove(p_name text)
RETURNS boolean
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
BEGIN
  DELETE FROM cron_schedules c WHERE c.name = p_name;
  RETURN FOUND;
END
$$;

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.cron_upsert(jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.cron_mark_stale(text[]) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.cron_set_paused(text, boolean, text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.cron_fire(text, timestamptz, timestamptz, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.cron_trigger(text, jsonb) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.cron_remove(text) FROM PUBLIC;
