-- 0041: claim_keyed says why it stopped short when it claimed something (issue 20, ADR 0029
-- "Closure wake-ups").
--
-- claim_keyed: 0036's text, lines marked "0041". The claimed rows of every lane are collected
-- and returned once, after the last lane, and each carries in `gate` why the call stopped short
-- of its window: 'keyGated' (a key at its limit, or the policy draining) or 'keyLockContended'
-- (a key's lock held by another claimer), else NULL. Before, a call that claimed some rows and
-- then stopped at a gated key returned no sign of it, so a worker could not tell a queue that
-- ran out from one waiting for a grant, and claimed again on every closure announcement.
--
-- Compatible with workers older than this: they take the gate only from a first row without a
-- job (the call claimed nothing, unchanged) and ignore the column on job rows.
--
-- Locks, guards and writes: unchanged (the same statements insert the same claim marks and
-- claims rows, per lane, in the same order; only the rows returned move to the end). Rows come
-- back in the same order: lane by lane, each lane's by position.

-- :AWA_SCHEMA.claim_keyed: 0036's text, lines marked 0041.
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
  v_out ready[] := '{}'; -- 0041: the claimed rows of every lane, returned once at the end
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
    WITH picked AS MATERIALIZED ( -- 0041: counted here, returned at the end
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
    SELECT count(*)::int INTO v_n FROM picked; -- 0041
    v_out := v_out || v_rows[1:v_admit]; -- 0041: in lane order, each lane's rows by position
    v_total := v_total + v_n;
    v_left := v_left - v_n;
  END LOOP;
  -- 0041: the claimed rows, each carrying why the call stopped short of its window if it did (a
  -- key at its limit, or one whose lock another claimer held); NULL otherwise.
  IF v_total > 0 THEN -- 0041
    RETURN QUERY -- 0041
    SELECT r.job_id, r.run_lease + 1, r.attempt + 1, r.max_attempts, r.kind, r.queue, r.priority, r.args, r.metadata, -- 0041
           r.tags, r.errors, r.run_at, r.created_at, v_now, v_deadline, r.progress, -- 0041
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
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim_keyed(text, text, int, bigint, bigint) FROM PUBLIC;
