-- 0036: key grants at a cost independent of a key's history, and wake-ups for gated claimers
-- after rescue and operator cancel (issue 20 item 3 "Cost" and leftovers, capabilities.md §23,
-- docs/adr/0029-key-execution-grants.md, amendment 2026-12-02).
--
-- 1. claim_keyed: 0033's text with three changes, its lines marked "0036":
--    a. a key's open grants are counted in the ring slots that can hold a claim (the unpruned
--       ones, queue_slot_ranges), read in a statement that starts after the key locks are held;
--       0033 counted in all 16 children (no partition pruning: one index probe per child per
--       key). Why no open grant is missed: a grant committed by an earlier holder of the key's
--       lock sits in a slot whose rotation committed before that grant, so before our ranges
--       read (which starts after we got the lock): at or below its upper end. A slot leaves the
--       ranges only when prune records it pruned, in the transaction that carried its open
--       claims (kept columns, 0033) into the then-current slot, which is in the ranges too; and
--       no prune can commit while we run: it truncates a slot under ACCESS EXCLUSIVE on the
--       slot's children, claim_marks_<slot> among them, and we hold ACCESS SHARE on every
--       claim_marks child from the cursor read on (that read has no slot bound), before any key
--       lock.
--    b. the count reads a key's grants from its horizon on, not its whole history: each grant
--       records key_seq (lock order) and key_horizon (below it, every grant of the key was
--       closed when it was taken); the count takes the horizon of the key's newest grant and
--       reads the grants from there, plus those without a key_seq, and stops at the policy's
--       limit (admission only asks whether open + admitted < limit). Cost: the grants taken
--       since the key's oldest open grant (at its last claim), not all it kept in the ring.
--    c. at most 64 keys per call (was 32): the lock budget measured (LockBudget.keyed.test.ts:
--       20 sessions each holding a claim_keyed of 64 keys hold 3,500 entries of a stock lock
--       table of 6,400: 175 each, against 143 with 32 keys and 72 for the unkeyed claim), so
--       a window of 64 distinct keys is claimed whole.
--    d. per-call overhead that the unkeyed claim does not pay, measured with pgbench (claim(50)
--       of 50 distinct keys, rolled back, same sitting): the lanes are ranked only when there
--       are several (as claim); the window's rows are kept and claimed from the variable (0033
--       read ready twice); the key digest is written out (key_digest is not inlined: convert_to
--       is STABLE inside an IMMUTABLE function, ~10 us per row); the count's closure probe names
--       the slot ranges (one closures child opened, not 16); the ranges after the key locks are
--       the pick's when the ring's newest generation did not move in between.
-- 2. rescue (0034's text) and cancel_job (0027's text): a closure of a keyed attempt also
--    notifies the queue's wake channel (delivered at commit), as the runtime does after
--    finalize's closures, so gated claimers wake at once instead of at their poll interval.
--    Lines marked "0036". Nothing else in the bodies or their SET options changes.
--
-- Locks: as 0033/0034/0027 (claim_keyed: the policy lock shared, lane claim locks tried, up to
-- 64 key locks tried, all transaction-scoped). Writes: claim_keyed's claims rows gain key_seq
-- and key_horizon (insert only), one nextval of key_grant_seq per lane with keys (a sequence
-- is not a table row: no dead tuple); rescue and cancel_job add a pg_notify.

-- Grant order and horizons (1b): key_seq, from one sequence, taken by claim_keyed after it holds
-- the key locks of a lane (so a later holder of a key always writes a larger key_seq), and
-- key_horizon: a key_seq below which every grant of the key was closed when this one was taken
-- (the smallest key_seq of its open grants then, or this call's own). Closed stays closed, so
-- any grant's horizon stays true: the count reads the key's grants from the horizon of its
-- newest one. NULL in both for unkeyed claims, for claims carried by prune (its insert lists its
-- columns: counted always, as NULL key_seq) and while the policy is disabled (no count ran).
-- Catalog-only column additions; the partial index gains key_seq and replaces 0033's.
CREATE SEQUENCE :AWA_SCHEMA.key_grant_seq AS bigint;
ALTER TABLE :AWA_SCHEMA.claims ADD COLUMN key_seq bigint, ADD COLUMN key_horizon bigint;
CREATE INDEX claims_key_seq_idx ON :AWA_SCHEMA.claims (key_policy, key_digest, key_seq) WHERE key_policy IS NOT NULL;
DROP INDEX :AWA_SCHEMA.claims_key_grants_idx;

-- ---------------------------------------------------------------------------------------------
-- :AWA_SCHEMA.claim_keyed: 0033's text, lines marked 0036.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.claim_keyed(p_queue text, p_policy text, p_max int, p_deadline_ms bigint, p_aging_ms bigint)
  RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamptz, created_at timestamptz, claimed_at timestamptz, deadline_at timestamptz, progress jsonb, gate text)
  LANGUAGE plpgsql
  SET search_path = :AWA_SCHEMA, pg_catalog
  SET plan_cache_mode = force_generic_plan
  SET enable_seqscan = off
  SET jit = off
  SET enable_bitmapscan = off
  SET enable_hashjoin = off
  SET enable_mergejoin = off
  SET enable_material = off
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
  v_gen bigint; -- 0036: the queue ring's newest generation before the pick's ranges were read
  v_gen2 bigint; -- 0036: and after a lane's key locks
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
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'claim_keyed needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
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
  WITH cur AS MATERIALIZED (
    SELECT l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard) AS c
    FROM lanes l WHERE l.queue = p_queue
      AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused)
  )
  SELECT array_agg(o.priority ORDER BY o.n), array_agg(o.shard ORDER BY o.n) INTO v_prios, v_shards
  FROM (
    SELECT cur.priority, cur.shard,
           row_number() OVER (ORDER BY CASE WHEN p_aging_ms > 0
                                            THEN greatest(1, cur.priority - floor(extract(epoch FROM (v_now - head.run_at)) * 1000 / p_aging_ms))
                                            ELSE cur.priority END,
                                       head.run_at, cur.priority, cur.shard) AS n
    FROM cur
    CROSS JOIN LATERAL (
      SELECT r.run_at FROM ready r
      WHERE r.queue = cur.queue AND r.priority = cur.priority AND r.shard = cur.shard AND r.lane_seq >= cur.c
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1
    ) head
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
      CONTINUE WHEN NOT v_ranked AND NOT EXISTS ( -- 0036
        SELECT 1 FROM ready r -- 0036
        WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k] -- 0036
          AND r.lane_seq >= lane_cursor(p_queue, v_prios[v_k], v_shards[v_k]) -- 0036
          AND NOT EXISTS (SELECT 1 FROM ready_tombstones t -- 0036
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq)); -- 0036
      v_contended := true;
      CONTINUE;
    END IF;
    SELECT m.next_lane_seq INTO v_cursor FROM claim_marks m
    WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k]
    ORDER BY m.next_lane_seq DESC LIMIT 1;
    v_cursor := coalesce(v_cursor, 0);
    IF v_lo1 IS NULL THEN
      -- 0036: the newest generation, read before the ranges (they reach at least up to it)
      SELECT g.generation INTO v_gen FROM ring_rotations g WHERE g.ring = 'queue' ORDER BY g.generation DESC LIMIT 1; -- 0036
      SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_lo1, v_hi1, v_lo2, v_hi2 FROM queue_slot_ranges() s;
    END IF;
    -- The window (claim's pick, without the writes).
    WITH w AS MATERIALIZED (
      SELECT r AS rw, r.job_id, r.lane_seq, r.metadata ->> 'awa:concurrencyKey' AS ckey, -- 0036: rw
             (r.unique_key IS NOT NULL AND (r.unique_states & 6) = 4) AS at_claim
      FROM ready r
      WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k] AND r.lane_seq >= v_cursor
        AND (r.slot BETWEEN v_lo1 AND v_hi1 OR r.slot BETWEEN v_lo2 AND v_hi2)
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          AND (t.slot BETWEEN v_lo1 AND v_hi1 OR t.slot BETWEEN v_lo2 AND v_hi2))
        AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused)
        AND r.lane_seq < coalesce((SELECT p.lane_seq FROM parked p
                                   WHERE p.queue = p_queue AND p.priority = v_prios[v_k] AND p.shard = v_shards[v_k]
                                   ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
      ORDER BY r.lane_seq LIMIT v_left
    )
    SELECT array_agg(w.job_id ORDER BY w.lane_seq), array_agg(w.lane_seq ORDER BY w.lane_seq),
           -- 0036: key_digest(w.ckey) written out: the function is not inlined (convert_to is
           -- STABLE in an IMMUTABLE function), and a call per row cost ~10 µs of SQL-function setup
           array_agg(CASE WHEN w.ckey IS NOT NULL -- 0036
                          THEN sha256(convert_to('awa.concurrency-key.v1' || chr(31) || ':AWA_SCHEMA' || chr(31) || w.ckey, 'UTF8')) -- 0036
                     END ORDER BY w.lane_seq), -- 0036
           array_agg(w.at_claim ORDER BY w.lane_seq),
           array_agg(w.rw ORDER BY w.lane_seq) -- 0036
      INTO v_ids, v_seqs, v_digests, v_at_claim, v_rows -- 0036
    FROM w;
    CONTINUE WHEN v_ids IS NULL;
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
      -- in the slots that can hold a claim. Also the smallest key_seq among the open ones. (The
      -- closures' slot ranges are implied by x.slot = c.slot; written out, they let the executor
      -- open one closures child instead of sixteen.)
      SELECT coalesce(array_agg(g.n ORDER BY k.i), '{}'), -- 0036
             coalesce(array_agg(least(g.m, v_floor) ORDER BY k.i), '{}') -- 0036
        INTO v_new_held, v_new_hz -- 0036
      FROM unnest(v_new) WITH ORDINALITY k(d, i)
      LEFT JOIN LATERAL ( -- 0036
        SELECT count(*)::int AS n, min(o.s) AS m FROM ( -- 0036
          (SELECT c.key_seq AS s FROM claims c -- 0036
           WHERE c.key_policy = p_policy AND c.key_digest = k.d -- 0036
             AND (c.slot BETWEEN v_klo1 AND v_khi1 OR c.slot BETWEEN v_klo2 AND v_khi2) -- 0036
             AND c.key_seq >= coalesce((SELECT h.key_horizon FROM claims h -- 0036
                                        WHERE h.key_policy = p_policy AND h.key_digest = k.d AND h.key_seq IS NOT NULL -- 0036
                                          AND (h.slot BETWEEN v_klo1 AND v_khi1 OR h.slot BETWEEN v_klo2 AND v_khi2) -- 0036
                                        ORDER BY h.key_seq DESC LIMIT 1), 0) -- 0036
             AND NOT EXISTS (SELECT 1 FROM closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease AND x.slot = c.slot -- 0036
                               AND (x.slot BETWEEN v_klo1 AND v_khi1 OR x.slot BETWEEN v_klo2 AND v_khi2))) -- 0036
          UNION ALL -- 0036
          (SELECT NULL::bigint FROM claims c -- 0036
           WHERE c.key_policy = p_policy AND c.key_digest = k.d AND c.key_seq IS NULL -- 0036
             AND (c.slot BETWEEN v_klo1 AND v_khi1 OR c.slot BETWEEN v_klo2 AND v_khi2) -- 0036
             AND NOT EXISTS (SELECT 1 FROM closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease AND x.slot = c.slot -- 0036
                               AND (x.slot BETWEEN v_klo1 AND v_khi1 OR x.slot BETWEEN v_klo2 AND v_khi2))) -- 0036
          LIMIT v_limit) o -- 0036
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
    RETURN QUERY
    WITH picked AS MATERIALIZED (
      SELECT r.slot, r.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata,
             r.tags, r.errors, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.progress,
             v_digests[r.ordinality] AS digest, v_row_hz[r.ordinality] AS hz -- 0036
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
                          deadline_at, key_policy, key_digest, key_seq, key_horizon) -- 0036
      SELECT p.slot, p.generation, p.job_id, p.run_lease + 1, p.attempt + 1, p.queue, p.priority, p.shard, p.lane_seq,
             v_now, v_deadline, CASE WHEN p.digest IS NOT NULL THEN p_policy END, p.digest,
             CASE WHEN p.digest IS NOT NULL THEN v_floor END, p.hz -- 0036: NULL unless counted (active)
      FROM picked p
    )
    SELECT p.job_id, p.run_lease + 1, p.attempt + 1, p.max_attempts, p.kind, p.queue, p.priority, p.args, p.metadata,
           p.tags, p.errors, p.run_at, p.created_at, v_now, v_deadline, p.progress, NULL::text
    FROM picked p
    ORDER BY p.lane_seq;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    v_total := v_total + v_n;
    v_left := v_left - v_n;
  END LOOP;
  IF v_total = 0 AND (v_contended OR v_gated) THEN
    RETURN QUERY SELECT NULL::bigint, NULL::bigint, NULL::int, NULL::int, NULL::text, p_queue, NULL::smallint, NULL::jsonb,
                        NULL::jsonb, NULL::text[], NULL::jsonb, NULL::timestamptz, NULL::timestamptz, NULL::timestamptz,
                        NULL::timestamptz, NULL::jsonb,
                        CASE WHEN v_contended THEN 'keyLockContended' ELSE 'keyGated' END;
  END IF;
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim_keyed(text, text, int, bigint, bigint) FROM PUBLIC;

-- ---------------------------------------------------------------------------------------------
-- :AWA_SCHEMA.rescue: 0034's text, lines marked 0036.
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
  v_closed bigint[] := '{}'; -- 0036: the attempts closed here, to notify the keyed ones' queues
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
    v_closed := v_closed || v_row.j || v_row.l; -- 0036: (job, lease) pairs, flat
    job_id := v_row.j;
    run_lease := v_row.l;
    state := v_row.s;
    RETURN NEXT;
  END LOOP;
  -- 0036: a rescued keyed attempt freed a grant: wake its queue's gated claimers (at commit).
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q.queue) -- 0036
  FROM (SELECT DISTINCT c.queue FROM generate_series(1, cardinality(v_closed), 2) AS i(i) -- 0036
        JOIN claims c ON c.job_id = v_closed[i.i] AND c.run_lease = v_closed[i.i + 1] -- 0036
        WHERE c.key_policy IS NOT NULL) q; -- 0036
END
$function$;


-- ---------------------------------------------------------------------------------------------
-- :AWA_SCHEMA.cancel_job: 0027's text, lines marked 0036.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.cancel_job(p_job_id bigint, p_reason text)
 RETURNS text
 LANGUAGE plpgsql
 SET search_path TO ':AWA_SCHEMA', 'pg_catalog'
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
        PERFORM pg_notify('awa_cancel_:AWA_SCHEMA', p_job_id || ':' || v_job.run_lease);
        -- 0036: a cancelled keyed attempt freed a grant: wake its queue's gated claimers (at commit)
        PERFORM pg_notify('awa_wake_:AWA_SCHEMA', c.queue) FROM claims c -- 0036
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
$function$;

