-- 0015: no nested loops between finalize's in-memory sets, nor in prune's emptiness proof.
--
-- Found with auto_explain in the peer benchmark's slow drain mode (docs/benchmarks.md): plans are
-- generic and cached per session (0011), so their shape follows the estimates at planning time.
-- After ANALYZE had seen a few hundred claims, finalize's plan joined the batch's claims to its
-- ready rows with a nested loop (the anti-join with closures was estimated at 1 row): 400 × 400
-- comparisons, ~40 ms per call instead of ~6. slot_has_unclaimed (0013) hashed a whole slot and
-- called lane_cursor per row (50–150 ms per prune attempt on a 21k-row slot) instead of probing
-- each lane from its cursor by the primary key.
--
-- Neither function has a join that a nested loop serves better: finalize's lookups are by the
-- batch's keys into in-memory sets (its attempt_state probe is a LATERAL … LIMIT 1, which stays a
-- nested loop: there is no other way to run it), and the proof is one index probe per lane.
-- enable_nestloop = off only raises a nested loop's cost; the planner still uses one where
-- nothing else is possible.

ALTER FUNCTION :AWA_SCHEMA.finalize(jsonb) SET enable_nestloop = off;

-- the proof: a nested loop over the lanes with index probes, never a hash of the slot
ALTER FUNCTION :AWA_SCHEMA.slot_has_unclaimed(int) SET enable_hashjoin = off;
ALTER FUNCTION :AWA_SCHEMA.slot_has_unclaimed(int) SET enable_mergejoin = off;
ALTER FUNCTION :AWA_SCHEMA.slot_has_unclaimed(int) SET enable_seqscan = off;
