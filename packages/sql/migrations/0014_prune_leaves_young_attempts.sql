-- 0014: prune leaves a slot alone while it still has attempts claimed moments ago.
--
-- Found by the peer benchmark (docs/benchmarks.md, "The drain figure of run D is bimodal"): once
-- every row of a big sealed slot was claimed mid-drain, prune (0013) took the per-attempt lock of
-- each of its hundreds of still-open attempts, froze the slot with SHARE and judged its terminal
-- rows (~0.3 s of CPU for 20k rows) before its NOWAIT exclusive lock failed under the busy drain;
-- meanwhile those attempts' finalizers waited (finalize went from ~6 to ~45 ms per call), and the
-- next tick did it all again. Carrying exists for long-running attempts, so that rotation never
-- waits on them; an attempt claimed a few seconds ago will most likely close by itself.
--
-- prune_queue(lock_timeout_ms, retention..., carry_after_ms): when the oldest sealed slot holds an
-- open attempt claimed less than carry_after_ms ago, answer 'Blocked:young_attempts' before
-- taking any lock but the ring serializer; otherwise as in 0013 (which this calls). 0 = carry at
-- once, as before.
-- Locks: the ring serializer (tried; advisory locks are re-entrant, so 0013's own try succeeds).
-- Indexes: claims (claimed_at) on the slot's child, closures PK.

CREATE OR REPLACE FUNCTION :AWA_SCHEMA.prune_queue(p_lock_timeout_ms int, p_completed_ms bigint, p_failed_ms bigint,
                                                   p_cancelled_ms bigint, p_carry_after_ms bigint)
RETURNS TABLE (outcome text, generation bigint, carried int)
LANGUAGE plpgsql SET search_path = :AWA_SCHEMA, pg_catalog AS $$
#variable_conflict use_column
DECLARE
  v_n int := ring_slots('queue');
  v_cur record;
  v_old bigint;
  v_slot int;
BEGIN
  IF p_carry_after_ms > 0 THEN
    IF NOT pg_try_advisory_xact_lock(lock_ns('ring'), hashtext('queue')) THEN
      RETURN QUERY SELECT 'Blocked:busy', NULL::bigint, 0;
      RETURN;
    END IF;
    -- the generation 0013 would take: the oldest sealed one not yet pruned
    SELECT * INTO v_cur FROM ring_current('queue');
    SELECT min(g.g) INTO v_old
    FROM generate_series(greatest(0, v_cur.generation - v_n + 1), v_cur.generation - 1) AS g(g)
    WHERE NOT EXISTS (SELECT 1 FROM ring_prunes p WHERE p.ring = 'queue' AND p.generation = g.g);
    IF v_old IS NOT NULL THEN
      v_slot := (v_old % v_n)::int;
      IF EXISTS (
        SELECT 1 FROM claims c
        WHERE c.slot = v_slot AND c.claimed_at > now() - p_carry_after_ms * interval '1 millisecond'
          AND NOT EXISTS (SELECT 1 FROM closures z
                          WHERE z.slot = v_slot AND z.job_id = c.job_id AND z.run_lease = c.run_lease)
      ) THEN
        RETURN QUERY SELECT 'Blocked:young_attempts', v_old, 0;
        RETURN;
      END IF;
    END IF;
  END IF;
  RETURN QUERY SELECT * FROM prune_queue(p_lock_timeout_ms, p_completed_ms, p_failed_ms, p_cancelled_ms);
END
$$;

REVOKE EXECUTE ON FUNCTION :AWA_SCHEMA.prune_queue(int, bigint, bigint, bigint, bigint) FROM PUBLIC;
