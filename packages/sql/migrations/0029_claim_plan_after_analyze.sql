-- 0029: claim's cached generic plan stays an ordered index walk after ANALYZE (issue 17; the
-- drain regression measured in docs/benchmarks.md, "Drain regression after 0021").
--
-- claim runs with plan_cache_mode = force_generic_plan (0011): its statements are planned once
-- per session with parameters unknown, from the statistics of that moment. Once ANALYZE has seen
-- a lane of a few thousand rows, the pick's generic estimate for "this lane from the cursor on,
-- in these slot ranges" is one row, and the cheapest plan for one row became a BitmapOr over the
-- ready child's primary key (the two slot ranges as two bitmap index scans), a hash anti-join
-- with the tombstones and a top-N sort: it reads the WHOLE lane from the cursor on, every call,
-- to return the first p_max rows. 0021's lane barrier (a second bound on lane_seq) is what tipped
-- the pick over; the plan was cheap before it. Measured on embedded 17 with a 20,000-job lane
-- after ANALYZE: claim(256) 28-68 ms per call instead of 0.6 ms, 20,000 heap tuples and 426
-- blocks read for claim(1) instead of 0 and 1; the bench's drain fell from ~20k to ~5k jobs/s.
--
-- The fix pins the plan shape rather than the estimate: without bitmap scans the slot ranges
-- become a filter of the index scan on (queue, priority, shard, lane_seq), which returns the lane
-- in order, so a Merge Append over the live children feeds the LIMIT and stops after p_max rows;
-- without hash or merge joins and without Materialize, the tombstone anti-join is an index probe
-- per picked row (a Materialize of the lane's tombstones would be rescanned once per row). The
-- rarer statements of claim (several lanes' heads, the unique-key-at-claim path) are probes and
-- batch-sized CTE joins already; nested loops over at most p_max rows cost them nothing material.
--
-- ALTER FUNCTION adds these options to claim's existing SET clauses (0025's text, 0027's guard;
-- search_path, plan_cache_mode, enable_seqscan = off, jit = off stay). A later CREATE OR REPLACE
-- of claim must repeat them. Locks, guards, writes: none (catalog only).
ALTER FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) SET enable_bitmapscan = off;
ALTER FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) SET enable_hashjoin = off;
ALTER FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) SET enable_mergejoin = off;
ALTER FUNCTION :AWA_SCHEMA.claim(text, int, bigint, bigint) SET enable_material = off;
