-- 0017: the ring ledgers stop growing (docs/adr/0013-ledger-retention.md).
--
-- ring_rotations, ring_prunes (0001) and history_copies (0013) gained one row per rotation, per
-- prune and per copy ahead, forever: at one queue rotation per 10 s, ~8,640 rows a day each.
-- What their readers need, per ring with N slots and current generation g:
--  * the current incarnation: the newest ring_rotations row (ring_current, lock_current_slot,
--    claim's mark, rotate, rotate_queue_when_due): a backward probe of the primary key;
--  * "is incarnation G pruned" only for G in the newest wrap [g − N + 1, g]: rotate asks for
--    G = g + 1 − N, prune_queue and prune_history scan (g − N, g), lock_current_slot asks for g;
--  * history_copies of the incarnation prune_queue takes next (unpruned, so inside the wrap);
--  * the roll-ups, for lifetime totals (ledger_totals below; nothing else reads them).
-- Every generation ≤ g − N is pruned: rotate enters generation k only once k − N is recorded as
-- pruned. So rows below g − N + 1 answer no question any reader asks, and trim_ledgers deletes
-- them, folding the deleted roll-ups into ring_ledger_totals in the same statement.

-- One row per ring: what trim_ledgers folded out of ring_prunes before deleting it. Updated once
-- per trim (about once per ring wrap), never on the hot path.
CREATE TABLE :AWA_SCHEMA.ring_ledger_totals (
  ring               text        PRIMARY KEY,
  -- ring_prunes rows folded in (and deleted); every generation ≤ through_generation is pruned
  prunes             bigint      NOT NULL DEFAULT 0,
  through_generation bigint      NOT NULL DEFAULT -1,
  -- sum of their roll-ups, per "queue:state" key
  rollup             jsonb       NOT NULL DEFAULT '{}',
  updated_at         timestamptz NOT NULL DEFAULT now()
);
INSERT INTO :AWA_SCHEMA.ring_ledger_totals (ring) VALUES ('queue'), ('history');

-- ---------------------------------------------------------------------------------------------
-- ledger_totals(ring) -> (prunes, rollup): every prune of the ring since install and the sum of
-- their roll-ups, whether or not the ledger rows were trimmed since. One statement, one snapshot:
-- a trim deletes rows and folds them into the carried row in one transaction, so a reader sees
-- both or neither.
CREATE FUNCTION :AWA_SCHEMA.ledger_totals(p_ring text, OUT prunes bigint, OUT rollup jsonb)
LANGUAGE sql STABLE AS $$
  SELECT (SELECT t.prunes FROM :AWA_SCHEMA.ring_ledger_totals t WHERE t.ring = p_ring)
           + (SELECT count(*) FROM :AWA_SCHEMA.ring_prunes p WHERE p.ring = p_ring),
         (SELECT coalesce(jsonb_object_agg(s.k, s.n), '{}'::jsonb)
          FROM (SELECT e.key AS k, sum(e.value::numeric) AS n
                FROM (SELECT t.rollup FROM :AWA_SCHEMA.ring_ledger_totals t WHERE t.ring = p_ring
                      UNION ALL
                      SELECT p.rollup FROM :AWA_SCHEMA.ring_prunes p WHERE p.ring = p_ring) x,
                     jsonb_each_text(x.rollup) e
                GROUP BY 1) s)
$$;

-- ring_pruned(ring, generation): is that incarnation recorded as pruned, trimmed or not.
CREATE FUNCTION :AWA_SCHEMA.ring_pruned(p_ring text, p_generation bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM :AWA_SCHEMA.ring_ledger_totals t WHERE t.ring = p_ring AND p_generation <= t.through_generation)
      OR EXISTS (SELECT 1 FROM :AWA_SCHEMA.ring_prunes p WHERE p.ring = p_ring AND p.generation = p_generation)
$$;

-- ---------------------------------------------------------------------------------------------
-- trim_ledgers(batch) -> one row per ring: (ring, outcome, rotations, prunes, copies deleted)
-- Per ring: take its serializer (tried: 'Busy' skips the ring, so rotate and prune never wait
-- for a trim, nor a trim for them); unless a whole wrap has piled up below the newest one
-- ('Kept': so a trim runs about once per N rotations, not per tick), delete up to `batch` of the
-- oldest rows below generation g − N + 1 from each ledger, folding the deleted ring_prunes
-- roll-ups into ring_ledger_totals in the same statement ('Trimmed'). history_copies belongs to
-- the queue ring.
-- Locks: the ring serializer of each ring (tried), taken in a fixed order (queue, history);
--        row locks on the ledger rows deleted and on the ring's ring_ledger_totals row.
-- Guard: under the serializer no rotation or prune runs, so g is current; without it the answer
--        would still hold (a concurrent rotation only raises g, so a stale g keeps more rows).
--        Nothing the hot path reads is deleted: the newest wrap stays, and every read is an index
--        probe inside it, so the dead tuples left behind (a few KB, vacuumed by autovacuum) are
--        never visited, even while the MVCC horizon is pinned.
-- Writes: DELETE on ring_rotations, ring_prunes, history_copies; UPDATE of ring_ledger_totals.
-- Indexes: the primary keys (ring, generation) and history_copies (generation).
CREATE FUNCTION :AWA_SCHEMA.trim_ledgers(p_batch int)
RETURNS TABLE (ring text, outcome text, rotations int, prunes int, copies int)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_ring text;
  v_n int;
  v_cur record;
  v_keep_from bigint;
  v_oldest bigint;
  v_rotations int;
  v_prunes int;
  v_copies int;
BEGIN
  FOREACH v_ring IN ARRAY ARRAY['queue', 'history'] LOOP
    IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext(v_ring)) THEN
      RETURN QUERY SELECT v_ring, 'Busy', 0, 0, 0;
      CONTINUE;
    END IF;
    v_n := ring_slots(v_ring);
    SELECT * INTO v_cur FROM ring_current(v_ring);
    -- the newest wrap, [g − N + 1, g], answers every reader's question
    v_keep_from := v_cur.generation - v_n + 1;
    SELECT least((SELECT min(r.generation) FROM ring_rotations r WHERE r.ring = v_ring),
                 (SELECT min(p.generation) FROM ring_prunes p WHERE p.ring = v_ring),
                 CASE WHEN v_ring = 'queue' THEN (SELECT min(c.generation) FROM history_copies c) END)
      INTO v_oldest;
    IF v_oldest IS NULL OR v_oldest >= v_keep_from - v_n THEN
      RETURN QUERY SELECT v_ring, 'Kept', 0, 0, 0;
      CONTINUE;
    END IF;

    DELETE FROM ring_rotations r
    WHERE r.ring = v_ring AND r.generation IN (
      SELECT o.generation FROM ring_rotations o WHERE o.ring = v_ring AND o.generation < v_keep_from
      ORDER BY o.generation LIMIT p_batch);
    GET DIAGNOSTICS v_rotations = ROW_COUNT;

    -- the deleted roll-ups go into the carried totals in the same statement (a reader of
    -- ledger_totals sees both or neither)
    WITH gone AS (
      DELETE FROM ring_prunes p
      WHERE p.ring = v_ring AND p.generation IN (
        SELECT o.generation FROM ring_prunes o WHERE o.ring = v_ring AND o.generation < v_keep_from
        ORDER BY o.generation LIMIT p_batch)
      RETURNING p.generation, p.rollup
    ),
    folded AS (
      SELECT coalesce(jsonb_object_agg(s.k, s.n), '{}'::jsonb) AS rollup
      FROM (SELECT e.key AS k, sum(e.value::numeric) AS n
            FROM (SELECT g.rollup FROM gone g
                  UNION ALL
                  SELECT t.rollup FROM ring_ledger_totals t WHERE t.ring = v_ring) x,
                 jsonb_each_text(x.rollup) e
            GROUP BY 1) s
    ),
    summary AS (SELECT count(*) AS n, max(g.generation) AS through FROM gone g),
    carried AS (
      UPDATE ring_ledger_totals t
      SET prunes = t.prunes + m.n, through_generation = greatest(t.through_generation, m.through),
          rollup = f.rollup, updated_at = now()
      FROM folded f, summary m
      WHERE t.ring = v_ring AND m.n > 0
    )
    SELECT m.n INTO v_prunes FROM summary m;

    v_copies := 0;
    IF v_ring = 'queue' THEN
      -- a copy ahead serves only the prune of its own incarnation, done below the newest wrap
      DELETE FROM history_copies c
      WHERE c.generation IN (
        SELECT o.generation FROM history_copies o WHERE o.generation < v_keep_from
        ORDER BY o.generation LIMIT p_batch);
      GET DIAGNOSTICS v_copies = ROW_COUNT;
    END IF;
    RETURN QUERY SELECT v_ring, 'Trimmed', v_rotations, v_prunes, v_copies;
  END LOOP;
END
$$;

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.ledger_totals(text) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.ring_pruned(text, bigint) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.trim_ledgers(int) FROM PUBLIC;
