/**
 * The plans of the hot path on Postgres: the planner settings its functions carry, the ring
 * children claim and finalize read (through indexes only, bounded by the batch, in the unpruned
 * slots only), and the claim's races with rotation and pause that those restrictions must not
 * open. Split from PgQueueStorage.properties.test.ts so that the version matrix (.ci/matrix.ts)
 * runs it on every PostgreSQL major: plans are what differs between them (14-16 read finalize's
 * batch with one B-tree descent per array element, 17 does not).
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import {
  claimOf,
  completeAll,
  eagerStorage,
  fresh,
  withStorageDatabase as withDatabase
} from "./pgFixtures.ts"

const job = (queue: string, n = 0, priority = 2) => ({ kind: "prop", queue, args: { n }, priority })

describe("hot path plans", () => {
  it.live(
    "the planner settings that keep finalize and the prune proof off nested loops and slot-wide hashes are in force",
    () =>
      withDatabase(() =>
        Effect.gen(function* () {
          // Generic plans follow the estimates of the moment they were cached; these settings
          // (0011, 0015) keep the shapes fixed. A later migration re-creating either function
          // must carry them over, or the peer bench's slow drain mode comes back.
          const sql = yield* SqlClient.SqlClient
          const rows = yield* sql<{ name: string; config: ReadonlyArray<string> }>`
            SELECT p.proname AS name, coalesce(p.proconfig, '{}') AS config
            FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = 'awa' AND p.proname IN ('finalize', 'finalize_completions', 'slot_has_unclaimed', 'claim')`
          const config = new Map(rows.map((r) => [r.name, r.config]))
          for (const setting of [
            "plan_cache_mode=force_generic_plan",
            "enable_seqscan=off",
            "enable_nestloop=off"
          ])
            for (const fn of ["finalize", "finalize_completions"]) // 0049: the completion statement's own function
              assert.isTrue(config.get(fn)?.includes(setting), `${fn}: ${setting}`)
          for (const setting of ["plan_cache_mode=force_generic_plan", "enable_seqscan=off"])
            assert.isTrue(config.get("claim")?.includes(setting), `claim: ${setting}`)
          for (const setting of ["enable_hashjoin=off", "enable_mergejoin=off", "enable_seqscan=off"])
            assert.isTrue(
              config.get("slot_has_unclaimed")?.includes(setting),
              `slot_has_unclaimed: ${setting}`
            )
        })
      ),
    30_000
  )

  // Ring children (heap and indexes) that claim and finalize read.
  const ringReads = Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const [row] = yield* sql<{ seq: number; blocks: number }>`
      SELECT coalesce(sum(s.seq_scan), 0)::int AS seq,
             coalesce(sum(pg_stat_get_xact_blocks_fetched(s.relid)), 0)::int
             + coalesce((SELECT sum(pg_stat_get_xact_blocks_fetched(i.indexrelid)) FROM pg_index i
                         WHERE i.indrelid IN (SELECT x.relid FROM pg_stat_xact_user_tables x
                                              WHERE x.schemaname = 'awa'
                                                AND x.relname ~ '^(ready|ready_tombstones|claims|claim_marks|claim_spans|closures|terminal)_[0-9]+$')), 0)::int AS blocks
      FROM pg_stat_xact_user_tables s
      WHERE s.schemaname = 'awa' AND s.relname ~ '^(ready|ready_tombstones|claims|claim_marks|claim_spans|closures|terminal)_[0-9]+$'`
    return row!
  })

  it.live("finalize removes the heartbeat state of the attempts it closes, and keeps their progress", () =>
    withDatabase(() =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("state")
        yield* storage.enqueueMany(Array.from({ length: 4 }, (_, n) => job(q, n)))
        const [retried, completed, quiet, still] = yield* storage.claim(claimOf(q, 4))
        yield* storage.heartbeatMany([
          { jobId: retried!.jobId, runLease: retried!.runLease, progress: { step: 3 } },
          { jobId: completed!.jobId, runLease: completed!.runLease },
          { jobId: still!.jobId, runLease: still!.runLease }
        ])
        const results = yield* storage.finalizeMany([
          {
            jobId: retried!.jobId,
            runLease: retried!.runLease,
            outcome: { _tag: "Retry", delayMs: 60_000, error: "x" }
          },
          { jobId: completed!.jobId, runLease: completed!.runLease, outcome: { _tag: "Complete" } },
          { jobId: quiet!.jobId, runLease: quiet!.runLease, outcome: { _tag: "Complete" } }
        ])
        assert.deepStrictEqual(
          results.map((r) => (r._tag === "Applied" ? r.state : r._tag)),
          ["retryable", "completed", "completed"]
        )
        const left = yield* sql<{ job_id: bigint }>`SELECT job_id FROM awa.attempt_state ORDER BY job_id`
        assert.deepStrictEqual(
          left.map((r) => r.job_id),
          [still!.jobId],
          "only the attempt still running keeps its state"
        )
        assert.deepStrictEqual((yield* storage.getJob(retried!.jobId)).progress, { step: 3 })
      })
    )
  )

  it.live(
    "claim and finalize read the ring through indexes only, bounded by the batch, however much it retains",
    () =>
      Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("plans")
          // One connection: claim and finalize cache their (generic) plans in this session while
          // the ring is nearly empty and its fresh partitions have no statistics ...
          yield* storage.enqueueMany(Array.from({ length: 40 }, (_, n) => job(q, n)))
          for (let i = 0; i < 10; i++) yield* completeAll(yield* storage.claim(claimOf(q, 3)))
          // ... then it grows: 40,000 claimed and finished attempts retained (nothing pruned), and
          // a backlog behind them.
          for (let i = 0; i < 40; i++) {
            yield* storage.enqueueMany(Array.from({ length: 1000 }, (_, n) => job(q, n)))
            yield* completeAll(yield* storage.claim(claimOf(q, 1000)))
          }
          yield* storage.enqueueMany(Array.from({ length: 1000 }, (_, n) => job(q, n)))
          const retained = yield* sql<{ claims: number; closures: number }>`
            SELECT (SELECT count(*) FROM awa.claims)::int AS claims, (SELECT count(*) FROM awa.closures)::int AS closures`
          assert.isAtLeast(retained[0]!.claims, 40_000)
          assert.isAtLeast(retained[0]!.closures, 40_000)
          const measure = (max: number) =>
            sql.withTransaction(
              Effect.gen(function* () {
                // the backend's counters since its last statistics flush: take the difference
                const before = yield* ringReads
                const claimed = yield* storage.claim(claimOf(q, max))
                const results = yield* completeAll(claimed)
                assert.strictEqual(claimed.length, max)
                assert.isTrue(results.every((r) => r._tag === "Applied"))
                const after = yield* ringReads
                return { seq: after.seq - before.seq, blocks: after.blocks - before.blocks }
              })
            )
          const small = yield* measure(10)
          const large = yield* measure(200)
          assert.strictEqual(small.seq, 0, "a sequential scan of a ring partition")
          assert.strictEqual(large.seq, 0, "a sequential scan of a ring partition")
          // Before PostgreSQL 17 a B-tree scan for `job_id = ANY (array)` descends from the root
          // once per element (17 walks the leaves between them): finalize's four lookups by the
          // batch's job ids then read ~14 more index blocks per job (measured: 544 and 26.8 on
          // 14-16 against 418 and 12.9 on 17-18). Neither is a read of what the ring retains.
          const [server] = yield* sql<{ version: number }>`
            SELECT current_setting('server_version_num')::int AS version`
          const descentPerElement = server!.version < 170000
          // A scan of the retained claims alone would read well over 1,000 blocks; the batch's
          // own rows take a few per partition plus a handful per job. The measured claim plans
          // again (the session's plan predates the ring's statistics), and planning reads the
          // metapage of every child index a statement names while the index is empty: since 0052
          // the pick names ready_tombstones twice: up to 64 more such reads (418 → 464 blocks on 17).
          const smallLimit = descentPerElement ? 700 : 500
          assert.isBelow(
            small.blocks,
            smallLimit,
            `claim(10) + finalize(10) read ${small.blocks} ring blocks`
          )
          // each further job: its own rows and index entries (~11 blocks), nothing retained
          const perJob = (large.blocks - small.blocks) / 190
          const perJobLimit = descentPerElement ? 32 : 16
          assert.isBelow(perJob, perJobLimit, `each further job read ${perJob} ring blocks`)
        }).pipe(Effect.provide(eagerStorage(url, 1)))
      ),
    120_000
  )

  it.live(
    "finalize reads a batch's ready rows by job id, not by a scan of ready's primary key, whatever the plan was cached on",
    () =>
      Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
        Effect.gen(function* () {
          // Migration 0054 narrowed finalize_completions' ready lookup to the slots of the batch's
          // claims. Written as one range, `slot` (the primary key's last column) became an index
          // condition, and a generic plan cached while the slot was empty read the whole primary
          // key index of the slot on every call (a drain's finalize 2-5× slower).
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("ready-by-id")
          // The next slot's child empty, never analyzed, and no statistics taken meanwhile
          // (autovacuum's ANALYZE would invalidate the plans).
          for (let slot = 0; slot < 16; slot++)
            yield* sql.unsafe(`ALTER TABLE awa.ready_${slot} SET (autovacuum_enabled = false)`)
          // The plans cached now, on the connection the measured transaction uses (inside a
          // transaction, claim and finalize run on its connection, not on the hot ones).
          yield* storage.enqueueMany(Array.from({ length: 3 }, (_, n) => job(q, n)))
          yield* sql.withTransaction(Effect.flatMap(storage.claim(claimOf(q, 3)), completeAll))
          yield* storage.rotate
          for (let i = 0; i < 5; i++)
            yield* storage.enqueueMany(Array.from({ length: 1000 }, (_, n) => job(q, n)))
          const pkeyBlocks = Effect.map(
            sql<{ blocks: number }>`
              SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::int AS blocks
              FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'awa' AND c.relname ~ '^ready_[0-9]+_pkey$'`,
            (rows) => rows[0]!.blocks
          )
          const read = yield* sql.withTransaction(
            Effect.gen(function* () {
              const claimed = yield* storage.claim(claimOf(q, 10))
              const before = yield* pkeyBlocks
              const results = yield* completeAll(claimed)
              assert.isTrue(results.every((r) => r._tag === "Applied"))
              return (yield* pkeyBlocks) - before
            })
          )
          // a scan of the slot's primary key reads ~40 blocks (measured: 43); finalize needs none
          assert.isBelow(read, 5, `finalize read ${read} blocks of ready's primary key`)
        }).pipe(Effect.provide(eagerStorage(url, 1)))
      ),
    60_000
  )

  it.live(
    "claim and finalize read only the ring children of unpruned slots, also when they wrap around the ring",
    () =>
      withDatabase(() =>
        Effect.gen(function* () {
          // Migration 0016: the lookups are restricted to the slots from the oldest unpruned
          // incarnation to the current one, so executor start-up prunes the other children.
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("live-slots")
          // the slots that can hold rows, from the ledger (independently of queue_slot_ranges)
          const liveSlots = Effect.map(
            sql<{ slot: number }>`
              SELECT DISTINCT (g.g % 16)::int AS slot
              FROM (SELECT max(generation) AS cur FROM awa.ring_rotations WHERE ring = 'queue') c,
                   generate_series(greatest(0, c.cur - 15), c.cur) AS g(g)
              WHERE NOT EXISTS (SELECT 1 FROM awa.ring_prunes p WHERE p.ring = 'queue' AND p.generation = g.g)`,
            (rows) => rows.map((r) => r.slot).sort((a, b) => a - b)
          )
          // index scans of each ring child so far in this transaction (pg_stat_xact_*)
          const indexScans = Effect.map(
            sql<{ relname: string; n: number }>`
              SELECT relname, coalesce(idx_scan, 0)::int AS n FROM pg_stat_xact_user_tables
              WHERE schemaname = 'awa' AND relname ~ '^(ready|ready_tombstones|claims|closures)_[0-9]+$'`,
            (rows) => new Map(rows.map((r) => [r.relname, r.n]))
          )
          const claimAndComplete = (expected: number) =>
            Effect.gen(function* () {
              const claimed = yield* storage.claim(claimOf(q, 1))
              assert.deepStrictEqual(
                claimed.map((c) => c.args),
                [{ n: expected }],
                "the lane's head, in order"
              )
              const results = yield* completeAll(claimed)
              assert.deepStrictEqual(
                results.map((r) => r._tag),
                ["Applied"]
              )
            })
          // Since migration 0021 prune carries unclaimed rows; the 0014 function, which still refuses
          // a slot holding one, keeps the two-slot span this test moves around the ring.
          const holdingTick = Effect.gen(function* () {
            yield* storage.rotate
            for (let i = 0; i < 32; i++) {
              const [r] = yield* sql<{ outcome: string }>`SELECT outcome FROM awa.prune_queue(10, 0, 0, 0, 0)`
              if (r!.outcome !== "Pruned") break
            }
          })
          yield* storage.enqueueMany([job(q, 0), job(q, 1)])
          let wrapped = 0
          for (let step = 1; step <= 20; step++) {
            // Seal the slot holding the previous step's two jobs, unclaimed, so prune must leave
            // it: the unpruned span is two slots, and it moves around the ring a slot per step.
            yield* storage.enqueueMany([job(q, 2 * step), job(q, 2 * step + 1)])
            yield* holdingTick
            const live = yield* liveSlots
            assert.isBelow(live.length, 16)
            const [ranges] = yield* sql<{ lo1: number; hi1: number; lo2: number; hi2: number }>`
              SELECT * FROM awa.queue_slot_ranges()`
            const covered = Array.from({ length: 16 }, (_, s) => s).filter(
              (s) => (s >= ranges!.lo1 && s <= ranges!.hi1) || (s >= ranges!.lo2 && s <= ranges!.hi2)
            )
            assert.deepStrictEqual(covered, live, `step ${step}: ranges ${JSON.stringify(ranges)}`)
            if (ranges!.lo2 <= ranges!.hi2) wrapped++
            const scanned = yield* sql.withTransaction(
              Effect.gen(function* () {
                // The first pair plans the statements again (the prune's TRUNCATE invalidated
                // them), and planning may probe any child's index; the second pair runs on the
                // cached plans, so its index scans are the executor's alone.
                yield* claimAndComplete(2 * step - 2)
                const before = yield* indexScans
                yield* claimAndComplete(2 * step - 1)
                const after = yield* indexScans
                return [...after]
                  .filter(([relname, n]) => n > (before.get(relname) ?? 0))
                  .map(([relname]) => relname)
              })
            )
            assert.isAbove(scanned.length, 0)
            for (const relname of scanned) {
              const slot = Number(relname.slice(relname.lastIndexOf("_") + 1))
              assert.include(
                live,
                slot,
                `step ${step}: ${relname} scanned, outside slots ${JSON.stringify(live)}`
              )
            }
          }
          assert.isAbove(wrapped, 0, "the unpruned span wrapped around the ring at least once")
        })
      ),
    60_000
  )

  it.live(
    "a claim whose slot ranges predate a rotation takes the lane's positions in order and loses nothing",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          // 0016's claim reads its slot ranges before its pick. If the ring rotates in between
          // and a job of the lane lands in the new slot, the pick cannot see that job. It must
          // still take the lane's positions in order, and its mark must not pass the new job.
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("rotate-race")
          yield* storage.enqueueMany([job(q, 1), job(q, 2)])
          // SHARE on `claims` from another session: the claim reads its cursor and its ranges,
          // then waits at its pick, the first statement that writes `claims`.
          const locked = yield* Deferred.make<void>()
          const letGo = yield* Deferred.make<void>()
          const holder = yield* Effect.gen(function* () {
            const c = yield* SqlClient.SqlClient
            yield* c.withTransaction(
              Effect.gen(function* () {
                yield* c`LOCK TABLE awa.claims IN SHARE MODE`
                yield* Deferred.succeed(locked, undefined)
                yield* Deferred.await(letGo)
              })
            )
          }).pipe(
            Effect.provide(eagerStorage(url, 1), { local: true }),
            Effect.forkChild({ startImmediately: true })
          )
          yield* Deferred.await(locked)
          const claiming = yield* Effect.forkChild(storage.claim(claimOf(q, 10)), { startImmediately: true })
          for (let waiting = false; !waiting; ) {
            const [row] = yield* sql<{ n: number }>`
              SELECT count(*)::int AS n FROM pg_locks
              WHERE locktype = 'relation' AND NOT granted AND relation = 'awa.claims'::regclass`
            waiting = row!.n > 0
            if (!waiting) yield* Effect.sleep("2 millis")
          }
          // while the claim waits: the ring rotates, and the lane's next job lands in the new slot
          assert.strictEqual(yield* storage.rotate, "Rotated")
          yield* storage.enqueueMany([job(q, 3)])
          const slots = yield* sql<{ slot: number }>`
            SELECT slot FROM awa.ready WHERE queue = ${q} ORDER BY lane_seq`
          assert.strictEqual(slots.length, 3)
          assert.strictEqual(slots[0]!.slot, slots[1]!.slot)
          assert.notStrictEqual(slots[2]!.slot, slots[0]!.slot, "the third job is in the new slot")
          yield* Deferred.succeed(letGo, undefined)
          yield* Fiber.join(holder)
          const first = yield* Fiber.join(claiming)
          assert.deepStrictEqual(
            first.map((c) => c.args),
            [{ n: 1 }, { n: 2 }],
            "the waiting claim took the lane's head in order, not the job of the new slot"
          )
          const second = yield* storage.claim(claimOf(q, 10))
          assert.deepStrictEqual(
            second.map((c) => c.args),
            [{ n: 3 }],
            "the next claim finds the job the first one could not see"
          )
          const results = yield* completeAll([...first, ...second])
          assert.deepStrictEqual(
            results.map((r) => r._tag),
            ["Applied", "Applied", "Applied"]
          )
        })
      ),
    30_000
  )

  it.live(
    "a claim in flight when a queue is paused never takes a job enqueued after the pause",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("pause-race")
          yield* storage.enqueueMany([job(q, 1)])
          // Hold the lane's claim lock from another session: the claim below finds the lane busy
          // and waits for it (up to 100 ms) after reading the queue's state, before its pick.
          const lockHeld = yield* Deferred.make<void>()
          const letGo = yield* Deferred.make<void>()
          const holder = yield* Effect.gen(function* () {
            const c = yield* SqlClient.SqlClient
            yield* c.withTransaction(
              Effect.gen(function* () {
                yield* c`SELECT pg_advisory_xact_lock(awa.lock_ns('claim'), awa.lane_key(${q}, 2, 0))`
                yield* Deferred.succeed(lockHeld, undefined)
                yield* Deferred.await(letGo)
              })
            )
          }).pipe(
            Effect.provide(eagerStorage(url, 1), { local: true }),
            Effect.forkChild({ startImmediately: true })
          )
          yield* Deferred.await(lockHeld)
          const claiming = yield* Effect.forkChild(storage.claim(claimOf(q, 10)), { startImmediately: true })
          // the claim has read the queue's state and now waits for the lane lock
          const sql = yield* SqlClient.SqlClient
          for (let waiting = false; !waiting; ) {
            const [row] = yield* sql<{ n: number }>`
              SELECT count(*)::int AS n FROM pg_locks
              WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
            waiting = row!.n > 0
            if (!waiting) yield* Effect.sleep("2 millis")
          }
          // while the claim waits: pause, then a new job; the holder then lets the claim go on
          yield* storage.pauseQueue(q)
          yield* storage.enqueueMany([job(q, 2)])
          yield* Deferred.succeed(letGo, undefined)
          yield* Fiber.join(holder)
          assert.deepStrictEqual(yield* Fiber.join(claiming), [], "nothing claimed from a paused queue")
          yield* storage.resumeQueue(q)
          const claimed = yield* storage.claim(claimOf(q, 10))
          assert.deepStrictEqual(
            claimed.map((c) => c.args),
            [{ n: 1 }, { n: 2 }]
          )
        })
      ),
    30_000
  )
})
