-- 0066: the multi-lane ranking reads the lanes' heads slot by slot (issue 17; ADR 0044, as 0063
-- and 0065 did for the pick and the busy-lane probe).
--
-- A claim of a queue with several lanes (priorities in use, or enqueue shards, ADR 0034) first
-- ranks the lanes that have a claimable head. Each lane's head was read through the `ready` and
-- `ready_tombstones` parents, bounded to the live slots by parameters: a generic plan over
-- thirty-two children, planned in every claimer's backend and again after every prune, with
-- ACCESS SHARE on all of them at every call (as 0063 found for the pick).
--
-- Now the lanes' cursors are read into arrays first, and each live slot answers the first
-- claimable row of every lane in it through its own function, lane_heads_<slot> (one statement
-- over that slot's children, made from one template like lane_picks_<slot>; lane_heads_in_slot
-- chooses by slot); a lane's head is the first of its rows in lane order, and the ranking orders
-- those. One call per live slot, not per lane and slot: lane_picks_in_slot per lane cost an
-- 8-shard claim(1) ~200 µs more warm (16 calls), measured before this was written.
--
-- Same answer as before: the same rows (from the cursor, not tombstoned, in the live slots), no
-- parked barrier (as before; the pick applies it), the same ordering expression.
--
-- Locks: ACCESS SHARE on the live slots' ready and ready_tombstones children instead of on all
-- thirty-two. Guards and writes: unchanged (the ranking writes nothing).
--
-- Functions: lane_heads_<slot> (new, one per queue-ring slot), lane_heads_in_slot (new), claim
-- (0065's text, lines marked 0066).

DO $do$
DECLARE
  s int;
  v_branches text := '';
BEGIN
  FOR s IN 0 .. :AWA_SCHEMA.ring_slots('queue') - 1 LOOP
    -- The first claimable row, in lane order from its cursor, of each lane of one queue in one
    -- slot: not tombstoned (the per-row probe bounded from both sides, as in lane_picks_<slot>,
    -- 0063). Like the ranking's read it replaces, it does not stop at a parked barrier: a lane
    -- ranked by a row behind one is answered by its pick, which does. STABLE: reads only; no SET
    -- clauses: called from claim, whose settings apply.
    EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.%2$I(p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
  RETURNS %1$I.ready[]
  LANGUAGE plpgsql STABLE
AS $function$
BEGIN
  RETURN ARRAY(
    SELECT ROW(h.*)::%1$I.ready
    FROM unnest(p_priorities, p_shards, p_from) AS l(priority, shard, c)
    CROSS JOIN LATERAL (
      SELECT r.* FROM %1$I.%3$I r
      WHERE r.queue = p_queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
        AND NOT EXISTS (SELECT 1 FROM %1$I.%4$I t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                          AND t.lane_seq >= r.lane_seq AND t.lane_seq <= r.lane_seq)
      ORDER BY r.lane_seq LIMIT 1) h);
END
$function$
$f$, ':AWA_SCHEMA', 'lane_heads_' || s, 'ready_' || s, 'ready_tombstones_' || s);
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.%I(text, smallint[], smallint[], bigint[]) FROM PUBLIC',
                   ':AWA_SCHEMA', 'lane_heads_' || s);
    v_branches := v_branches || format(' WHEN %s THEN %I.%I(p_queue, p_priorities, p_shards, p_from)',
                                       s, ':AWA_SCHEMA', 'lane_heads_' || s);
  END LOOP;
  -- The slot's function, by the slot (an inlined SQL CASE, as lane_picks_in_slot).
  EXECUTE format($f$
CREATE OR REPLACE FUNCTION %1$I.lane_heads_in_slot(p_slot int, p_queue text, p_priorities smallint[], p_shards smallint[], p_from bigint[])
  RETURNS %1$I.ready[]
  LANGUAGE sql STABLE
AS $function$ SELECT CASE p_slot%2$s END $function$
$f$, ':AWA_SCHEMA', v_branches);
  EXECUTE format('REVOKE EXECUTE ON FUNCTION %I.lane_heads_in_slot(int, text, smallint[], smallint[], bigint[]) FROM PUBLIC',
                 ':AWA_SCHEMA');
END
$do$;

-- claim: 0065's text, lines marked 0066.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.claim(p_queue text, p_max integer, p_deadline_ms bigint, p_aging_ms bigint)
 RETURNS TABLE(job_id bigint, run_lease bigint, attempt integer, max_attempts integer, kind text, queue text, priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb, run_at timestamp with time zone, created_at timestamp with time zone, claimed_at timestamp with time zone, deadline_at timestamp with time zone, progress jsonb)
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
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) FROM PUBLIC;
