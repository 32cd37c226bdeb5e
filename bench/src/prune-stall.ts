/**
 * Prune-stall probe (docs/benchmarks.md, "What limits throughput" 5): how long a prune of one
 * drained ring slot takes, how long it holds ACCESS EXCLUSIVE on the slot's children, and how long
 * the slowest claim waits while it runs.
 *
 *   node bench/src/prune-stall.ts                              # 20k and 100k slots, retention 0 and 1 day
 *   node bench/src/prune-stall.ts --sizes 20000 --reps 3 --variants old,new
 *
 * Per case: one `enqueueMany` of N jobs (one ring slot), drained with claim(512) + complete(512);
 * `rotate` seals the slot; 2,000 jobs of another queue wait in the current slot. Then a probe
 * fiber calls `claim(max 1)` + complete (timed together) every `--interval` ms (default 5) while a lock watcher
 * polls `pg_locks` for the slot's `ready` child every ~1 ms, and `prune` runs (retried while it
 * answers Blocked). Reported: prune call time, attempts, exclusive hold as seen by the watcher
 * (first to last sample with the lock granted; resolution ~1 ms), the longest claim that
 * overlapped the prune call, and the median claim outside it.
 *
 * Variant `old` re-creates the prune functions of migrations 0003/0010 (as on main before 0013)
 * in the same database, so both variants run on one server, interleaved. Rotation is eager
 * (`rotateMinRows: 1`): each case seals its slot with one `rotate`.
 *
 * Postgres: `DATABASE_URL`, or a temporary embedded server with durability on.
 */
import type { NewJob } from "@awa/core"
import { Migrations, SqlText } from "@awa/sql"
import { type ClaimedJob, PgQueueStorage, QueueStorage, type RetentionParams } from "@awa/storage"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Fiber, Layer, Redacted } from "effect"
import { Reactivity } from "effect/reactivity"
import {
  acquireServer,
  createDatabase,
  databaseName,
  dropDatabase,
  loadLine,
  now,
  round,
  stringArg,
  table
} from "./lib.ts"

const sizes = stringArg("--sizes", "20000,100000").split(",").map(Number)
const reps = Number(stringArg("--reps", "2"))
const variants = stringArg("--variants", "old,new").split(",") as Array<"old" | "new">
const retentions = stringArg("--retention", "0,day").split(",")
const intervalMs = Number(stringArg("--interval", "5"))
const day = 86_400_000
const retentionOf = (r: string): RetentionParams =>
  r === "day"
    ? { completedMs: day, failedMs: 3 * day, cancelledMs: 3 * day }
    : { completedMs: 0, failedMs: 0, cancelledMs: 0 }

const newJobs = (queue: string, count: number): Array<NewJob> =>
  Array.from({ length: count }, (_, i) => ({ kind: "probe", queue, args: { seq: i } }))

const completeAll = (batch: ReadonlyArray<ClaimedJob>) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.finalizeMany(
      batch.map((j) => ({ jobId: j.jobId, runLease: j.runLease, outcome: { _tag: "Complete" as const } }))
    )
  )

const drainQueue = (queue: string) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    for (;;) {
      const batch = yield* storage.claim({ queue, max: 512, deadlineMs: 0, agingIntervalMs: 0 })
      if (batch.length === 0) return
      yield* completeAll(batch)
    }
  })

/** rotate + prune until nothing more is prunable (retention 0), so a case starts from a clean ring. */
const settle = Effect.gen(function* () {
  const storage = yield* QueueStorage
  for (let i = 0; i < 40; i++) {
    yield* storage.rotate
    const o = yield* storage.prune({ completedMs: 0, failedMs: 0, cancelledMs: 0 })
    if (o._tag === "Noop") return
    if (o._tag === "Blocked") yield* Effect.sleep("20 millis")
  }
})

/** Function bodies as on main before 0013 (0003's slot_has_unclaimed, 0010's prune_queue). */
const oldFunctions = (schema: string) => {
  const all = Migrations.loadMigrations()
  const pick = (version: number, name: string) => {
    const m = all.find((x) => x.version === version)!
    const stmt = SqlText.splitStatements(m.text.replaceAll(":AWA_SCHEMA", schema)).find((s) =>
      s.includes(`FUNCTION ${schema}.${name}(`)
    )!
    return stmt.replace(/^CREATE (OR REPLACE )?FUNCTION/m, "CREATE OR REPLACE FUNCTION")
  }
  return [pick(3, "slot_has_unclaimed"), pick(10, "prune_queue")]
}

interface Case {
  variant: string
  size: number
  retention: string
  pruneMs: number
  attempts: number
  outcomes: string
  holdMs: number
  maxClaimMs: number
  claimP50Ms: number
}

const runCase = (url: string, size: number, retention: string) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const sql = yield* PgClient.PgClient
    yield* settle
    yield* storage.enqueueMany(newJobs("big", size))
    yield* drainQueue("big")
    const [slotRow] = yield* sql<{ slot: number }>`SELECT slot FROM awa.ring_current('queue')`
    const slot = slotRow!.slot
    yield* storage.rotate
    yield* storage.enqueueMany(newJobs("probe", 2000))

    // lock watcher on its own connection
    const watcher = yield* PgClient.makeClient({ url: Redacted.make(url), applicationName: "probe-watch" })
    const rel = `awa.ready_${slot}`
    let firstGranted = -1
    let lastGranted = -1
    let watching = true
    const watch = Effect.gen(function* () {
      while (watching) {
        const rows = yield* watcher<{ granted: boolean }>`
          SELECT granted FROM pg_locks WHERE relation = ${rel}::regclass AND mode = 'AccessExclusiveLock'`
        const t = now()
        if (rows.some((r) => r.granted)) {
          if (firstGranted < 0) firstGranted = t
          lastGranted = t
        }
        yield* Effect.sleep("1 millis")
      }
    })
    // claim probe on its own pool
    const claims: Array<{ start: number; ms: number }> = []
    let probing = true
    const probe = Effect.gen(function* () {
      const s = yield* QueueStorage
      while (probing) {
        const start = now()
        const got = yield* s.claim({ queue: "probe", max: 1, deadlineMs: 0, agingIntervalMs: 0 })
        yield* completeAll(got).pipe(Effect.provideService(QueueStorage, s))
        claims.push({ start, ms: now() - start })
        yield* Effect.sleep(`${intervalMs} millis`)
      }
    }).pipe(
      Effect.provide(
        PgQueueStorage.layer({ rotateMinRows: 1, pruneCarryAfterMs: 0 }).pipe(
          Layer.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 2 }))
        )
      )
    )
    const wf = yield* Effect.forkChild(watch)
    const pf = yield* Effect.forkChild(probe)
    yield* Effect.sleep("300 millis")
    const outcomes: Array<string> = []
    let pruneStart = now()
    let pruneEnd = pruneStart
    for (let i = 0; i < 40; i++) {
      pruneStart = now()
      const o = yield* storage.prune(retentionOf(retention))
      pruneEnd = now()
      outcomes.push(o._tag === "Blocked" ? `B:${o.reason}` : o._tag)
      if (o._tag !== "Blocked") break
      yield* Effect.sleep("20 millis")
    }
    yield* Effect.sleep("200 millis")
    probing = false
    watching = false
    yield* Fiber.join(pf)
    yield* Fiber.join(wf)
    const during = claims.filter((c) => c.start + c.ms >= pruneStart && c.start <= pruneEnd)
    const outside = claims
      .filter((c) => !(c.start + c.ms >= pruneStart - 50 && c.start <= pruneEnd + 50))
      .map((c) => c.ms)
      .sort((a, b) => a - b)
    yield* drainQueue("probe")
    return {
      size,
      retention,
      pruneMs: round(pruneEnd - pruneStart, 1),
      attempts: outcomes.length,
      outcomes: outcomes.join(" "),
      holdMs: firstGranted < 0 ? 0 : round(lastGranted - firstGranted, 1),
      maxClaimMs: round(Math.max(0, ...during.map((c) => c.ms)), 1),
      claimP50Ms: round(outside[Math.floor(outside.length / 2)] ?? 0, 2)
    }
  }).pipe(Effect.scoped)

const program = Effect.gen(function* () {
  const server = yield* acquireServer
  const name = databaseName("awa_prune")
  const url = yield* createDatabase(server.url, name)
  yield* Effect.addFinalizer(() => dropDatabase(server.url, name))
  yield* Migrations.migrate().pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })))
  const admin = yield* PgClient.makeClient({ url: Redacted.make(url) })
  const newBodies = (yield* admin<{ def: string }>`
    SELECT pg_get_functiondef(p.oid) AS def FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = 'awa' AND p.proname IN ('slot_has_unclaimed', 'prune_queue')`).map((r) => r.def)
  const results: Array<Case> = []
  yield* Console.log(`prune-stall probe: load ${loadLine()}`)
  for (let rep = 0; rep < reps; rep++)
    for (const size of sizes)
      for (const retention of retentions)
        for (const variant of variants) {
          for (const stmt of variant === "old" ? oldFunctions("awa") : newBodies)
            yield* admin.unsafe(stmt).unprepared
          const r = yield* runCase(url, size, retention).pipe(
            Effect.provide(
              PgQueueStorage.layer({ rotateMinRows: 1, pruneCarryAfterMs: 0 }).pipe(
                Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 4 }))
              )
            )
          )
          const row = { variant, ...r }
          results.push(row)
          yield* Console.log(JSON.stringify(row))
        }
  yield* Console.log(
    `\n${table(
      [
        "variant",
        "slot rows",
        "retention",
        "prune ms",
        "attempts",
        "outcomes",
        "excl. hold ms",
        "max claim+complete ms",
        "p50 outside ms"
      ],
      results.map((r) => [
        r.variant,
        String(r.size),
        r.retention,
        String(r.pruneMs),
        String(r.attempts),
        r.outcomes,
        String(r.holdMs),
        String(r.maxClaimMs),
        String(r.claimP50Ms)
      ])
    )}`
  )
  yield* Console.log(`load after ${loadLine()}`)
}).pipe(Effect.scoped, Effect.provide(Reactivity.layer))

NodeRuntime.runMain(program)
