-- 0025: claim waits for the best-ranked lane another claimer holds, instead of taking a worse one
-- (docs/adr/0022-claim-rank-order.md).
--
-- claim(...) is 0024's text (unique keys at claim; 0020's masks, 0021's parked-lane barrier,
-- 0022's progress) and SET options, with its outer lane loop rewritten (lines marked "0025"; the
-- body of each lane's pick is 0024's, one level less indented). Before, pass 1 tried each lane's
-- claim lock and skipped a busy one (another worker's claim in flight) to claim the next lanes at
-- once: with two workers on a queue, one claimed priority-2 jobs while priority-1 jobs waited
-- behind the other's claim (PgQueueStorage.claimOrder.test.ts). Now the lanes are served strictly
-- in rank order: a busy lane is waited for (lock_timeout 100 ms, once per call), and only a lane
-- still held after that is skipped, the batch filling from the next lanes.
-- Locks: the lanes' claim advisory locks as before (one waited for at most, 100 ms at most, in a
-- sub-transaction only when the lane is busy). Guards and writes: 0024's, unchanged.

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.claim(p_queue text, p_max int, p_deadline_ms bigint, p_aging_ms bigint)
RETURNS TABLE (job_id bigint, run_lease bigint, attempt int, max_attempts int, kind text, queue text,
               priority smallint, args jsonb, metadata jsonb, tags text[], errors jsonb,
               run_at timestamptz, created_at timestamptz, claimed_at timestamptz, deadline_at timestamptz,
               progress jsonb) -- 0022
LANGUAGE plpgsql
SET search_path = :AWA_SCHEMA, pg_catalog SET plan_cache_mode = force_generic_plan SET enable_seqscan = off
SET jit = off AS $$
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
  v_got int; -- 0024: rows returned for the current lane, over its picks
  v_keyed boolean; -- 0024: the last pick left out rows whose key is taken at claim
  v_mark bigint; -- 0024: the lane's cursor after that pick
BEGIN
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
    WITH cur AS MATERIALIZED (
      SELECT l.queue, l.priority, l.shard, lane_cursor(l.queue, l.priority, l.shard) AS c
      FROM lanes l WHERE l.queue = p_queue
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
  END IF;

  -- 0025: one pass over the lanes in rank order. A lane whose claim lock another claimer holds (a
  -- claim in flight: a few ms) is waited for, up to 100 ms and once per call, instead of skipped:
  -- skipping it took a worse-ranked lane's jobs while better-ranked ones waited (priority
  -- inversion under concurrent claimers). A lane still held after the wait, and any busy lane
  -- after it, is skipped, and the batch fills from the next lanes in order, so a claimer stuck
  -- behind a slow one never idles a poll interval for it. (0009 to 0024: pass 1 skipped busy
  -- lanes and claimed the rest at once; pass 2 waited only when pass 1 had claimed nothing.)
  FOR v_k IN 1 .. cardinality(v_prios) LOOP
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
    -- The cursor, in its own statement after the lane lock (see Guard and Mark slot above).
    -- ORDER BY … LIMIT 1 rather than max(): the same index scans, planned once instead of
    -- twice (max() is planned as an aggregate and as this query); re-planned after every
    -- prune, whose TRUNCATE invalidates cached plans.
    SELECT m.next_lane_seq INTO v_cursor FROM claim_marks m
    WHERE m.queue = p_queue AND m.priority = v_prios[v_k] AND m.shard = v_shards[v_k]
    ORDER BY m.next_lane_seq DESC LIMIT 1;
    v_cursor := coalesce(v_cursor, 0);
    -- The slots that can hold this lane's rows from the cursor on, read after the cursor
    -- statement (see Slots above). Once per call: it holds for the rest of the transaction.
    IF v_lo1 IS NULL THEN
      SELECT s.lo1, s.hi1, s.lo2, s.hi2 INTO v_lo1, v_hi1, v_lo2, v_hi2 FROM queue_slot_ranges() s;
    END IF;
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
        -- a tombstone lives in its ready row's slot
        AND NOT EXISTS (SELECT 1 FROM ready_tombstones t
                        WHERE t.queue = r.queue AND t.priority = r.priority AND t.shard = r.shard AND t.lane_seq = r.lane_seq
                          AND (t.slot BETWEEN v_lo1 AND v_hi1 OR t.slot BETWEEN v_lo2 AND v_hi2))
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
$$;

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) FROM PUBLIC;

