-- 0046: the fleet rate's GCRA read in one place (issue 20; docs/adr/0036-fleet-rate-limit.md).
--
-- claim_rated (0043) and claim_keyed_rated (0045) each carried the same preamble: the range check
-- of rate and burst, the queue's rate lock, the read of its newest mark and the token formula.
-- rate_tokens is that preamble; both claims are redefined to call it, with their behaviour
-- unchanged (FleetRate.pg.test.ts and FleetRate.keyed.pg.test.ts). What stays in each claim is
-- what differs: the claim it wraps, the row it returns without a token, and how it counts the
-- jobs taken (every claim_rated row is a job; claim_keyed's gate row is not).
--
-- Locks, guards and writes:
-- - rate_tokens takes the queue's rate lock (transaction-scoped advisory, lock_ns('rate')) and
--   holds it to commit, then reads the mark the previous holder committed (READ COMMITTED: a
--   statement that starts after the lock is granted), as the claims did inline. With p_max <= 0
--   it takes no lock and reads nothing (as before: the claims returned before the lock).
-- - rate_tokens writes nothing. The claims' writes are as before: their claim's rows, and when
--   they took jobs one rate_marks insert and the delete of the mark read (by its tuple id).
-- - Bad input: a rate outside (0, 100000] or a negative burst raises 22023 naming the claim
--   called (p_caller), before p_max is looked at, as before.
--
-- rate_tokens returns:
-- - tokens: the tokens there are now, at most the burst (≤ 0: none);
-- - base: max(tat, t), from which a claim of n advances tat to base + n × period;
-- - period: 1 / rate;
-- - mark: the tuple id of the mark read (NULL when the queue has none yet);
-- - next_token_at: when the next token is due once every token counted here is taken; with no
--   token, when the first one is due.

CREATE FUNCTION :AWA_SCHEMA.rate_tokens(p_caller text, p_queue text, p_max integer, p_rate double precision,
                                        p_burst integer, OUT tokens integer, OUT base double precision,
                                        OUT period double precision, OUT mark tid, OUT next_token_at timestamptz)
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET jit = off
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
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.rate_tokens(text, text, int, double precision, int) FROM PUBLIC;

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.claim_rated(p_queue text, p_max integer, p_deadline_ms bigint, p_aging_ms bigint,
                                                   p_rate double precision, p_burst integer)
 RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, deadline_at timestamp with time zone, progress jsonb, next_token_at timestamp with time zone)
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET jit = off
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
$function$;

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.claim_keyed_rated(p_queue text, p_policy text, p_max integer, p_deadline_ms bigint,
                                                         p_aging_ms bigint, p_rate double precision, p_burst integer)
 RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, deadline_at timestamp with time zone, progress jsonb, gate text, next_token_at timestamp with time zone)
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog
 SET jit = off
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
$function$;
