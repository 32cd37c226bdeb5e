/**
 * Maintenance costs what it finds (0040). Index scans Postgres counts for the current transaction
 * tell the plans apart without timing anything:
 * - prune's young-attempts test, on a sealed slot whose old claims are closed and whose newest
 *   are open (a slot being drained), answers from the newest claim: it used to probe closures
 *   once per claim of its window, oldest first;
 * - claim_resumed and the callback rescue, with nothing to take, plan and lock no ring table
 *   (their statements cost 40-80 ms to plan on a connection's first call).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, withEagerDatabase } from "./pgFixtures.ts"

/** Index scans of a ring table's children so far in this transaction. */
const indexScansSql = (table: string) => `
  SELECT coalesce(sum(pg_stat_get_xact_numscans(x.indexrelid)), 0)::int AS n
  FROM pg_inherits i JOIN pg_index x ON x.indrelid = i.inhrelid
  WHERE i.inhparent = 'awa.${table}'::regclass`

const scansDuring = <A, E, R>(tables: ReadonlyArray<string>, body: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const scans = Effect.forEach(tables, (t) =>
      Effect.map(sql.unsafe<{ n: number }>(indexScansSql(t)), (r) => r[0]!.n)
    )
    return yield* sql.withTransaction(
      Effect.gen(function* () {
        const before = yield* scans
        const value = yield* body
        const after = yield* scans
        return { value, scans: after.map((n, i) => n - before[i]!) }
      })
    )
  })

/**
 * A sealed slot being drained: 2,000 claims closed, then 10 newer ones still running (a later
 * claim call), and the ring rotated past it.
 */
const drainingSlot = (label: string) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const sql = yield* SqlClient.SqlClient
    const q = fresh(label)
    yield* storage.enqueueMany(Array.from({ length: 2010 }, (_, n) => ({ kind: "k", queue: q, args: { n } })))
    const old = yield* storage.claim(claimOf(q, 2000))
    yield* completeAll(old)
    // a later claimed_at than the closed ones, whatever the clock's resolution
    yield* sql`SELECT pg_sleep(0.01)`
    const running = yield* storage.claim(claimOf(q, 10))
    assert.deepStrictEqual([old.length, running.length], [2000, 10])
    yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 })
  })

/** One prune tick with the storage layer's defaults: a day's retention, a 10-minute carry threshold. */
const pruneTick = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql<{ outcome: string }>`
    SELECT outcome FROM awa.prune_queue(10, 86400000::bigint, 86400000::bigint, 86400000::bigint,
                                        600000::bigint, 0, 1000, 0::bigint)`
)

describe("maintenance costs what it finds (0040)", () => {
  it.live(
    "prune's young-attempts test on a slot being drained probes closures a bounded number of times",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          yield* drainingSlot("young")
          const { value, scans } = yield* scansDuring(["closures"], pruneTick)
          assert.strictEqual(value[0]!.outcome, "Blocked:young_attempts")
          // newest first: the first claim looked at is open (was one probe per closed claim: 2,000)
          assert.isBelow(scans[0]!, 20, `closures index scans: ${scans[0]}`)
        })
      ),
    120_000
  )

  it.live(
    "a tick on a slot being drained answers young_attempts from its newest claim without reading the slot (0048)",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          yield* drainingSlot("draining")
          // rows the call read from the claims and closures children, by sequential or index scan
          const read = sql<{ n: number }>`
            SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(x.oid)), 0)::int AS n
            FROM (SELECT i.inhrelid AS oid FROM pg_inherits i
                  WHERE i.inhparent IN ('awa.claims'::regclass, 'awa.closures'::regclass)
                  UNION ALL
                  SELECT x.indexrelid FROM pg_inherits i JOIN pg_index x ON x.indrelid = i.inhrelid
                  WHERE i.inhparent IN ('awa.claims'::regclass, 'awa.closures'::regclass)) x`
          const [before, [tick], after] = yield* sql.withTransaction(Effect.all([read, pruneTick, read]))
          assert.strictEqual(tick!.outcome, "Blocked:young_attempts")
          // 0044 counted both children first: 2,010 claims and 2,000 closures read
          const rows = after[0]!.n - before[0]!.n
          assert.isBelow(rows, 50, `claims and closures rows read: ${rows}`)
        })
      ),
    120_000
  )

  it.live("a slot whose newest claim is closed but an older young one is open is still left alone", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("older-open")
        yield* storage.enqueueMany(
          Array.from({ length: 110 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
        )
        const running = yield* storage.claim(claimOf(q, 10))
        yield* sql`SELECT pg_sleep(0.01)`
        yield* completeAll(yield* storage.claim(claimOf(q, 100)))
        assert.strictEqual(running.length, 10)
        yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 })
        const [tick] = yield* pruneTick
        assert.strictEqual(tick!.outcome, "Blocked:young_attempts")
      })
    )
  )

  it.live("with nothing to take, claim_resumed and the callback rescue lock no ring table", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("gates")
        yield* storage.enqueueMany(
          Array.from({ length: 50 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
        )
        const claimed = yield* storage.claim(claimOf(q, 50))
        assert.strictEqual(claimed.length, 50)
        // A statement over the ring is planned and run with a lock on every child it may read
        // (run-time pruning comes later): the locks this transaction holds show whether one ran.
        const [taken, ringLocks] = yield* sql.withTransaction(
          Effect.all([
            Effect.all([
              sql<{ job_id: string }>`SELECT job_id FROM awa.claim_resumed(${q}, 100)`,
              sql<{ job_id: string }>`SELECT job_id FROM awa.rescue('callback', 0::bigint, 100)`
            ]),
            Effect.map(
              sql<{ n: number }>`
                SELECT count(*)::int AS n FROM pg_locks l JOIN pg_inherits i ON i.inhrelid = l.relation
                WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'
                  AND i.inhparent IN ('awa.claims'::regclass, 'awa.closures'::regclass, 'awa.ready'::regclass)`,
              (rows) => rows[0]!.n
            )
          ])
        )
        assert.deepStrictEqual(
          taken.map((rows) => rows.length),
          [0, 0]
        )
        assert.strictEqual(ringLocks, 0, "ring children locked by claim_resumed or the callback rescue")
      })
    )
  )
})
