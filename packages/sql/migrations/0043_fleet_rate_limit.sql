-- 0043: a fleet-wide rate limit (issue 20 item 1, docs/adr/0036-fleet-rate-limit.md).
--
-- A queue whose workers set `fleetRateLimit: { maxRate, burst }` claims through claim_rated: at
-- most `burst + maxRate × W` of its jobs are claimed in any window of W seconds, summed over every
-- process, lane and claimer. GCRA: the queue's state is one number, its theoretical arrival time
-- `tat` (epoch seconds); at time t the tokens are floor((t + burst·T − max(tat, t)) / T), at most
-- burst, with T = 1 / maxRate; a claim of n sets tat := max(tat, t) + n·T.
--
-- The state is append-only: rate_marks gets one row per claim call that took jobs, and the
-- current tat is the queue's first entry of (queue, tat DESC). The read costs one index probe
-- however many older marks there are (alive, or dead under a pinned horizon: they lie below the
-- newest and are never visited). Each call that claimed deletes the mark it read, by its tuple
-- id (one row, no scan), so a queue keeps one live mark. Not a ring table: the ring's
-- no-dead-tuples guarantee is untouched; these few dead rows are vacuum's.
--
-- Locks, guards and writes:
-- - claim_rated takes the queue's rate lock (transaction-scoped advisory, lock_ns('rate')) before
--   it reads tat, and holds it to commit: every rated claim of the queue, in any process or lane,
--   reads the mark the previous one committed (READ COMMITTED: a statement that starts after the
--   lock is granted). So the bound is exact. t is now(), the transaction's start: a claimer that
--   waited for the lock computes with an earlier t, which only gives fewer tokens.
-- - A rolled-back claim rolls its mark back with its claims rows: its tokens come back.
-- - Writes: claim's (claims rows, claim marks); when it claimed, one rate_marks insert and the
--   delete of the mark it read.
-- - Returns claim's rows; next_token_at is NULL unless the tokens cut the claim short of p_max,
--   then the time the next token is due. With no token, one row without a job whose
--   next_token_at says when the next token is due (as claim_keyed's gate row, 0041).

CREATE TABLE :AWA_SCHEMA.rate_marks (
  queue text NOT NULL,
  tat double precision NOT NULL,
  marked_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX rate_marks_queue_tat ON :AWA_SCHEMA.rate_marks (queue, tat DESC);
REVOKE ALL ON :AWA_SCHEMA.rate_marks FROM PUBLIC;

CREATE FUNCTION :AWA_SCHEMA.claim_rated(p_queue text, p_max integer, p_deadline_ms bigint, p_aging_ms bigint,
                                        p_rate double precision, p_burst integer)
 RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, deadline_at timestamp with time zone, progress jsonb, next_token_at timestamp with time zone)
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET jit = off
AS $function$
#variable_conflict use_column
DECLARE
  v_t double precision := extract(epoch FROM now());
  v_period double precision;
  v_burst int;
  v_tat double precision;
  v_read tid; -- the mark read (its tuple id)
  v_base double precision;
  v_tokens int;
  v_n int;
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim_rated needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF p_rate IS NULL OR NOT (p_rate > 0 AND p_rate <= 100000) OR p_burst IS NULL OR p_burst < 0 THEN
    RAISE EXCEPTION 'claim_rated needs 0 < rate <= 100000 and burst >= 0 (got %, %)', p_rate, p_burst
      USING ERRCODE = '22023';
  END IF;
  IF p_max <= 0 THEN
    RETURN;
  END IF;
  v_period := 1 / p_rate;
  v_burst := CASE WHEN p_burst = 0 THEN greatest(1, ceil(p_rate)::int) ELSE p_burst END;
  PERFORM pg_advisory_xact_lock(lock_ns('rate'), hashtext(p_queue));
  -- after the lock: the mark the previous holder committed
  SELECT m.tat, m.ctid INTO v_tat, v_read FROM rate_marks m WHERE m.queue = p_queue ORDER BY m.tat DESC LIMIT 1;
  v_tokens := least(v_burst, floor((v_t + v_burst * v_period - greatest(coalesce(v_tat, v_t), v_t)) / v_period + 1e-9)::int);
  IF v_tokens <= 0 THEN
    RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::int, NULL::int, NULL::text, p_queue, NULL::smallint, NULL::jsonb,
                        NULL::jsonb, NULL::text[], NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                        NULL::timestamptz, NULL::jsonb,
                        to_timestamp(v_tat - v_burst * v_period + v_period);
    RETURN;
  END IF;
  v_base := greatest(coalesce(v_tat, v_t), v_t);
  -- cut by the tokens (fewer than asked): each row says when the next token is due once these
  -- are taken, so the worker claims again then rather than at its poll
  RETURN QUERY SELECT c.*, CASE WHEN v_tokens < p_max THEN to_timestamp(v_base + (v_tokens - v_burst + 1) * v_period) END
               FROM claim(p_queue, least(p_max, v_tokens), p_deadline_ms, p_aging_ms) c;
  GET DIAGNOSTICS v_n = ROW_COUNT;
  IF v_n > 0 THEN
    INSERT INTO rate_marks (queue, tat) VALUES (p_queue, v_base + v_n * v_period);
    -- the mark read is superseded: deleted by its tuple id, one row, never a scan (a range delete
    -- would walk every mark a pinned horizon keeps dead, on every claim)
    DELETE FROM rate_marks m WHERE m.ctid = v_read;
  END IF;
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim_rated(text, int, bigint, bigint, double precision, int) FROM PUBLIC;
