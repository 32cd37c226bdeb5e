-- 0067: claim_keyed reads the ring slot by slot (issue 17; ADR 0044, as 0063, 0065 and 0066 did
-- for claim).
--
-- claim_keyed (a queue under a key policy, ADR 0029) read `ready` and `ready_tombstones` through
-- their partitioned parents in three statements: the ranking of a queue's several lanes, the
-- busy-lane probe and the window (the rows it may admit, up to 64). Each generic plan covered all
-- sixteen children of each parent (the probe forty-eight, with `claim_marks`), planned in every
-- claimer's backend and again after every prune, all of them locked at every call. Now:
--
-- - the ranking reads the lanes' cursors into arrays and the heads through lane_heads_in_slot,
--   one call per live slot (0066's);
-- - the busy-lane probe reads the cursor in the live slots and the head through
--   lane_picks_in_slot, oldest live slot first (0065's);
-- - the window reads each live slot through lane_picks_in_slot (0063's pick: tombstones, the
--   parked barrier), merged in lane order and cut to the limit when more than one slot answers;
--   the pause check moves from the read into the statement over the merged rows.
--
-- Snapshots: as 0063's header argues for claim's pick. The window's reads run after this lane's
-- claim lock and the cursor statement (ACCESS SHARE on every claim_marks child, held to commit),
-- so each sees the lane up to some position and the merge is a gap-free run from the cursor.
--
-- Locks: ACCESS SHARE on the live slots' ready and ready_tombstones children instead of on all of
-- them. Guards and writes: unchanged (the key locks, the count, the admission, marks, claims rows,
-- spans and grants of 0062's text, from the same rows).
--
-- Functions: claim_keyed (0062's text, lines marked 0067).

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
                          THEN sha256(convert_to('awa.concurrency-key.v1' || chr(31) || ':AWA_SCHEMA' || chr(31) || w.ckey, 'UTF8')) -- 0036
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
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim_keyed(text, text, int, bigint, bigint) FROM PUBLIC;
