/**
 * What pruning one drained slot costs the server, in one backend: the figures behind
 * docs/benchmarks.md, "The history copy's floor". In a fresh database it enqueues `--jobs` into one
 * ring slot, claims and completes all of them, and seals the slot with a rotation. Then it times
 * `prune_queue` on that slot, each call on a new connection (a prune's TRUNCATE invalidates every
 * cached plan, so the leader's next prune plans again too) and rolled back, so that every call finds
 * the same slot: with a day's retention (the default: every completed row is copied into history,
 * the call answers 'Copied') and with none (nothing copied; the call prunes).
 *
 * `--sql <file>`: also times, interleaved, a prototype of `prune_queue` (one statement, e.g. an
 * earlier migration's text), installed inside each of its calls' transactions.
 *
 *   node --conditions=@awa/source bench/src/pruneCopyCost.ts [--jobs 20000] [--rounds 5] [--sql old.sql]
 *   DATABASE_URL=postgres://…/postgres node --conditions=@awa/source bench/src/pruneCopyCost.ts   # any server
 *
 * Read the figures as relative (one build against another, one retention against the other).
 */
import { readFileSync } from "node:fs"
import type { NewJob } from "@awa/core"
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
  intArg,
  loadLine,
  now,
  quantile,
  round,
  stringArg,
  table,
  withClient
} from "./lib.ts"

const jobs = intArg("--jobs", 20_000)
const rounds = intArg("--rounds", 5)
const prototypeFile = stringArg("--sql", "")
const day = 86_400_000

/** prune_queue's arguments: lock timeout, retention (completed, failed, cancelled), carry window, force, carry rows, idle end. */
const retentions = [
  { name: "a day", args: `50, ${day}, ${3 * day}, ${3 * day}, 0, 0, 1000, 0` },
  { name: "none", args: "50, 0, 0, 0, 0, 0, 1000, 0" }
]

/** One drained slot of `jobs`, sealed: the slot the next prune takes. */
const sealedSlot = (url: string) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const batch: Array<NewJob> = Array.from({ length: jobs }, (_, n) => ({
      kind: "probe",
      queue: "big",
      args: { n }
    }))
    yield* storage.enqueueMany(batch)
    for (;;) {
      const claimed = yield* storage.claim({ queue: "big", max: 512, deadlineMs: 0, agingIntervalMs: 0 })
      if (claimed.length === 0) break
      yield* storage.finalizeMany(
        claimed.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
      )
    }
    yield* storage.rotate
  }).pipe(
    Effect.provide(
      PgQueueStorage.layer({ rotateMinRows: 1, pruneCarryAfterMs: 0 }).pipe(
        Layer.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 2 }))
      )
    )
  )

/** The timed call's answer, carried out of its transaction as a failure so that it rolls back. */
class RolledBack {
  readonly ms: number
  constructor(ms: number) {
    this.ms = ms
  }
}

/** One prune call on a new connection, in a transaction rolled back; the call's wall time in ms. */
const timedPrune = (url: string, args: string, prototype: string | undefined) =>
  withClient(url, (sql) =>
    sql
      .withTransaction(
        Effect.gen(function* () {
          if (prototype !== undefined) yield* sql.unsafe(prototype).unprepared
          const start = now()
          yield* sql.unsafe(`SELECT outcome FROM awa.prune_queue(${args})`).unprepared
          return yield* Effect.fail(new RolledBack(now() - start))
        })
      )
      .pipe(
        Effect.catchIf(
          (e): e is RolledBack => e instanceof RolledBack,
          (e) => Effect.succeed(e.ms)
        )
      )
  )

const program = Effect.gen(function* () {
  const server = yield* acquireServer
  const name = databaseName("awa_prune_copy")
  const url = yield* createDatabase(server.url, name)
  yield* Effect.addFinalizer(() => dropDatabase(server.url, name))
  yield* Migrations.migrate().pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })))
  yield* sealedSlot(url)
  yield* withClient(url, (sql) => sql`ANALYZE`)
  const prototype =
    prototypeFile === "" ? undefined : readFileSync(prototypeFile, "utf8").replaceAll(":AWA_SCHEMA", "awa")
  const variants = [
    { name: "this build", sql: undefined },
    ...(prototype === undefined ? [] : [{ name: prototypeFile, sql: prototype }])
  ]
  yield* Console.log(
    `prune of a drained slot of ${jobs} completed jobs, ${rounds} rounds; load ${loadLine()}`
  )
  const samples = new Map<string, Array<number>>()
  for (let r = 0; r < rounds; r++)
    for (const retention of retentions)
      for (const variant of variants) {
        const ms = yield* timedPrune(url, retention.args, variant.sql)
        const key = `${variant.name}\u0000${retention.name}`
        samples.set(key, [...(samples.get(key) ?? []), ms])
      }
  const rows = [...samples].map(([key, ms]) => {
    const [variant, retention] = key.split("\u0000") as [string, string]
    const sorted = [...ms].sort((a, b) => a - b)
    const median = quantile(sorted, 0.5)
    return [
      variant,
      retention,
      round(median, 1),
      round(sorted[0]!, 1),
      round(sorted.at(-1)!, 1),
      round((median * 1000) / jobs, 2)
    ]
  })
  yield* Console.log(table(["build", "retention", "median ms", "min", "max", "µs per job"], rows))
  yield* Console.log(`load after ${loadLine()}`)
}).pipe(Effect.scoped, Effect.provide(Reactivity.layer))

NodeRuntime.runMain(program)
