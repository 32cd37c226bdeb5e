-- 0045: a keyed queue under a fleet-wide rate limit (issue 20; docs/adr/0036-fleet-rate-limit.md,
-- "Keyed queues"). Until now a queue could have a key policy or a fleet rate, not both.
--
-- claim_keyed_rated is claim_rated (0043) around claim_keyed (0041) instead of claim: the same
-- GCRA state (the queue's newest rate_marks row, so a queue claimed keyed by some processes and
-- plainly by others still shares one budget), the same lock, the tokens there are passed on as
-- the keyed claim's max, and the new mark advanced by the jobs the keyed claim took (its gate row,
-- a row without a job, takes no token).
--
-- Locks, guards and writes:
-- - the queue's rate lock (transaction-scoped advisory, lock_ns('rate')) before tat is read, held
--   to commit, as claim_rated; then claim_keyed's own (the policy's shared lock, try-locks of
--   lanes and keys). Every other taker of a rate lock is claim_rated, which takes no key lock,
--   and the key and lane locks are only tried: no wait can close a cycle.
-- - A rolled-back claim rolls its mark back with its claims rows and grants: its tokens come back.
-- - Writes: claim_keyed's (claims rows with their grants, claim marks); when it took jobs, one
--   rate_marks insert and the delete of the mark it read (by tuple id), in the same statement.
-- - Returns claim_keyed's rows (gate as there) and next_token_at: NULL unless the tokens were
--   what cut the claim short (it took every token it was given, fewer than p_max), then when the
--   next token is due. With no token, one row without a job and without a gate whose
--   next_token_at says when the next token is due.

CREATE FUNCTION :AWA_SCHEMA.claim_keyed_rated(p_queue text, p_policy text, p_max integer, p_deadline_ms bigint,
                                              p_aging_ms bigint, p_rate double precision, p_burst integer)
 RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, deadline_at timestamp with time zone, progress jsonb, gate text, next_token_at timestamp with time zone)
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
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim_keyed_rated needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF p_rate IS NULL OR NOT (p_rate > 0 AND p_rate <= 100000) OR p_burst IS NULL OR p_burst < 0 THEN
    RAISE EXCEPTION 'claim_keyed_rated needs 0 < rate <= 100000 and burst >= 0 (got %, %)', p_rate, p_burst
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
                        NULL::timestamptz, NULL::jsonb, NULL::text,
                        to_timestamp(v_tat - v_burst * v_period + v_period);
    RETURN;
  END IF;
  v_base := greatest(coalesce(v_tat, v_t), v_t);
  -- The keyed claim, the mark and the superseded mark's delete in one statement: the jobs taken
  -- (rows with a job; the gate row has none) advance tat.
  RETURN QUERY
  WITH c AS MATERIALIZED (
    SELECT k.* FROM claim_keyed(p_queue, p_policy, least(p_max, v_tokens), p_deadline_ms, p_aging_ms) k
  ),
  taken AS MATERIALIZED (
    SELECT count(c.job_id)::int AS n FROM c
  ),
  mark AS (
    INSERT INTO rate_marks (queue, tat) SELECT p_queue, v_base + t.n * v_period FROM taken t WHERE t.n > 0
  ),
  -- by its tuple id, one row, never a scan (as claim_rated)
  superseded AS (
    DELETE FROM rate_marks m WHERE m.ctid = v_read AND EXISTS (SELECT 1 FROM taken t WHERE t.n > 0)
  )
  SELECT c.*, CASE WHEN t.n = v_tokens AND v_tokens < p_max THEN to_timestamp(v_base + (t.n - v_burst + 1) * v_period) END
  FROM c CROSS JOIN taken t;
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim_keyed_rated(text, text, int, bigint, bigint, double precision, int) FROM PUBLIC;
