-- 0053: a claim call records its claims' times once, in claim_spans; the claims rows' two
-- timestamp indexes go (issue 17: the claim is the drain's critical path; docs/adr/0014, update
-- of 2026-12-04, and docs/adr/0039-claim-spans.md).
--
-- Every claims row carried two B-tree entries, claimed_at and deadline_at, and a claim call gives
-- all its rows the same two values: 1.6 µs a row, 28 % of claim(200) in one backend. Their only
-- readers were rescue's stale and deadline sweeps and prune's young-attempt tests. Now a claim
-- writes one claim_spans row per slot its claimed rows lie in: the lane, the first and last
-- position it claimed there, the claim time and the deadline, indexed on those two times. The
-- claims rows keep both columns (unindexed); every reader filters on the claim's own values, so a
-- span only has to cover its claims, and may cover more.
--
-- From a span to its claims: the lane's ready rows of the span's slot with positions in its range
-- (ready's primary key), then their claims by primary key (job_id, ready's run_lease + 1, slot):
-- a claims row lies in its ready row's slot with the ready row's lease + 1, and prune carries an
-- open claim with its ready row into the current slot, unchanged. A range may hold rows that are
-- not this call's claims: rows tombstoned, rows claimed at claim by the unique-key statement (it
-- writes its own span), rows of another call when ranges overlap; the filters on the claims' own
-- columns and the closures decide, as before.
--
-- Writers of claims rows and their spans, in the same statement or under the same locks:
--   claim: the pick (rows not taken at claim) and the keys-at-claim statement, a span each, per slot;
--   claim_keyed: the admitted prefix, a span per slot;
--   prune_queue (the 8-argument and the 4-argument overloads, the two that carry): the carried open
--   claims, a span per lane and claim time in the current slot (a call's claims share their times).
-- claim_resumed writes no claims row. The 5-argument overload of prune_queue (0027's, for workers of
-- an earlier build) only reads claims.claimed_at: it now scans the slot's claims for it.
--
-- Readers: rescue('stale') and rescue('deadline') first sum the sizes of the spans whose time is
-- past (their index, at most 1,001 spans read). Up to 1,000 claims (the usual sweep finds none and
-- returns there): from those spans, joined as above in that order by nested loops (settings around
-- the statement), one candidate per attempt where spans overlap. More: 0050's statement, which
-- scans claims and anti-joins closures as the planner chooses (what it did whenever the claimed_at
-- index was not worth reading; in one backend ~0.4 µs per live claim, against ~6 µs per claim
-- through the spans' probes, docs/benchmarks.md "Claim spans"). prune_queue's two young-attempt
-- tests start from the slot's newest spans.
--
-- Also fixed here: prune_queue spelled the default schema's name in its three dynamic statements
-- since 0039 (LOCK and TRUNCATE of the slot's children, the terminal count): in a schema with
-- another name it failed on every tick, or, where a schema named awa also held an install, locked
-- and truncated that install's slot. It uses :AWA_SCHEMA again, as 0033's text did.
--
-- Locks, guards and writes: the migration holds ACCESS EXCLUSIVE on claims (and its children)
-- from its first statement: a claim in flight commits before it, none starts until it commits, so
-- the spans written from the existing claims cover every claims row. claim_spans is a ring table
-- (a child per slot, append-only, locked and truncated with the slot by prune_queue, listed for
-- end_idle_blockers); its writers hold ROW EXCLUSIVE on it where they already held it on claims.
-- A forced prune queues for the claim_spans parent too, between claim_marks and claims: rescue now
-- reads claim_spans (and its children) in a statement before any that reads claims, so without it
-- a sweep could wait for the claims parent holding a claim_spans child, and a prune that holds
-- claim_spans before claims could wait for a sweep that waits for it. In that order every session
-- takes them: a claim holds claim_marks (its cursor) before it writes claims and claim_spans, a
-- sweep claim_spans before claims, every other reader claims alone.
--
-- Functions (lines marked 0053): claim, claim_keyed (0052's text), rescue (0050's text),
-- prune_queue 8 arguments (0048's text), prune_queue 4 arguments (0033's text),
-- end_idle_blockers (0021's text).

LOCK TABLE :AWA_SCHEMA.claims IN ACCESS EXCLUSIVE MODE;

CREATE TABLE :AWA_SCHEMA.claim_spans (
  slot           int         NOT NULL,
  generation     bigint      NOT NULL,
  queue          text        NOT NULL,
  priority       smallint    NOT NULL,
  shard          smallint    NOT NULL,
  first_lane_seq bigint      NOT NULL,
  last_lane_seq  bigint      NOT NULL,
  claimed_at     timestamptz NOT NULL,
  deadline_at    timestamptz
) PARTITION BY LIST (slot);
CREATE INDEX ON :AWA_SCHEMA.claim_spans (claimed_at);
CREATE INDEX ON :AWA_SCHEMA.claim_spans (deadline_at) WHERE deadline_at IS NOT NULL;

DO $$
DECLARE
  s int;
BEGIN
  FOR s IN 0 .. :AWA_SCHEMA.ring_slots('queue') - 1 LOOP
    EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.claim_spans FOR VALUES IN (%s)', ':AWA_SCHEMA', 'claim_spans_' || s, ':AWA_SCHEMA', s);
  END LOOP;
END
$$;
REVOKE ALL ON :AWA_SCHEMA.claim_spans FROM PUBLIC;

-- The claims already written: a span per slot, lane and claim time.
INSERT INTO :AWA_SCHEMA.claim_spans (slot, generation, queue, priority, shard, first_lane_seq, last_lane_seq, claimed_at, deadline_at)
SELECT c.slot, c.generation, c.queue, c.priority, c.shard, min(c.lane_seq), max(c.lane_seq), c.claimed_at, c.deadline_at
FROM :AWA_SCHEMA.claims c
GROUP BY c.slot, c.generation, c.queue, c.priority, c.shard, c.claimed_at, c.deadline_at;

DROP INDEX :AWA_SCHEMA.claims_claimed_at_idx;
DROP INDEX :AWA_SCHEMA.claims_deadline_at_idx;

-- claim: 0052's text, lines marked 0053.
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
      INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at)
      SELECT p.slot, p.generation, p.job_id, p.run_lease + 1, p.attempt + 1, p.queue, p.priority, p.shard, p.lane_seq,
             v_now, v_deadline
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
    SELECT p.job_id, p.run_lease + 1, p.attempt + 1, p.max_attempts, p.kind, p.queue, p.priority, p.args, p.metadata,
           p.tags, p.errors, p.run_at, p.created_at, v_now, v_deadline, p.progress /* 0022 */
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
      INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at)
      SELECT s.slot, s.generation, s.job_id, s.run_lease + 1, s.attempt + 1, s.queue, s.priority, s.shard, s.lane_seq,
             v_now, v_deadline
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
    SELECT s.job_id, s.run_lease + 1, s.attempt + 1, s.max_attempts, s.kind, s.queue, s.priority, s.args, s.metadata,
           s.tags, s.errors, s.run_at, s.created_at, v_now, v_deadline, s.progress
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

-- claim_keyed: 0052's text, lines marked 0053.
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

-- rescue: 0050's text, lines marked 0053.
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
  v_reach bigint; -- 0053: the claims the past spans can cover, counted up to v_span_path_max + 1
  v_span_path_max constant int := 1000; -- 0053: up to this many, the claims are found from their spans
  v_saved_hashjoin text := current_setting('enable_hashjoin'); -- 0053
  v_saved_mergejoin text := current_setting('enable_mergejoin'); -- 0053
  v_saved_collapse text := current_setting('join_collapse_limit'); -- 0053
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'rescue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF p_kind = 'stale' THEN
    -- 0053: the claims older than the cutoff, by one of two statements. Few (the usual sweep:
    -- none): from their spans, a span's lane positions in its slot's ready rows, then their claims
    -- by primary key (the claim has the ready row's lease + 1), in the order written and by nested
    -- loops (the settings around it), each probe reading one row. Many (a slot kept long, a
    -- backlog drained slowly): from the claims themselves, as 0050 read them when its claimed_at
    -- index was not worth a scan (a scan of claims and an anti-join the planner chooses), which
    -- costs about a microsecond per claim in the live slots against several per claim for the probes.
    SELECT coalesce(sum(x.n), 0) INTO v_reach -- 0053
    FROM (SELECT s.last_lane_seq - s.first_lane_seq + 1 AS n FROM claim_spans s -- 0053
          WHERE s.claimed_at < v_cutoff LIMIT v_span_path_max + 1) x; -- 0053
    IF v_reach = 0 THEN -- 0053
      RETURN; -- 0053
    ELSIF v_reach <= v_span_path_max THEN -- 0053
      PERFORM set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true), -- 0053
              set_config('join_collapse_limit', '1', true); -- 0053
      -- Spans may overlap (claim's keys-at-claim span lies inside its pick's): one candidate per attempt.
      WITH cand AS ( -- 0053
        SELECT DISTINCT ON (c.claimed_at, c.job_id, c.run_lease) c.job_id, c.run_lease, c.attempt -- 0053
        FROM claim_spans s -- 0053
        JOIN ready r ON r.slot = s.slot AND r.queue = s.queue AND r.priority = s.priority AND r.shard = s.shard -- 0053
                    AND r.lane_seq BETWEEN s.first_lane_seq AND s.last_lane_seq -- 0053
        JOIN claims c ON c.job_id = r.job_id AND c.run_lease = r.run_lease + 1 AND c.slot = r.slot -- 0053
        LEFT JOIN attempt_state a ON a.job_id = c.job_id AND a.run_lease = c.run_lease -- 0053
        WHERE s.claimed_at < v_cutoff -- 0053
          AND c.claimed_at < v_cutoff AND (a.heartbeat_at IS NULL OR a.heartbeat_at < v_cutoff) -- 0053
          AND NOT (coalesce(a.callback_waiting, false) AND a.callback_state = 'pending') -- 0053 (0034)
          AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.slot = c.slot) -- 0053
        ORDER BY c.claimed_at, c.job_id, c.run_lease LIMIT p_limit -- 0053: DISTINCT ON's order
      ) -- 0053
      SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry', -- 0053
               'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'heartbeat stale: worker presumed dead', -- 0053
               'reason', 'stale_heartbeat', 'stale_before', v_cutoff)) -- 0053
        INTO v_items FROM cand; -- 0053
      PERFORM set_config('enable_hashjoin', v_saved_hashjoin, true), set_config('enable_mergejoin', v_saved_mergejoin, true), -- 0053
              set_config('join_collapse_limit', v_saved_collapse, true); -- 0053
    ELSE -- 0053
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
    END IF; -- 0053
  ELSIF p_kind = 'callback' THEN -- 0034
    -- 0040: no pending callback is past its timeout (the usual answer): return before the two
    -- statements below are planned (claims and closures, 16 children each).
    IF NOT EXISTS (SELECT 1 FROM attempt_state a -- 0040
                   WHERE a.callback_state = 'pending' AND a.callback_timeout_at < now()) THEN -- 0040
      RETURN; -- 0040
    END IF; -- 0040
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
    -- 0053: the claims past their deadline, by one of two statements as above
    SELECT coalesce(sum(x.n), 0) INTO v_reach -- 0053
    FROM (SELECT s.last_lane_seq - s.first_lane_seq + 1 AS n FROM claim_spans s -- 0053
          WHERE s.deadline_at < now() LIMIT v_span_path_max + 1) x; -- 0053
    IF v_reach = 0 THEN -- 0053
      RETURN; -- 0053
    ELSIF v_reach <= v_span_path_max THEN -- 0053
      PERFORM set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true), -- 0053
              set_config('join_collapse_limit', '1', true); -- 0053
      WITH cand AS ( -- 0053
        SELECT DISTINCT ON (c.deadline_at, c.job_id, c.run_lease) c.job_id, c.run_lease, c.attempt -- 0053
        FROM claim_spans s -- 0053
        JOIN ready r ON r.slot = s.slot AND r.queue = s.queue AND r.priority = s.priority AND r.shard = s.shard -- 0053
                    AND r.lane_seq BETWEEN s.first_lane_seq AND s.last_lane_seq -- 0053
        JOIN claims c ON c.job_id = r.job_id AND c.run_lease = r.run_lease + 1 AND c.slot = r.slot -- 0053
        WHERE s.deadline_at < now() -- 0053
          AND c.deadline_at < now() -- 0053
          AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease AND z.slot = c.slot) -- 0053
          AND NOT EXISTS (SELECT 1 FROM attempt_state a WHERE a.job_id = c.job_id AND a.run_lease = c.run_lease -- 0053 (0034)
                            AND a.parked_at IS NOT NULL) -- 0053 (0034)
        ORDER BY c.deadline_at, c.job_id, c.run_lease LIMIT p_limit -- 0053: DISTINCT ON's order
      ) -- 0053
      SELECT jsonb_agg(jsonb_build_object('job_id', cand.job_id, 'run_lease', cand.run_lease, 'outcome', 'retry', -- 0053
               'delay_ms', backoff_ms(cand.attempt, random()), 'message', 'hard deadline exceeded', -- 0053
               'reason', 'deadline_exceeded')) -- 0053
        INTO v_items FROM cand; -- 0053
      PERFORM set_config('enable_hashjoin', v_saved_hashjoin, true), set_config('enable_mergejoin', v_saved_mergejoin, true), -- 0053
              set_config('join_collapse_limit', v_saved_collapse, true); -- 0053
    ELSE -- 0053
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
    END IF; -- 0053
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
  -- 0050: and those of every queue under its key policy, in every process; one read of the
  -- claims (a pair's queue or policy repeated is one notification: Postgres folds identical ones)
  PERFORM pg_notify('awa_wake_:AWA_SCHEMA', q.queue), -- 0050
          pg_notify('awa_cancel_:AWA_SCHEMA', 'key-closed:' || q.key_policy) -- 0050
  FROM (SELECT DISTINCT c.queue, c.key_policy FROM generate_series(1, cardinality(v_closed), 2) AS i(i) -- 0050
        JOIN claims c ON c.job_id = v_closed[i.i] AND c.run_lease = v_closed[i.i + 1] -- 0036
        WHERE c.key_policy IS NOT NULL) q; -- 0036
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.rescue(text, bigint, int) FROM PUBLIC;

-- prune_queue, 8 arguments: 0048's text, lines marked 0053.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.prune_queue(p_lock_timeout_ms integer, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint, p_carry_after_ms bigint, p_force_timeout_ms integer, p_carry_rows integer, p_end_idle_ms bigint)
 RETURNS TABLE(outcome text, generation bigint, carried integer, moved integer, parked integer)
 LANGUAGE plpgsql
 SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off
AS $$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots('queue');
  v_cur record;
  v_hist record;
  v_old bigint;
  v_slot int;
  v_attempt record;
  v_open_claims claims[];
  v_open_ready ready[];
  v_kept history[];
  v_copy record;
  v_copied boolean;
  v_count bigint;
  -- 0048: below this many terminal rows, judging into an array and inserting under the lock costs
  -- less than a second commit; from it on, a slot with no open attempt is copied ahead in one statement
  v_copy_ahead_rows constant int := 1000;
  v_lane_head int := greatest(1, p_carry_rows / 2);
  v_rollup jsonb;
  v_keys jsonb;
  v_children text;
  v_deadline timestamptz;
  v_forced boolean := p_force_timeout_ms > 0;
  v_timeout int := CASE WHEN p_force_timeout_ms > 0 THEN p_force_timeout_ms ELSE p_lock_timeout_ms END;
  v_moved int := 0;
  v_parked int := 0;
  v_locked boolean := false;
  v_saved_timeout text := current_setting('lock_timeout');
  v_saved_nestloop text := current_setting('enable_nestloop');
  v_saved_sort text := current_setting('enable_sort'); -- 0040
  v_young boolean; -- 0040
  v_all_closed boolean; -- 0044: every claim of the slot has its closure
  v_copied_rows bigint; -- 0048: history rows the one-statement copy wrote
  v_newest record; -- 0048: the slot's newest claim in the carry window
  v_saved_seqscan text := current_setting('enable_seqscan'); -- 0048
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'prune_queue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext('queue')) THEN
    RETURN QUERY SELECT 'Blocked:busy', NULL::bigint, 0, 0, 0;
    RETURN;
  END IF;
  SELECT * INTO v_cur FROM ring_current('queue');
  SELECT min(g.g) INTO v_old
  FROM generate_series(greatest(0, v_cur.generation - v_n + 1), v_cur.generation - 1) AS g(g)
  WHERE NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = g.g);
  IF v_old IS NULL THEN
    RETURN QUERY SELECT 'Noop', NULL::bigint, 0, 0, 0;
    RETURN;
  END IF;
  v_slot := (v_old % v_n)::int;

  -- 0048: the cheap answer first. A slot still being drained (its backlog sealed by a rotation)
  -- has its newest claim open and young: that alone is the answer the test below would reach
  -- (newest first), without counting the slot's claims and closures (two scans of up to every
  -- row, 45-80 ms a tick for a 100,000-job slot). Index probes only, newest first: the children's
  -- statistics may be those of an empty table, and a scan or sort of a large one is what this avoids.
  IF p_carry_after_ms > 0 THEN -- 0048
    PERFORM set_config('enable_seqscan', 'off', true); -- 0048
    PERFORM set_config('enable_sort', 'off', true); -- 0048: the claimed_at index, newest first
    -- 0053: the newest claim span's last claim (a span's claims share its time; of one call's
    -- claims, the last position is the one a worker reaches last)
    SELECT o.job_id, o.run_lease INTO v_newest -- 0053
    FROM claim_spans s -- 0053
    CROSS JOIN LATERAL (SELECT c.job_id, c.run_lease FROM ready r -- 0053
                        JOIN claims c ON c.job_id = r.job_id AND c.run_lease = r.run_lease + 1 AND c.slot = v_slot -- 0053
                        WHERE r.slot = v_slot AND r.queue = s.queue AND r.priority = s.priority AND r.shard = s.shard -- 0053
                          AND r.lane_seq BETWEEN s.first_lane_seq AND s.last_lane_seq -- 0053
                        ORDER BY r.lane_seq DESC LIMIT 1) o -- 0053
    WHERE s.slot = v_slot AND s.claimed_at > now() - p_carry_after_ms * interval '1 millisecond' -- 0053
    ORDER BY s.claimed_at DESC LIMIT 1; -- 0053
    v_young := FOUND AND NOT EXISTS (SELECT 1 FROM closures z -- 0048
                                     WHERE z.slot = v_slot AND z.job_id = v_newest.job_id AND z.run_lease = v_newest.run_lease);
    PERFORM set_config('enable_seqscan', v_saved_seqscan, true); -- 0048
    PERFORM set_config('enable_sort', v_saved_sort, true); -- 0048
    IF v_young THEN -- 0048
      RETURN QUERY SELECT 'Blocked:young_attempts', v_old, 0, 0, 0;
      RETURN;
    END IF;
  END IF; -- 0048

  -- 0044: are all the slot's attempts closed? Counted, not anti-joined (see the header): when
  -- they are, there is nothing young to wait for and nothing to lock, and the two anti-joins
  -- below (each a probe of closures per claim, 20-80 ms for a 20,000-claim slot) are skipped.
  SELECT (SELECT count(*) FROM claims c WHERE c.slot = v_slot) = (SELECT count(*) FROM closures z WHERE z.slot = v_slot) -- 0044
    INTO v_all_closed; -- 0044
  IF NOT v_all_closed THEN -- 0044
  -- An attempt claimed moments ago will most likely close by itself (0014).
  -- 0040: newest claim first, the first open one answers. Unordered, the EXISTS walked the
  -- window from its oldest claim, and in a slot being drained those are all closed: a probe of
  -- closures per claim of the last p_carry_after_ms (57-100 ms per prune tick in a 20,000-job
  -- drain), every tick until the drain ended. The newest claims are the open ones.
  -- A scalar subquery, not EXISTS: the planner drops an EXISTS subquery's ORDER BY and LIMIT.
  -- Sorting off while it is planned: a sort would take the anti-join's every row first (the
  -- planner picks one when the slot's child has no statistics yet).
  PERFORM set_config('enable_sort', 'off', true); -- 0040
  v_young := p_carry_after_ms > 0 AND coalesce(( -- 0040
    SELECT true FROM claim_spans s -- 0053: the claims by their spans, newest span first
    CROSS JOIN LATERAL (SELECT 1 FROM ready r -- 0053
                        JOIN claims c ON c.job_id = r.job_id AND c.run_lease = r.run_lease + 1 AND c.slot = v_slot -- 0053
                        WHERE r.slot = v_slot AND r.queue = s.queue AND r.priority = s.priority AND r.shard = s.shard -- 0053
                          AND r.lane_seq BETWEEN s.first_lane_seq AND s.last_lane_seq -- 0053
                          AND c.claimed_at > now() - p_carry_after_ms * interval '1 millisecond' -- 0053
                          AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
                        ORDER BY r.lane_seq DESC LIMIT 1) o -- 0053
    WHERE s.slot = v_slot AND s.claimed_at > now() - p_carry_after_ms * interval '1 millisecond' -- 0053
    ORDER BY s.claimed_at DESC LIMIT 1 -- 0040
  ), false);
  PERFORM set_config('enable_sort', v_saved_sort, true); -- 0040
  IF v_young THEN -- 0040
    RETURN QUERY SELECT 'Blocked:young_attempts', v_old, 0, 0, 0;
    RETURN;
  END IF;
  -- 0028: the open attempts' claims rows, tried FOR UPDATE NOWAIT, where each attempt's advisory
  -- lock was tried (one lock-table entry per open attempt; 100k open attempts failed): a
  -- finalizer or heartbeat holding one makes us back off; holding them, none can write for these
  -- attempts until we commit. A row lock taken in the block is released if it fails
  -- (sub-transaction), kept if it succeeds.
  BEGIN -- 0028
    PERFORM 1 FROM claims c
    WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
    ORDER BY c.job_id, c.run_lease
    FOR UPDATE OF c NOWAIT;
  EXCEPTION WHEN lock_not_available THEN -- 0028
    RETURN QUERY SELECT 'Blocked:locked_attempt', v_old, 0, 0, 0;
    RETURN;
  END;
  END IF; -- 0044

  v_children := format('%1$I.ready_%2$s, %1$I.ready_tombstones_%2$s, %1$I.claims_%2$s, %1$I.claim_marks_%2$s, %1$I.closures_%2$s, %1$I.terminal_%2$s, %1$I.claim_spans_%2$s', -- 0053
                       ':AWA_SCHEMA', v_slot); -- 0053: the schema's name (0039-0048 spelled the default one)
  -- Freeze the slot (SHARE: waits out writers, keeps new ones out, blocks no reader).
  BEGIN
    PERFORM set_config('lock_timeout', v_timeout || 'ms', true);
    EXECUTE 'LOCK TABLE ' || v_children || ' IN SHARE MODE';
  EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
    IF v_forced AND p_end_idle_ms > 0 THEN
      PERFORM end_idle_blockers(v_slot, p_end_idle_ms);
    END IF;
    RETURN QUERY SELECT 'Blocked:lock', v_old, 0, 0, 0;
    RETURN;
  END;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);

  -- Open attempts: claims without a closure (ours since the tried locks, or claimed after them
  -- from rows that arrived late; either way their finalizers need the slot, which is frozen).
  -- 0044: counted again first (the slot is frozen now: the counts hold until we commit); the
  -- anti-join only when some attempt is open.
  SELECT (SELECT count(*) FROM claims c WHERE c.slot = v_slot) = (SELECT count(*) FROM closures z WHERE z.slot = v_slot) -- 0044
    INTO v_all_closed; -- 0044
  IF NOT v_all_closed THEN -- 0044
  SELECT array_agg(c) INTO v_open_claims FROM claims c
  WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease);
  END IF; -- 0044
  IF v_open_claims IS NOT NULL THEN
    SELECT array_agg(r) INTO v_open_ready
    FROM unnest(v_open_claims) o
    JOIN ready r ON r.slot = v_slot AND r.queue = o.queue AND r.priority = o.priority AND r.shard = o.shard AND r.lane_seq = o.lane_seq;
  END IF;

  -- The terminal rows: judged here, or already copied ahead by an earlier call (0013).
  SELECT * INTO v_copy FROM history_copies hc WHERE hc.generation = v_old;
  v_copied := FOUND;
  IF v_copied THEN
    EXECUTE format('SELECT count(*) FROM %I.terminal_%s', ':AWA_SCHEMA', v_slot) INTO v_count;
  END IF;
  IF v_copied AND v_count = v_copy.terminal_rows THEN
    v_rollup := v_copy.rollup;
    v_keys := v_copy.keys;
  -- 0048: a large slot with no open attempt, not copied yet: judged and copied in one statement
  ELSIF NOT v_copied AND v_open_claims IS NULL -- 0048
        AND (SELECT count(*) FROM (SELECT FROM terminal t WHERE t.slot = v_slot LIMIT v_copy_ahead_rows) s) >= v_copy_ahead_rows THEN -- 0048
    PERFORM set_config('enable_nestloop', 'off', true); -- 0048
    SELECT * INTO v_hist FROM ring_current('history'); -- 0048
    WITH judged AS MATERIALIZED ( -- 0048: 0039's wide and judged, in one step (nothing is in history yet)
      SELECT t.job_id, t.run_lease, t.state, t.attempt, coalesce(t.max_attempts, r.max_attempts) AS max_attempts,
             coalesce(t.kind, r.kind) AS kind, coalesce(t.queue, r.queue) AS queue, coalesce(t.priority, r.priority) AS priority,
             coalesce(t.args, r.args) AS args, coalesce(t.metadata, r.metadata) AS metadata, coalesce(t.tags, r.tags) AS tags,
             coalesce(t.errors, r.errors) AS errors, t.progress, coalesce(t.run_at, r.run_at) AS run_at,
             coalesce(t.created_at, r.created_at) AS created_at, t.finalized_at,
             coalesce(t.unique_key, r.unique_key) AS unique_key, coalesce(t.unique_states, r.unique_states, 0) AS unique_states,
             t.finalized_at > now() - CASE t.state
                                        WHEN 'completed' THEN coalesce(m.completed_retention, p_completed_ms * interval '1 millisecond')
                                        WHEN 'failed' THEN coalesce(m.failed_retention, p_failed_ms * interval '1 millisecond')
                                        ELSE coalesce(m.cancelled_retention, p_cancelled_ms * interval '1 millisecond') END AS keep
      FROM terminal t
      LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
      LEFT JOIN queue_meta m ON m.queue = coalesce(t.queue, r.queue)
      WHERE t.slot = v_slot
    ),
    copied AS ( -- 0048: the kept rows, straight from the judging
      INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                           metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
      SELECT v_hist.slot, v_hist.generation, j.job_id, j.run_lease, j.state, j.attempt, j.max_attempts, j.kind, j.queue, j.priority,
             j.args, j.metadata, j.tags, j.errors, j.progress, j.run_at, j.created_at, j.finalized_at, j.unique_key, j.unique_states
      FROM judged j WHERE j.keep
      RETURNING 1
    )
    SELECT (SELECT count(*) FROM copied),
           (SELECT jsonb_object_agg(k, n) FROM (SELECT j.queue || ':' || j.state AS k, count(*) AS n FROM judged j GROUP BY 1) c),
           (SELECT jsonb_agg(jsonb_build_object('job_id', j.job_id, 'run_lease', j.run_lease, 'finalized_at', j.finalized_at,
                                                'unique_key', encode(j.unique_key, 'hex')))
            FROM judged j WHERE NOT j.keep AND j.unique_key IS NOT NULL),
           (SELECT count(*) FROM judged)
      INTO v_copied_rows, v_rollup, v_keys, v_count; -- 0048
    PERFORM set_config('enable_nestloop', v_saved_nestloop, true); -- 0048
    IF v_copied_rows > 0 THEN -- 0048: recorded and committed, as 0013's copy ahead
      INSERT INTO history_copies (generation, slot, terminal_rows, rollup, keys)
      VALUES (v_old, v_slot, v_count, coalesce(v_rollup, '{}'), v_keys);
      RETURN QUERY SELECT 'Copied', v_old, 0, 0, 0;
      RETURN;
    END IF;
  ELSE
    PERFORM set_config('enable_nestloop', 'off', true);
    -- After a copy ahead the judging reads history while we hold the slot frozen: a history
    -- prune's exclusive lock may make it wait at most lock_timeout (then an error: nothing was
    -- written), never as long as that prune runs (review M6).
    IF v_copied THEN
      PERFORM set_config('lock_timeout', v_timeout || 'ms', true);
    END IF;
    WITH wide AS (
      SELECT t.job_id, t.run_lease, t.state, t.attempt, coalesce(t.max_attempts, r.max_attempts) AS max_attempts,
             coalesce(t.kind, r.kind) AS kind, coalesce(t.queue, r.queue) AS queue, coalesce(t.priority, r.priority) AS priority,
             coalesce(t.args, r.args) AS args, coalesce(t.metadata, r.metadata) AS metadata, coalesce(t.tags, r.tags) AS tags,
             coalesce(t.errors, r.errors) AS errors, t.progress, coalesce(t.run_at, r.run_at) AS run_at,
             coalesce(t.created_at, r.created_at) AS created_at, t.finalized_at,
             coalesce(t.unique_key, r.unique_key) AS unique_key, coalesce(t.unique_states, r.unique_states, 0) AS unique_states
      FROM terminal t
      LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
      WHERE t.slot = v_slot
    ),
    judged AS MATERIALIZED (
      -- 0039: = retention(w.state, w.queue, ...), with the queue's overrides joined once: the SQL
      -- function (its FROM keeps it from being inlined) ran per terminal row, ~9 us each
      SELECT w.*, w.finalized_at > now() - CASE w.state
                                             WHEN 'completed' THEN coalesce(m.completed_retention, p_completed_ms * interval '1 millisecond')
                                             WHEN 'failed' THEN coalesce(m.failed_retention, p_failed_ms * interval '1 millisecond')
                                             ELSE coalesce(m.cancelled_retention, p_cancelled_ms * interval '1 millisecond') END AS keep,
             v_copied AND EXISTS (SELECT 1 FROM history h WHERE h.job_id = w.job_id AND h.run_lease = w.run_lease
                                    AND h.state = w.state AND h.finalized_at = w.finalized_at) AS in_history
      FROM wide w
      LEFT JOIN queue_meta m ON m.queue = w.queue -- 0039
    )
    SELECT (SELECT array_agg(ROW(0, 0, j.job_id, j.run_lease, j.state, j.attempt, j.max_attempts, j.kind, j.queue, j.priority,
                                 j.args, j.metadata, j.tags, j.errors, j.progress, j.run_at, j.created_at, j.finalized_at,
                                 j.unique_key, j.unique_states)::history)
            FROM judged j WHERE j.keep AND NOT j.in_history),
           (SELECT jsonb_object_agg(k, n) FROM (SELECT j.queue || ':' || j.state AS k, count(*) AS n FROM judged j GROUP BY 1) c),
           (SELECT jsonb_agg(jsonb_build_object('job_id', j.job_id, 'run_lease', j.run_lease, 'finalized_at', j.finalized_at,
                                                'unique_key', encode(j.unique_key, 'hex')))
            FROM judged j WHERE NOT j.keep AND NOT j.in_history AND j.unique_key IS NOT NULL),
           (SELECT count(*) FROM judged)
      INTO v_kept, v_rollup, v_keys, v_count;
    PERFORM set_config('enable_nestloop', v_saved_nestloop, true);
    PERFORM set_config('lock_timeout', v_saved_timeout, true);

    -- 0048: 0013's copy ahead from this array is the branch above now (this one judges only
    -- slots of fewer than v_copy_ahead_rows terminal rows, open attempts, or rows after a copy)
  END IF;

  -- Park ahead: when more of the residue is to be parked than one prune may carry, move it to
  -- parked now, in a transaction of its own (committed, so a prune that then fails to get its
  -- exclusive lock undoes nothing and leaves no dead tuple), and tombstone the ring rows ("moved"),
  -- under each such lane's claim lock (tried: a claimer at work makes us skip this and park under
  -- the exclusive lock instead), so no claim of the lane is in flight while its rows move. The
  -- caller calls again at once ('Parked'); the exclusive phase then only carries, at most
  -- p_carry_rows rows, instead of inserting the whole backlog while every reader waits.
  -- Writes: parked, ready_tombstones (this slot, ROW EXCLUSIVE: compatible with our own SHARE).
  WITH lanes AS MATERIALIZED (
    SELECT l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard) AS c
    FROM (SELECT DISTINCT r.queue, r.priority, r.shard FROM ready r WHERE r.slot = v_slot) l
  )
  SELECT count(*) INTO v_count FROM (
    SELECT 1 FROM lanes l
    JOIN ready r ON r.slot = v_slot AND r.queue = l.queue AND r.priority = l.priority AND r.shard = l.shard AND r.lane_seq >= l.c
    WHERE NOT EXISTS (SELECT 1 FROM ready_tombstones t
                      WHERE t.slot = v_slot AND t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                        AND t.lane_seq = r.lane_seq)
    LIMIT 2 * greatest(p_carry_rows, 1) + 1) x;
  IF v_count > 2 * greatest(p_carry_rows, 1) THEN
    FOR v_attempt IN
      SELECT DISTINCT r.queue, r.priority, r.shard FROM ready r WHERE r.slot = v_slot ORDER BY 1, 2, 3
    LOOP
      IF NOT pg_try_advisory_xact_lock(lock_ns('claim'), lane_key(v_attempt.queue, v_attempt.priority, v_attempt.shard)) THEN
        v_count := -1;
        EXIT;
      END IF;
    END LOOP;
    IF v_count > 0 THEN
      WITH lanes AS MATERIALIZED (
        SELECT l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard) AS c,
               (SELECT min(p.lane_seq) FROM parked p WHERE p.queue = l.queue AND p.priority = l.priority AND p.shard = l.shard) AS barrier,
               EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = l.queue AND m.paused) AS paused
        FROM (SELECT DISTINCT r.queue, r.priority, r.shard FROM ready r WHERE r.slot = v_slot) l
      ),
      residue AS MATERIALIZED (
        SELECT r.*, l.c, l.barrier, l.paused,
               row_number() OVER (PARTITION BY r.queue, r.priority, r.shard ORDER BY r.lane_seq) AS n
        FROM ready r JOIN lanes l ON l.queue = r.queue AND l.priority = r.priority AND l.shard = r.shard
        WHERE r.slot = v_slot AND r.lane_seq >= l.c
          AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                          WHERE t.slot = v_slot AND t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                            AND t.lane_seq = r.lane_seq)
      ),
      decided AS MATERIALIZED (
        SELECT x.*,
               x.candidate AND row_number() OVER (PARTITION BY x.candidate ORDER BY x.n, x.queue, x.priority, x.shard) <= p_carry_rows AS carry
        FROM (SELECT s.*, NOT s.paused AND s.n <= v_lane_head AND (s.barrier IS NULL OR s.lane_seq < s.barrier) AS candidate
              FROM residue s) x
      ),
      ins_park AS (
        INSERT INTO parked (job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags, errors, progress, attempt,
                            run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
        SELECT d.job_id, d.kind, d.queue, d.priority, d.shard, d.lane_seq, d.args, d.metadata, d.tags, d.errors, d.progress,
               d.attempt, d.run_lease, d.max_attempts, d.run_at, d.created_at, d.unique_key, d.unique_states
        FROM decided d WHERE NOT d.carry
      )
      INSERT INTO ready_tombstones (slot, generation, job_id, queue, priority, shard, lane_seq)
      SELECT v_slot, d.generation, d.job_id, d.queue, d.priority, d.shard, d.lane_seq FROM decided d WHERE NOT d.carry;
      GET DIAGNOSTICS v_parked = ROW_COUNT;
      RETURN QUERY SELECT 'Parked', v_old, 0, 0, v_parked;
      RETURN;
    END IF;
  END IF;

  -- ACCESS EXCLUSIVE. Normally never queued (a waiting request makes every later reader of the
  -- slot's children wait behind it): NOWAIT, retried about every millisecond. Forced: queued,
  -- for at most the force timeout.
  IF v_forced THEN
    -- Queued, but for the parents only: ACCESS EXCLUSIVE on the claim_marks, claim_spans and claims
    -- parent tables themselves (ONLY: not their children), in that order (0053). Every reader of the
    -- slot's children locks one of these parents before any child (claim's cursor statement reads
    -- claim_marks first; rescue reads claim_spans first (0053); the jobs view, finalize and heartbeat
    -- read claims before any other ring table), so the request
    -- waits for the readers in flight, however long, and readers that come after it queue at the
    -- parent holding no child. Waiting for the children instead would take them one by one, and a
    -- reader that locks them in another order (PostgreSQL 15 and 17 differ) would hold one child
    -- while waiting for another we hold: a deadlock whose victim may be the reader. Then the
    -- children, without waiting (the readers in flight are gone). A cycle is still possible with a
    -- session that waits for our SHARE or attempt locks while holding a parent (a claim picking
    -- this slot's residue, rescue, cancel_job): the deadlock detector breaks it, and a prune that
    -- loses answers Blocked:lock. Readers stall for the wait at most (the force timeout).
    v_deadline := clock_timestamp() + p_force_timeout_ms * interval '1 millisecond';
    BEGIN
      PERFORM set_config('lock_timeout', p_force_timeout_ms || 'ms', true);
      EXECUTE format('LOCK TABLE ONLY %1$I.claim_marks, ONLY %1$I.claim_spans, ONLY %1$I.claims IN ACCESS EXCLUSIVE MODE', ':AWA_SCHEMA'); -- 0053
      LOOP
        BEGIN
          EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE NOWAIT';
          v_locked := true;
          EXIT;
        EXCEPTION WHEN lock_not_available THEN
          EXIT WHEN clock_timestamp() >= v_deadline;
        END;
        PERFORM pg_sleep(0.001);
      END LOOP;
    EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
      v_locked := false;
    END;
    IF NOT v_locked THEN
      IF p_end_idle_ms > 0 THEN
        PERFORM end_idle_blockers(v_slot, p_end_idle_ms);
      END IF;
      RETURN QUERY SELECT 'Blocked:lock', v_old, 0, 0, 0;
      RETURN;
    END IF;
  ELSE
    v_deadline := clock_timestamp() + p_lock_timeout_ms * interval '1 millisecond';
    LOOP
      BEGIN
        EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE NOWAIT';
        EXIT;
      EXCEPTION WHEN lock_not_available THEN
        IF clock_timestamp() >= v_deadline THEN
          RETURN QUERY SELECT 'Blocked:lock', v_old, 0, 0, 0;
          RETURN;
        END IF;
      END;
      PERFORM pg_sleep(0.001);
    END LOOP;
  END IF;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);

  -- Under the exclusive lock: only the writes.
  IF v_open_claims IS NOT NULL THEN
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_cur.slot, v_cur.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata, r.tags,
           r.errors, r.progress, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.unique_key, r.unique_states
    FROM unnest(v_open_ready) r;
    INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at,
                        key_policy, key_digest) -- 0033
    SELECT v_cur.slot, v_cur.generation, o.job_id, o.run_lease, o.attempt, o.queue, o.priority, o.shard, o.lane_seq, o.claimed_at, o.deadline_at,
           o.key_policy, o.key_digest -- 0033
    FROM unnest(v_open_claims) o;
    -- 0053: their spans in the current slot, one per lane and claim time (a call's claims share it)
    INSERT INTO claim_spans (slot, generation, queue, priority, shard, first_lane_seq, last_lane_seq, claimed_at, deadline_at) -- 0053
    SELECT v_cur.slot, v_cur.generation, o.queue, o.priority, o.shard, min(o.lane_seq), max(o.lane_seq), o.claimed_at, o.deadline_at -- 0053
    FROM unnest(v_open_claims) o -- 0053
    GROUP BY o.queue, o.priority, o.shard, o.claimed_at, o.deadline_at; -- 0053
    INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
    SELECT v_cur.slot, v_cur.generation, l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard)
    FROM (SELECT DISTINCT o.queue, o.priority, o.shard FROM unnest(v_open_claims) o) l;
  END IF;

  -- The residue: ready rows a claimer could still take (at or beyond the lane's cursor, not
  -- tombstoned). The slot is frozen, and no claim of its rows can commit before we do (they need
  -- ROW EXCLUSIVE on its claims child), so this is the residue the truncate would drop. Each row
  -- is carried (same position, current slot) or parked; rows of one lane are decided in position
  -- order, so a lane's carried rows are a prefix of its residue and lie below its new barrier.
  WITH lanes AS MATERIALIZED (
    SELECT l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard) AS c,
           (SELECT min(p.lane_seq) FROM parked p WHERE p.queue = l.queue AND p.priority = l.priority AND p.shard = l.shard) AS barrier,
           EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = l.queue AND m.paused) AS paused
    FROM (SELECT DISTINCT r.queue, r.priority, r.shard FROM ready r WHERE r.slot = v_slot) l
  ),
  residue AS MATERIALIZED (
    SELECT r.*, l.c, l.barrier, l.paused,
           row_number() OVER (PARTITION BY r.queue, r.priority, r.shard ORDER BY r.lane_seq) AS n
    FROM ready r JOIN lanes l ON l.queue = r.queue AND l.priority = r.priority AND l.shard = r.shard
    WHERE r.slot = v_slot AND r.lane_seq >= l.c
      AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                      WHERE t.slot = v_slot AND t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard
                        AND t.lane_seq = r.lane_seq)
  ),
  decided AS MATERIALIZED (
    SELECT x.*,
           x.candidate AND row_number() OVER (PARTITION BY x.candidate ORDER BY x.n, x.queue, x.priority, x.shard) <= p_carry_rows AS carry
    FROM (SELECT s.*, NOT s.paused AND s.n <= v_lane_head AND (s.barrier IS NULL OR s.lane_seq < s.barrier) AS candidate
          FROM residue s) x
  ),
  ins_carry AS (
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_cur.slot, v_cur.generation, d.job_id, d.kind, d.queue, d.priority, d.shard, d.lane_seq, d.args, d.metadata, d.tags,
           d.errors, d.progress, d.attempt, d.run_lease, d.max_attempts, d.run_at, d.created_at, d.unique_key, d.unique_states
    FROM decided d WHERE d.carry
  ),
  ins_park AS (
    INSERT INTO parked (job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags, errors, progress, attempt,
                        run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT d.job_id, d.kind, d.queue, d.priority, d.shard, d.lane_seq, d.args, d.metadata, d.tags, d.errors, d.progress,
           d.attempt, d.run_lease, d.max_attempts, d.run_at, d.created_at, d.unique_key, d.unique_states
    FROM decided d WHERE NOT d.carry
  ),
  -- the lane's cursor may come from a mark in this slot: keep it where it is
  ins_marks AS (
    INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
    SELECT v_cur.slot, v_cur.generation, l.queue, l.priority, l.shard, l.c
    FROM lanes l
    WHERE l.c > 0 AND EXISTS (SELECT 1 FROM decided d WHERE d.carry AND d.queue = l.queue AND d.priority = l.priority AND d.shard = l.shard)
  )
  SELECT count(*) FILTER (WHERE d.carry), count(*) FILTER (WHERE NOT d.carry) INTO v_moved, v_parked FROM decided d;

  IF v_kept IS NOT NULL THEN
    SELECT * INTO v_hist FROM ring_current('history');
    INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                         metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
    SELECT v_hist.slot, v_hist.generation, h.job_id, h.run_lease, h.state, h.attempt, h.max_attempts, h.kind, h.queue, h.priority,
           h.args, h.metadata, h.tags, h.errors, h.progress, h.run_at, h.created_at, h.finalized_at, h.unique_key, h.unique_states
    FROM unnest(v_kept) h;
  END IF;
  -- Keys are released after this commits (release_pending_keys), not under the lock.
  IF v_keys IS NOT NULL THEN
    INSERT INTO pending_key_releases (ring, generation, keys) VALUES ('queue', v_old, v_keys);
  END IF;
  EXECUTE 'TRUNCATE ' || v_children;
  INSERT INTO ring_prunes (ring, generation, slot, rollup) VALUES ('queue', v_old, v_slot, coalesce(v_rollup, '{}'));
  RETURN QUERY SELECT 'Pruned', v_old, coalesce(cardinality(v_open_claims), 0), v_moved, v_parked;
END
$$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.prune_queue(int, bigint, bigint, bigint, bigint, int, int, bigint) FROM PUBLIC;

-- prune_queue, 4 arguments: 0033's text, lines marked 0053.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.prune_queue(p_lock_timeout_ms integer, p_completed_ms bigint, p_failed_ms bigint, p_cancelled_ms bigint)
 RETURNS TABLE(outcome text, generation bigint, carried integer)
 LANGUAGE plpgsql
 SET search_path TO ':AWA_SCHEMA', 'pg_catalog'
 SET jit TO 'off'
AS $function$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots('queue');
  v_cur record;
  v_hist record;
  v_old bigint;
  v_slot int;
  v_attempt record;
  v_open_claims claims[];
  v_open_ready ready[];
  v_kept history[];
  v_copy record;
  v_copied boolean;
  v_count bigint;
  -- below this many rows to keep, inserting them under the lock costs less than a second commit
  v_copy_ahead_rows constant int := 1000;
  v_rollup jsonb;
  v_keys jsonb;
  v_children text;
  v_deadline timestamptz;
  v_saved_timeout text := current_setting('lock_timeout');
  v_saved_nestloop text := current_setting('enable_nestloop');
BEGIN
  -- READ COMMITTED only (0027, docs/adr/0021-server-defaults.md)
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'prune_queue needs READ COMMITTED, not %', upper(current_setting('transaction_isolation'))
      USING ERRCODE = 'AWI01', HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction.';
  END IF;
  IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext('queue')) THEN
    RETURN QUERY SELECT 'Blocked:busy', NULL::bigint, 0;
    RETURN;
  END IF;
  SELECT * INTO v_cur FROM ring_current('queue');
  SELECT min(g.g) INTO v_old
  FROM generate_series(greatest(0, v_cur.generation - v_n + 1), v_cur.generation - 1) AS g(g)
  WHERE NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = g.g);
  IF v_old IS NULL THEN
    RETURN QUERY SELECT 'Noop', NULL::bigint, 0;
    RETURN;
  END IF;
  v_slot := (v_old % v_n)::int;

  IF slot_has_unclaimed(v_slot) THEN
    RETURN QUERY SELECT 'Blocked:unclaimed', v_old, 0;
    RETURN;
  END IF;
  -- 0028: the open attempts' claims rows, tried FOR UPDATE NOWAIT, where each attempt's advisory
  -- lock was tried (one lock-table entry per open attempt; 100k open attempts failed): a
  -- finalizer or heartbeat holding one makes us back off; holding them, none can write for these
  -- attempts until we commit. A row lock taken in the block is released if it fails
  -- (sub-transaction), kept if it succeeds.
  BEGIN -- 0028
    PERFORM 1 FROM claims c
    WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
    ORDER BY c.job_id, c.run_lease
    FOR UPDATE OF c NOWAIT;
  EXCEPTION WHEN lock_not_available THEN -- 0028
    RETURN QUERY SELECT 'Blocked:locked_attempt', v_old, 0;
    RETURN;
  END;

  v_children := format('%1$I.ready_%2$s, %1$I.ready_tombstones_%2$s, %1$I.claims_%2$s, %1$I.claim_marks_%2$s, %1$I.closures_%2$s, %1$I.terminal_%2$s, %1$I.claim_spans_%2$s', -- 0053
                       ':AWA_SCHEMA', v_slot);
  -- Freeze the slot: SHARE waits for writers still inserting into it and keeps new ones out until
  -- commit, but does not conflict with the ACCESS SHARE of claimers and readers. A queued SHARE
  -- request does not hold up later readers either (only ACCESS EXCLUSIVE conflicts with them).
  BEGIN
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    EXECUTE 'LOCK TABLE ' || v_children || ' IN SHARE MODE';
  EXCEPTION WHEN lock_not_available THEN
    RETURN QUERY SELECT 'Blocked:lock', v_old, 0;
    RETURN;
  END;
  PERFORM set_config('lock_timeout', v_saved_timeout, true);

  -- Re-proof: rows committed while we waited for SHARE are visible now, and no more can come.
  IF slot_has_unclaimed(v_slot) THEN
    RETURN QUERY SELECT 'Blocked:unclaimed', v_old, 0;
    RETURN;
  END IF;

  -- Everything below up to the exclusive lock only reads: a prune that gives up writes nothing.
  -- Open attempts: claims without a closure (ours since step 3, or claimed after it from rows
  -- that arrived late; either way their finalizers need the slot, which is frozen).
  SELECT array_agg(c) INTO v_open_claims FROM claims c
  WHERE c.slot = v_slot AND NOT EXISTS (SELECT 1 FROM closures z WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease);
  IF v_open_claims IS NOT NULL THEN
    SELECT array_agg(r) INTO v_open_ready
    FROM unnest(v_open_claims) o
    JOIN ready r ON r.slot = v_slot AND r.queue = o.queue AND r.priority = o.priority AND r.shard = o.shard AND r.lane_seq = o.lane_seq;
  END IF;

  -- The terminal rows: judged here, or already copied ahead by an earlier call (see below). The
  -- slot is frozen, so if it still holds as many terminal rows as the copy saw, they are the same
  -- rows (ring tables are append-only) and the copy's roll-up and keys stand.
  SELECT * INTO v_copy FROM history_copies hc WHERE hc.generation = v_old;
  v_copied := FOUND;
  IF v_copied THEN
    EXECUTE format('SELECT count(*) FROM %I.terminal_%s', ':AWA_SCHEMA', v_slot) INTO v_count;
  END IF;
  IF v_copied AND v_count = v_copy.terminal_rows THEN
    v_rollup := v_copy.rollup;
    v_keys := v_copy.keys;
  ELSE
    -- Judge: widened from their ready row when narrow; kept if inside their state's retention.
    -- After a copy ahead (rows arrived since: rare), rows already in history are neither copied
    -- again nor have their keys released (the history copy holds them).
    -- Fresh ring children have no statistics (estimates of a few rows), so the planner joins
    -- terminal to ready with a nested loop over a seq scan: O(n²), 0.56 s for 2,000 rows. A hash
    -- join is linear whatever the estimates.
    PERFORM set_config('enable_nestloop', 'off', true);
    WITH wide AS (
      SELECT t.job_id, t.run_lease, t.state, t.attempt, coalesce(t.max_attempts, r.max_attempts) AS max_attempts,
             coalesce(t.kind, r.kind) AS kind, coalesce(t.queue, r.queue) AS queue, coalesce(t.priority, r.priority) AS priority,
             coalesce(t.args, r.args) AS args, coalesce(t.metadata, r.metadata) AS metadata, coalesce(t.tags, r.tags) AS tags,
             coalesce(t.errors, r.errors) AS errors, t.progress, coalesce(t.run_at, r.run_at) AS run_at,
             coalesce(t.created_at, r.created_at) AS created_at, t.finalized_at,
             coalesce(t.unique_key, r.unique_key) AS unique_key, coalesce(t.unique_states, r.unique_states, 0) AS unique_states
      FROM terminal t
      LEFT JOIN ready r ON NOT t.wide AND r.slot = t.slot AND r.job_id = t.job_id AND r.lane_seq = t.lane_seq
      WHERE t.slot = v_slot
    ),
    judged AS MATERIALIZED (
      SELECT w.*, w.finalized_at > now() - retention(w.state, w.queue, p_completed_ms, p_failed_ms, p_cancelled_ms) AS keep,
             v_copied AND EXISTS (SELECT 1 FROM history h WHERE h.job_id = w.job_id AND h.run_lease = w.run_lease
                                    AND h.state = w.state AND h.finalized_at = w.finalized_at) AS in_history
      FROM wide w
    )
    SELECT (SELECT array_agg(ROW(0, 0, j.job_id, j.run_lease, j.state, j.attempt, j.max_attempts, j.kind, j.queue, j.priority,
                                 j.args, j.metadata, j.tags, j.errors, j.progress, j.run_at, j.created_at, j.finalized_at,
                                 j.unique_key, j.unique_states)::history)
            FROM judged j WHERE j.keep AND NOT j.in_history),
           (SELECT jsonb_object_agg(k, n) FROM (SELECT j.queue || ':' || j.state AS k, count(*) AS n FROM judged j GROUP BY 1) c),
           (SELECT jsonb_agg(jsonb_build_object('job_id', j.job_id, 'run_lease', j.run_lease, 'finalized_at', j.finalized_at,
                                                'unique_key', encode(j.unique_key, 'hex')))
            FROM judged j WHERE NOT j.keep AND NOT j.in_history AND j.unique_key IS NOT NULL),
           (SELECT count(*) FROM judged)
      INTO v_kept, v_rollup, v_keys, v_count;
    PERFORM set_config('enable_nestloop', v_saved_nestloop, true);

    -- Copy ahead: many rows to keep, and nothing left in the slot that could still add a terminal
    -- row (no open attempt). Insert them into history now and COMMIT (the caller calls again at
    -- once): under the exclusive lock the next call then only truncates, instead of inserting
    -- every row (0.9 s for 100k rows). The copy is committed, never rolled back, and recorded in
    -- history_copies, so a later call reuses it instead of copying again: no dead tuples either way.
    IF NOT v_copied AND v_open_claims IS NULL AND coalesce(cardinality(v_kept), 0) >= v_copy_ahead_rows THEN
      SELECT * INTO v_hist FROM ring_current('history');
      INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                           metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
      SELECT v_hist.slot, v_hist.generation, h.job_id, h.run_lease, h.state, h.attempt, h.max_attempts, h.kind, h.queue, h.priority,
             h.args, h.metadata, h.tags, h.errors, h.progress, h.run_at, h.created_at, h.finalized_at, h.unique_key, h.unique_states
      FROM unnest(v_kept) h;
      INSERT INTO history_copies (generation, slot, terminal_rows, rollup, keys)
      VALUES (v_old, v_slot, v_count, coalesce(v_rollup, '{}'), v_keys);
      RETURN QUERY SELECT 'Copied', v_old, 0;
      RETURN;
    END IF;
  END IF;

  -- ACCESS EXCLUSIVE, never queued: a waiting request would make every later claimer wait behind
  -- it (they all read this slot's children). NOWAIT succeeds in a moment when no reader holds the
  -- children; between tries we sleep about a millisecond, so readers come and go freely.
  v_deadline := clock_timestamp() + p_lock_timeout_ms * interval '1 millisecond';
  LOOP
    BEGIN
      EXECUTE 'LOCK TABLE ' || v_children || ' IN ACCESS EXCLUSIVE MODE NOWAIT';
      EXIT;
    EXCEPTION WHEN lock_not_available THEN
      IF clock_timestamp() >= v_deadline THEN
        RETURN QUERY SELECT 'Blocked:lock', v_old, 0;
        RETURN;
      END IF;
    END;
    PERFORM pg_sleep(0.001);
  END LOOP;

  -- Under the exclusive lock: only the writes.
  IF v_open_claims IS NOT NULL THEN
    INSERT INTO ready (slot, generation, job_id, kind, queue, priority, shard, lane_seq, args, metadata, tags,
                       errors, progress, attempt, run_lease, max_attempts, run_at, created_at, unique_key, unique_states)
    SELECT v_cur.slot, v_cur.generation, r.job_id, r.kind, r.queue, r.priority, r.shard, r.lane_seq, r.args, r.metadata, r.tags,
           r.errors, r.progress, r.attempt, r.run_lease, r.max_attempts, r.run_at, r.created_at, r.unique_key, r.unique_states
    FROM unnest(v_open_ready) r;
    INSERT INTO claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq, claimed_at, deadline_at,
                        key_policy, key_digest) -- 0033
    SELECT v_cur.slot, v_cur.generation, o.job_id, o.run_lease, o.attempt, o.queue, o.priority, o.shard, o.lane_seq, o.claimed_at, o.deadline_at,
           o.key_policy, o.key_digest -- 0033
    FROM unnest(v_open_claims) o;
    -- 0053: their spans in the current slot, one per lane and claim time (a call's claims share it)
    INSERT INTO claim_spans (slot, generation, queue, priority, shard, first_lane_seq, last_lane_seq, claimed_at, deadline_at) -- 0053
    SELECT v_cur.slot, v_cur.generation, o.queue, o.priority, o.shard, min(o.lane_seq), max(o.lane_seq), o.claimed_at, o.deadline_at -- 0053
    FROM unnest(v_open_claims) o -- 0053
    GROUP BY o.queue, o.priority, o.shard, o.claimed_at, o.deadline_at; -- 0053
    -- the lane's cursor is past every carried row (they were claimed); a mark at it keeps it there
    -- once this slot's marks are gone
    INSERT INTO claim_marks (slot, generation, queue, priority, shard, next_lane_seq)
    SELECT v_cur.slot, v_cur.generation, l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard)
    FROM (SELECT DISTINCT o.queue, o.priority, o.shard FROM unnest(v_open_claims) o) l;
  END IF;

  IF v_kept IS NOT NULL THEN
    SELECT * INTO v_hist FROM ring_current('history');
    INSERT INTO history (slot, generation, job_id, run_lease, state, attempt, max_attempts, kind, queue, priority, args,
                         metadata, tags, errors, progress, run_at, created_at, finalized_at, unique_key, unique_states)
    SELECT v_hist.slot, v_hist.generation, h.job_id, h.run_lease, h.state, h.attempt, h.max_attempts, h.kind, h.queue, h.priority,
           h.args, h.metadata, h.tags, h.errors, h.progress, h.run_at, h.created_at, h.finalized_at, h.unique_key, h.unique_states
    FROM unnest(v_kept) h;
  END IF;

  IF v_keys IS NOT NULL THEN
    PERFORM release_keys_of(v_keys);
  END IF;
  EXECUTE 'TRUNCATE ' || v_children;
  INSERT INTO ring_prunes (ring, generation, slot, rollup) VALUES ('queue', v_old, v_slot, coalesce(v_rollup, '{}'));
  RETURN QUERY SELECT 'Pruned', v_old, coalesce(cardinality(v_open_claims), 0);
END
$function$;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.prune_queue(int, bigint, bigint, bigint) FROM PUBLIC;

-- end_idle_blockers: 0021's text, the line marked 0053.
CREATE OR REPLACE FUNCTION :AWA_SCHEMA.end_idle_blockers(p_slot int, p_idle_ms bigint) RETURNS int
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog SET jit = off AS $$
DECLARE
  v_pid int;
  v_n int := 0;
BEGIN
  FOR v_pid IN
    SELECT DISTINCT l.pid
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
      AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
      AND l.relation IN (SELECT format('%I.%I', ':AWA_SCHEMA', t || '_' || p_slot)::regclass::oid
                         FROM unnest(ARRAY['ready', 'ready_tombstones', 'claims', 'claim_marks', 'closures', 'terminal', 'claim_spans']) t) -- 0053
      AND a.state IN ('idle in transaction', 'idle in transaction (aborted)')
      AND a.state_change < now() - p_idle_ms * interval '1 millisecond'
  LOOP
    BEGIN
      IF pg_terminate_backend(v_pid) THEN
        v_n := v_n + 1;
        RAISE WARNING 'awa: ended session % (idle in transaction, holding queue-ring slot % against prune)', v_pid, p_slot;
      END IF;
    EXCEPTION WHEN insufficient_privilege THEN
      RAISE WARNING 'awa: session % is idle in transaction and blocks prune of slot %, but may not be ended by this role', v_pid, p_slot;
    END;
  END LOOP;
  RETURN v_n;
END
$$;

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.end_idle_blockers(int, bigint) FROM PUBLIC;
