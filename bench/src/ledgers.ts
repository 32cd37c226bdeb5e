/**
 * Ledger probe (migration 0017, docs/adr/0013-ledger-retention.md): what an untrimmed ring ledger
 * costs, and what the first and the steady-state trims cost.
 *
 *   node bench/src/ledgers.ts                 # a ledger of 30 days at one queue rotation per 10 s
 *   node bench/src/ledgers.ts --days 365 --reps 50
 *
 * Fills the ledgers as `--days` of a busy install would have left them (queue ring: one rotation
 * and one prune per 10 s, each prune with a small roll-up, a copy ahead every 100th; history ring:
 * one rotation and prune per minute) and then times, median of `--reps` calls:
 * `status` (old: the oldest-unpruned query over every rotation, as before 0017; new: the newest
 * wrap only); the first trim (batches of 5,000 until none is full, as the leader does) and
 * `ledger_totals` before and after it (must be equal); a trim with nothing to do, before and after
 * a VACUUM of the ledgers; table sizes.
 *
 * Postgres: `DATABASE_URL`, or a temporary embedded server with durability on.
 */
import { Migrations } from "@awa/sql"
import { PgQueueStorage, QueueStorage } from "@awa/storage"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Layer, Redacted } from "effect"
import { Reactivity } from "effect/reactivity"
import {
  acquireServer,
  createDatabase,
  databaseName,
  dropDatabase,
  loadLine,
  now,
  round,
  stringArg
} from "./lib.ts"

const days = Number(stringArg("--days", "30"))
const reps = Number(stringArg("--reps", "30"))
const queueGenerations = days * 8640
const historyGenerations = days * 1440

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!
const timed = <A, E, R>(e: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const t = now()
    const a = yield* e
    return [now() - t, a] as const
  })
const medianMs = <A, E, R>(e: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const ms: Array<number> = []
    for (let i = 0; i < reps; i++) ms.push((yield* timed(e))[0])
    return round(median(ms), 3)
  })

const program = Effect.gen(function* () {
  const server = yield* acquireServer
  const name = databaseName("awa_ledgers")
  const url = yield* createDatabase(server.url, name)
  yield* Effect.addFinalizer(() => dropDatabase(server.url, name))
  yield* Migrations.migrate().pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })))
  const sql = yield* PgClient.makeClient({ url: Redacted.make(url) })
  yield* Console.log(
    `ledger probe: ${days} days (${queueGenerations} queue, ${historyGenerations} history generations); load ${loadLine()}`
  )
  // The ledgers of a long-running install: every generation below the current one pruned.
  yield* sql`
    INSERT INTO awa.ring_rotations (ring, generation, slot, rotated_at)
    SELECT 'queue', g, g % 16, now() - (${queueGenerations} - g) * interval '10 seconds'
    FROM generate_series(1, ${queueGenerations}) g`
  yield* sql`
    INSERT INTO awa.ring_prunes (ring, generation, slot, pruned_at, rollup)
    SELECT 'queue', g, g % 16, now() - (${queueGenerations} - g) * interval '10 seconds',
           jsonb_build_object('default:completed', 2000 + g % 7, 'default:failed', g % 3, 'mail:completed', 40)
    FROM generate_series(0, ${queueGenerations} - 1) g`
  yield* sql`
    INSERT INTO awa.history_copies (generation, slot, terminal_rows, rollup, keys)
    SELECT g, g % 16, 2000, '{"default:completed": 2000}', NULL
    FROM generate_series(0, ${queueGenerations} - 1, 100) g`
  yield* sql`
    INSERT INTO awa.ring_rotations (ring, generation, slot)
    SELECT 'history', g, g % 32 FROM generate_series(1, ${historyGenerations}) g`
  yield* sql`
    INSERT INTO awa.ring_prunes (ring, generation, slot, rollup)
    SELECT 'history', g, g % 32, '{"default:completed": 120000}' FROM generate_series(0, ${historyGenerations} - 1) g`
  yield* sql`ANALYZE awa.ring_rotations, awa.ring_prunes, awa.history_copies`

  const sizes = sql<{ rel: string; kb: number; n: number }>`
    SELECT c.relname AS rel, (pg_total_relation_size(c.oid) / 1024)::int AS kb,
           (SELECT count(*)::int FROM awa.ring_rotations) AS n
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'awa' AND c.relname IN ('ring_rotations', 'ring_prunes', 'history_copies') ORDER BY 1`
  const oldStatus = sql`
    SELECT q.generation, q.slot, h.generation AS history_generation,
           (SELECT min(r.generation) FROM awa.ring_rotations r
            WHERE r.ring = 'queue' AND r.generation < q.generation
              AND NOT EXISTS (SELECT 1 FROM awa.ring_prunes p WHERE p.ring = 'queue' AND p.generation = r.generation)) AS oldest
    FROM awa.ring_current('queue') q, awa.ring_current('history') h`
  const totals = sql<{ q: unknown; h: unknown }>`
    SELECT to_jsonb(awa.ledger_totals('queue')) AS q, to_jsonb(awa.ledger_totals('history')) AS h`

  yield* Effect.gen(function* () {
    const storage = yield* QueueStorage
    const before = yield* sizes
    const totalsBefore = yield* totals
    const [, statusBefore] = yield* timed(storage.status)
    // interleaved: old, new, old, new
    const oldMs: Array<number> = []
    const newMs: Array<number> = []
    for (let i = 0; i < reps; i++) {
      oldMs.push((yield* timed(oldStatus))[0])
      newMs.push((yield* timed(storage.status))[0])
    }
    const ledgerTotalsMs = yield* medianMs(totals)
    // the first trim, as the leader runs it: batches of 5,000 until none is full
    const calls: Array<number> = []
    let deleted = 0
    const t0 = now()
    for (;;) {
      const [ms, r] = yield* timed(storage.trimLedgers(5000))
      calls.push(ms)
      deleted += r.deleted
      if (!r.more) break
    }
    const firstTrimMs = now() - t0
    const totalsAfter = yield* totals
    const statusAfter = yield* storage.status
    const steadyTrimMs = yield* medianMs(storage.trimLedgers(5000))
    const statusNewAfterMs = yield* medianMs(storage.status)
    const ledgerTotalsAfterMs = yield* medianMs(totals)
    yield* sql`VACUUM awa.ring_rotations, awa.ring_prunes, awa.history_copies`.unprepared
    const after = yield* sizes
    const steadyTrimVacuumedMs = yield* medianMs(storage.trimLedgers(5000))
    const statusVacuumedMs = yield* medianMs(storage.status)
    const report = {
      days,
      ledgerRowsBefore: before[0]?.n,
      sizesKbBefore: Object.fromEntries(before.map((r) => [r.rel, r.kb])),
      statusOldMsMedian: round(median(oldMs), 3),
      statusNewMsMedian: round(median(newMs), 3),
      ledgerTotalsMsBefore: ledgerTotalsMs,
      firstTrim: {
        deleted,
        calls: calls.length,
        totalMs: round(firstTrimMs, 1),
        maxCallMs: round(Math.max(...calls), 1)
      },
      steadyTrimMsMedian: steadyTrimMs,
      statusNewAfterMsMedian: statusNewAfterMs,
      ledgerTotalsMsAfter: ledgerTotalsAfterMs,
      ledgerRowsAfter: after[0]?.n,
      steadyTrimMsMedianAfterVacuum: steadyTrimVacuumedMs,
      statusNewMsMedianAfterVacuum: statusVacuumedMs,
      sizesKbAfterVacuum: Object.fromEntries(after.map((r) => [r.rel, r.kb])),
      totalsEqual: JSON.stringify(totalsBefore) === JSON.stringify(totalsAfter),
      statusEqual:
        JSON.stringify(statusBefore, (_, v) => (typeof v === "bigint" ? String(v) : v)) ===
        JSON.stringify(statusAfter, (_, v) => (typeof v === "bigint" ? String(v) : v))
    }
    yield* Console.log(JSON.stringify(report, null, 2))
  }).pipe(
    Effect.provide(
      PgQueueStorage.layer().pipe(
        Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 2 }))
      )
    )
  )
  yield* Console.log(`load after ${loadLine()}`)
}).pipe(Effect.scoped, Effect.provide(Reactivity.layer))

NodeRuntime.runMain(program)
