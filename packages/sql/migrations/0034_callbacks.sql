-- 0034: external callbacks (capabilities.md §17, §6 callback-timeout rescue; issue 21;
-- docs/adr/0030-callbacks.md). storage-engine.md §5.8: registration upserts attempt_state,
-- guarded by the open claim; parking sets its waiting flag; the claim stays open; resolution goes
-- through finalize (§5.4). Nothing here writes a ring child: attempt_state is the plain table
-- for long-lived attempts (§4.4), and closures/terminal/deferred/dlq rows come from finalize.
--
-- New columns of attempt_state (all NULL/false for an attempt that never registers a callback):
--   callback_id          the attempt's current callback: '<job_id>.<run_lease>.<32 hex>', so a
--                        resolver finds its attempt by primary key and can tell a stale id (its
--                        attempt closed, or a newer registration) from an unknown one;
--   callback_timeout_at  when the callback rescue takes it (register, heartbeat_callback);
--   callback_config      the CEL expressions given at registration, evaluated by the resolver;
--   callback_state       'pending' until resolved; 'resumed' once resume_callback delivered a
--                        payload (complete/fail/retry close the attempt and delete the row);
--   callback_result      the resume payload ("stored on the attempt", §17);
--   callback_waiting     parked: the handler returned waitForCallback and freed its permit. No
--                        worker heartbeats a parked attempt, so the stale sweep skips it while
--                        its callback is pending (the callback timeout bounds it instead);
--   parked_at            set by the first park, never cleared: the attempt's claim deadline no
--                        longer applies (the deadline sweep skips it; the timeout bounds it).
--
-- Locks: every function here that writes attempt_state first locks the attempt's claims row FOR
-- NO KEY UPDATE, as heartbeat and finalize do (0028): registration, park, resolution, callback
-- heartbeat, finalize and rescue of one attempt take turns, so "at most one resolution" is the
-- open check plus the callback_state check made after that lock (READ COMMITTED: each later
-- statement sees what the previous holder committed). A held claims row also keeps prune from
-- carrying it meanwhile (prune tries those rows NOWAIT). A parked attempt is an open attempt:
-- prune carries its claim and ready row forward like any long attempt (0021), and its timeout
-- bounds how long it lives.
--
-- Redefined: rescue(text,bigint,integer), on 0027's text (READ COMMITTED check, 0019's body),
-- with the lines marked "0034": the stale sweep skips parked attempts whose callback is pending,
-- the deadline sweep skips attempts that have parked, and a third kind 'callback' rescues
-- attempts whose pending callback timed out. The job_representations view (0021's text) reads
-- a parked attempt as 'waiting_external'. finalize, heartbeat and claim are unchanged: finalize
-- already deletes the attempt_state row (and with it the callback) when the attempt closes, and
-- heartbeat's upsert touches only heartbeat_at and progress.

ALTER TABLE :AWA_SCHEMA.attempt_state
  ADD COLUMN callback_id text,
  ADD COLUMN callback_timeout_at timestamptz,
  ADD COLUMN callback_config jsonb,
  ADD COLUMN callback_state text,
  ADD COLUMN callback_result jsonb,
  ADD COLUMN callback_waiting boolean NOT NULL DEFAULT false,
  ADD COLUMN parked_at timestamptz;

-- The callback rescue's scan: pending callbacks by timeout (few rows: attempts with a callback).
CREATE INDEX attempt_state_callback_timeout ON :AWA_SCHEMA.attempt_state (callback_timeout_at)
  WHERE callback_state = 'pending';
-- Resumed parked attempts waiting for a worker (claim_resumed).
CREATE INDEX attempt_state_resumed ON :AWA_SCHEMA.attempt_state (job_id)
  WHERE callback_waiting AND callback_state = 'resumed';

-- ---------------------------------------------------------------------------------------------
-- Helpers: the attempt named by a callback id, and whether an attempt is open.
CREATE FUNCTION :AWA_SCHEMA.callback_attempt(p_callback_id text, OUT job_id bigint, OUT run_lease bigint)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT split_part(p_callback_id, '.', 1)::bigint, split_part(p_callback_id, '.', 2)::bigint
  WHERE p_callback_id ~ '^[0-9]{1,18}\.[0-9]{1,18}\.[0-9a-f]{32}$'
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.callback_attempt(text) FROM PUBLIC;

-- Locks the attempt's claims row (wherever prune carried it) and says whether it is open: a
-- claim and no closure. 'open', 'closed' (a closure: the attempt finished) or 'unknown' (no
-- claim retained: never claimed, or its slot was reclaimed).
CREATE FUNCTION :AWA_SCHEMA.lock_attempt(p_job_id bigint, p_run_lease bigint) RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
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
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.lock_attempt(bigint, bigint) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- register_callback(job, lease, timeout_ms, config) -> callback id, or NULL when the attempt is
-- not open (stale). Writes: attempt_state (upsert) under the claims-row lock. A newer
-- registration replaces the older id, which is stale from then on.
CREATE FUNCTION :AWA_SCHEMA.register_callback(p_job_id bigint, p_run_lease bigint, p_timeout_ms bigint, p_config jsonb)
RETURNS text
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
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
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.register_callback(bigint, bigint, bigint, jsonb) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- park_callback(job, lease, callback id) -> 'parked' | 'resumed' (a resume arrived before the
-- park: parked all the same, claim_resumed hands it back) | 'stale' (attempt closed, e.g.
-- completed by a callback that arrived first, or a newer registration).
-- Writes: attempt_state.callback_waiting, parked_at, under the claims-row lock.
CREATE FUNCTION :AWA_SCHEMA.park_callback(p_job_id bigint, p_run_lease bigint, p_callback_id text,
                                          OUT status text, OUT result jsonb)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
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
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.park_callback(bigint, bigint, text) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- callback_info(callback id): what a resolver needs to evaluate CEL before resolving. Reads only.
-- status: 'pending' | 'resumed' | 'stale' | 'not_found'.
CREATE FUNCTION :AWA_SCHEMA.callback_info(p_callback_id text, OUT status text, OUT job_id bigint, OUT run_lease bigint,
                                          OUT config jsonb, OUT waiting boolean, OUT result jsonb)
LANGUAGE plpgsql STABLE SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
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
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.callback_info(text) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- resolve_callback(callback id, action, payload, error, timeout_ms) -> result, job, lease, state.
-- action: 'complete' | 'fail' | 'retry' | 'resume' | 'heartbeat'.
-- result: 'applied' | 'stale' | 'not_found' | 'not_waiting' (retry of an attempt not parked).
-- Locks: the attempt's claims row (lock_attempt), then finalize's own locks on the same row.
-- Guards: the attempt is open, its current callback is p_callback_id and still 'pending'; a
-- second resolver waits for the first's lock and then sees its closure or its 'resumed'.
-- Writes: complete/fail/retry through finalize (closure, terminal/deferred/dlq, attempt_state
-- deleted); retry then sets the deferred row's attempt to 0 (deferred is a plain table);
-- resume/heartbeat update attempt_state only. complete/fail notify the cancel channel so a
-- handler still running the attempt stops (its own outcome would be stale anyway); resume
-- notifies the cancel channel with a 'resumed:' payload, which wakes an in-handler wait and the
-- dispatchers of the queue of a parked one.
CREATE FUNCTION :AWA_SCHEMA.resolve_callback(p_callback_id text, p_action text, p_payload jsonb, p_error text,
                                             p_timeout_ms bigint)
RETURNS TABLE (result text, job_id bigint, run_lease bigint, state text)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
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
    PERFORM pg_notify('awa_cancel_:AWA_SCHEMA', 'resumed:' || v_job || ':' || v_lease || ':' || c.queue)
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
    PERFORM pg_notify('awa_cancel_:AWA_SCHEMA', v_job || ':' || v_lease);
  END IF;
  RETURN QUERY SELECT 'applied'::text, v_job, v_lease, v_final.state;
END
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.resolve_callback(text, text, jsonb, text, bigint) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- take_callback(job, lease, callback id) -> status, result: an in-handler wait's check.
-- 'pending' (keep waiting), 'resumed' (result delivered: the registration is spent, callback_id
-- cleared so the next wait needs a new one), 'stale' (attempt closed or re-registered).
-- Writes: attempt_state (clears the spent callback) under the claims-row lock.
CREATE FUNCTION :AWA_SCHEMA.take_callback(p_job_id bigint, p_run_lease bigint, p_callback_id text,
                                          OUT status text, OUT result jsonb)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
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
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.take_callback(bigint, bigint, text) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- cancel_callback(job, lease) -> whether a pending callback was withdrawn (the handler could not
-- send its id out). The attempt stays open; unparked, so the stale sweep covers it again.
CREATE FUNCTION :AWA_SCHEMA.cancel_callback(p_job_id bigint, p_run_lease bigint) RETURNS boolean
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
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
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.cancel_callback(bigint, bigint) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- claim_resumed(queue, max): parked attempts a resume reached, handed back to a worker with the
-- same run lease and the resume payload. Locks: each attempt's claims row FOR NO KEY UPDATE SKIP
-- LOCKED in (job_id, run_lease) order (another taker or a resolver holds it: skipped), then the
-- guard again. Writes: attempt_state (callback_waiting false, heartbeat now: the taker's
-- heartbeats keep it from here; the spent callback cleared).
CREATE FUNCTION :AWA_SCHEMA.claim_resumed(p_queue text, p_max int)
RETURNS TABLE (job_id bigint, run_lease bigint, kind text, queue text, priority smallint, attempt int, max_attempts int,
               args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamptz, created_at timestamptz,
               claimed_at timestamptz, progress jsonb, callback_result jsonb)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
#variable_conflict use_column
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim_resumed needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
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
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim_resumed(text, int) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- rescue(text,bigint,integer): 0027's text with the lines marked 0034.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.rescue(p_kind text, p_staleness_ms bigint, p_limit integer)
 RETURNS TABLE(job_id bigint, run_lease bigint, state text)
 LANGUAGE plpgsql
 SET search_path TO ':AWA_SCHEMA', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_cutoff timestamptz := now() - p_staleness_ms * interval '1 millisecond';
  v_items jsonb;
  v_row record;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'rescue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF p_kind = 'stale' THEN
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
  ELSIF p_kind = 'callback' THEN -- 0034
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
  END IF;
  IF v_items IS NULL THEN
    RETURN;
  END IF;
  FOR v_row IN
    SELECT (v_items -> (f.ord - 1) ->> 'job_id')::bigint AS j, (v_items -> (f.ord - 1) ->> 'run_lease')::bigint AS l, f.state AS s
    FROM finalize(v_items) f WHERE f.applied
  LOOP
    PERFORM pg_notify('awa_cancel_:AWA_SCHEMA', v_row.j || ':' || v_row.l);
    job_id := v_row.j;
    run_lease := v_row.l;
    state := v_row.s;
    RETURN NEXT;
  END LOOP;
END
$function$;

-- ---------------------------------------------------------------------------------------------
-- The job views: 0021's text; a parked attempt whose callback is pending reads 'waiting_external'.
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
  FROM :AWA_SCHEMA.terminal t
  LEFT JOIN :AWA_SCHEMA.ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
UNION ALL
  SELECT h.job_id, 4, h.state, h.kind, h.queue, h.priority, h.args, h.metadata, h.tags, h.errors, h.progress,
         h.attempt, h.max_attempts, h.run_lease, h.run_at, h.created_at, h.finalized_at, NULL
  FROM :AWA_SCHEMA.history h;
