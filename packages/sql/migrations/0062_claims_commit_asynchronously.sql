-- 0062: a claim commits asynchronously (issue 17: pickup latency on servers whose WAL flush is
-- slow, as a network volume's; docs/adr/0042-claims-commit-asynchronously.md).
--
-- A claim's commit waited for its WAL to reach disk (synchronous_commit on, the server default), and
-- the claimed jobs reached the worker only after it: on a server whose flush takes a millisecond (a
-- cloud volume) every pickup paid that millisecond once for the insert and once more for the claim.
-- The claim's durability buys nothing the delivery contract needs. A claim lost in a crash (its
-- commit not yet on disk) leaves its jobs available, as they were before it: they run again, which
-- at-least-once allows and a crash after a durable claim leads to as well (rescue). A later durable
-- commit flushes the WAL up to its own record, so no durable write (a completion, a cancel, a retry)
-- can outlive a claim it depends on: a completion of a lost claim is not durable either, or finds
-- no attempt after the restart and is answered stale. Visibility is unchanged: other sessions see the
-- claim's rows (its cursor, marks, spans, claims rows, grants) at its commit, as before.
--
-- claim and claim_keyed now set synchronous_commit to off for their own transaction, when it has
-- written nothing before them (pg_current_xact_id_if_assigned() IS NULL): the storage layer calls them
-- as a transaction of their own, and a caller that claims inside a transaction it wrote in keeps
-- its durability for the writes before the claim (writes after it in the same transaction commit
-- with it, asynchronously). claim_rated and claim_keyed_rated call them in their transaction, so
-- they commit asynchronously too: a rate bucket's tokens taken by a claim lost in a crash are taken
-- again after the restart (at most one claim's worth over the rate, once per crash). claim_resumed,
-- finalize, heartbeat, enqueue and every operator action keep the server's setting: a completion
-- acknowledged to a worker is on disk.
--
-- A function's SET clause is undone when the function returns, before its transaction commits, so
-- the setting is made with set_config(..., is_local => true): it lasts until the transaction ends.
--
-- Locks, guards and writes: unchanged (0061's text); only the lines marked 0062 are new.
--
-- Functions: claim and claim_keyed (0061's text), lines marked 0062.

-- claim: 0061's text, lines marked 0062.
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
    WITH cur AS MATERIALIZED (
      SELECT l.queue, l.priority, l.shard, coalesce(mk.c, 0) AS c -- 0042
      FROM lanes l
      LEFT JOIN LATERAL (SELECT m.next_lane_seq AS c FROM claim_marks m -- 0042
                         WHERE m.queue = l.queue AND m.priority = l.priority AND m.shard = l.shard -- 0042
                           AND (m.slot BETWEEN v_rlo1 AND v_rhi1 OR m.slot BETWEEN v_rlo2 AND v_rhi2) -- 0047
                         ORDER BY m.next_lane_seq DESC LIMIT 1) mk ON true -- 0042
      WHERE l.queue = p_queue
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
          AND (r.slot BETWEEN v_rlo1 AND v_rhi1 OR r.slot BETWEEN v_rlo2 AND v_rhi2) -- 0042: the live slots only
          AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                            AND (t.slot BETWEEN v_rlo1 AND v_rhi1 OR t.slot BETWEEN v_rlo2 AND v_rhi2)) -- 0042
        ORDER BY r.lane_seq LIMIT 1
      ) head
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
      CONTINUE WHEN NOT v_ordered AND NOT EXISTS (
        SELECT 1 FROM ready r
        WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k]
          AND r.lane_seq >= (SELECT coalesce(max(m.next_lane_seq), 0) FROM claim_marks m
                             WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k])
          AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                          WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq));
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
    -- Pick, mark and claim in one statement. The pick is a MATERIALIZED CTE, so its LIMIT
    -- cannot be merged away, and the rows returned are the picked rows themselves (no second
    -- lookup of `ready`); the claims rows carry the same values.
    RETURN QUERY
    WITH picked AS MATERIALIZED (
      SELECT r.slot, r.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata,
             r.tags, r.errors, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.progress, r.unique_key, r.unique_states -- 0022
      FROM ready r
      WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k] AND r.lane_seq >= v_cursor
        -- two ranges of scalar parameters: what partition pruning can use at executor start-up
        -- (it cannot use `slot = ANY (array parameter)`), so the other children are not opened
        AND (r.slot BETWEEN v_lo1 AND v_hi1 OR r.slot BETWEEN v_lo2 AND v_hi2)
        -- a tombstone lives in its ready row's slot. 0052: probed per row only when the lane has
        -- one at or past the cursor in these slots, which the first arm asks once (uncorrelated:
        -- an InitPlan, in this statement's snapshot); the common lane has none.
        AND (NOT EXISTS (SELECT 1 FROM ready_tombstones t0 -- 0052
                         WHERE t0.queue = p_queue AND t0.priority = v_prios[v_k] AND t0.shard = v_shards[v_k] -- 0052
                           AND t0.lane_seq >= v_cursor -- 0052
                           AND (t0.slot BETWEEN v_lo1 AND v_hi1 OR t0.slot BETWEEN v_lo2 AND v_hi2)) -- 0052
             OR NOT EXISTS (SELECT 1 FROM ready_tombstones t
                            WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                              AND (t.slot BETWEEN v_lo1 AND v_hi1 OR t.slot BETWEEN v_lo2 AND v_hi2))) -- 0052
        -- Paused, checked again in the pick's own snapshot: the check above ran in an earlier
        -- statement, and a job enqueued after a pause committed (seen here) must not be claimed.
        AND NOT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue AND m.paused)
        -- The lane's barrier (0021): its smallest parked position. Every parked row is at or past
        -- it, so the pick never takes a row while a smaller one of the lane is parked, and its
        -- mark never passes a parked row. Same statement, same snapshot as the pick.
        AND r.lane_seq < coalesce((SELECT p.lane_seq FROM parked p
                                   WHERE p.queue = p_queue AND p.priority = v_prios[v_k] AND p.shard = v_shards[v_k]
                                   ORDER BY p.lane_seq LIMIT 1), 9223372036854775807)
      ORDER BY r.lane_seq LIMIT v_left
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

-- claim_keyed: 0061's text, lines marked 0062.
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
  WITH cur AS MATERIALIZED (
    SELECT l.queue, l.priority, l.shard, coalesce(mk.c, 0) AS c -- 0042
    FROM lanes l
    LEFT JOIN LATERAL (SELECT m.next_lane_seq AS c FROM claim_marks m -- 0042
                       WHERE m.queue = l.queue AND m.priority = l.priority AND m.shard = l.shard -- 0042
                         AND (m.slot BETWEEN v_rlo1 AND v_rhi1 OR m.slot BETWEEN v_rlo2 AND v_rhi2) -- 0047
                       ORDER BY m.next_lane_seq DESC LIMIT 1) mk ON true -- 0042
    WHERE l.queue = p_queue
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
        AND (r.slot BETWEEN v_rlo1 AND v_rhi1 OR r.slot BETWEEN v_rlo2 AND v_rhi2) -- 0042: the live slots only
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          AND (t.slot BETWEEN v_rlo1 AND v_rhi1 OR t.slot BETWEEN v_rlo2 AND v_rhi2)) -- 0042
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
    WITH w AS MATERIALIZED (
      SELECT r AS rw, r.job_id, r.lane_seq, r.metadata ->> 'awa:concurrencyKey' AS ckey, -- 0036: rw
             (r.unique_key IS NOT NULL AND (r.unique_states & 6) = 4) AS at_claim
      FROM ready r
      WHERE r.queue = p_queue AND r.priority = v_prios[v_k] AND r.shard = v_shards[v_k] AND r.lane_seq >= v_cursor
        AND (r.slot BETWEEN v_lo1 AND v_hi1 OR r.slot BETWEEN v_lo2 AND v_hi2)
        -- 0052: per row only when the lane has a tombstone at or past the cursor (as claim's pick)
        AND (NOT EXISTS (SELECT 1 FROM ready_tombstones t0 -- 0052
                         WHERE t0.queue = p_queue AND t0.priority = v_prios[v_k] AND t0.shard = v_shards[v_k] -- 0052
                           AND t0.lane_seq >= v_cursor -- 0052
                           AND (t0.slot BETWEEN v_lo1 AND v_hi1 OR t0.slot BETWEEN v_lo2 AND v_hi2)) -- 0052
             OR NOT EXISTS (SELECT 1 FROM ready_tombstones t
                            WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                              AND (t.slot BETWEEN v_lo1 AND v_hi1 OR t.slot BETWEEN v_lo2 AND v_hi2))) -- 0052
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
