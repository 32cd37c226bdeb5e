/**
 * A claim call's time in Node's view, one layer at a time (what pickup latency pays per claim
 * beyond the server's work): sequential calls on an otherwise idle process, each round
 * interleaved, for
 *
 * - `select 1`: a bare statement through the pool (the driver and the Effect runtime);
 * - `claim SQL via pool`: `claim(…, 1)` as the storage's statement text, through the pool;
 * - `storage.claim`: the storage layer (its checks, its hot connection, rows to `ClaimedJob`s);
 * - `storage.claim, empty queue`: the same call on a queue with no jobs.
 *
 * The claims take one job each from a backlog enqueued first. For each: this process's CPU and
 * the wall time per call, medians over rounds.
 *
 *   DATABASE_URL=postgres://… node --conditions=@awa/source bench/src/claimCallCost.ts [--calls 2000] [--rounds 5]
 */
import { Awa } from "@awa/runtime"
import { QueueStorage } from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, ManagedRuntime, Redacted, References } from "effect"
import { SqlClient } from "effect/sql"
import { createDatabase, databaseName, dropDatabase, intArg, now, quantile, round } from "./lib.ts"

const serverUrl = process.env.DATABASE_URL
if (serverUrl === undefined) throw new Error("DATABASE_URL is required")
const calls = intArg("--calls", 2000)
const rounds = intArg("--rounds", 5)

const queue = "cost_claim_call"
const params = { max: 1, deadlineMs: 0, agingIntervalMs: 0 }

type Probe = readonly [string, Effect.Effect<unknown, unknown, any>]
const probes: ReadonlyArray<Probe> = [
  ["select 1", Effect.flatMap(SqlClient.SqlClient, (sql) => sql`SELECT 1`)],
  [
    "claim SQL via pool",
    Effect.flatMap(
      SqlClient.SqlClient,
      (sql) => sql`SELECT * FROM awa.claim(${queue}, ${1}, ${0}::bigint, ${0}::bigint)`
    )
  ],
  ["storage.claim", Effect.flatMap(QueueStorage, (s) => s.claim({ queue, ...params }))],
  [
    "storage.claim, empty queue",
    Effect.flatMap(QueueStorage, (s) => s.claim({ queue: "cost_empty", ...params }))
  ]
]

const main = async () => {
  const name = databaseName("claim_call")
  const url = await Effect.runPromise(createDatabase(serverUrl, name))
  const runtime = ManagedRuntime.make(
    Awa.layerPg({ migrateOnStart: true, tracing: false }).pipe(
      Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 10 })),
      Layer.provideMerge(Layer.succeed(References.MinimumLogLevel, "Warn"))
    )
  )
  const backlog = (rounds + 1) * calls * 2
  for (let from = 0; from < backlog; from += 5000)
    await runtime.runPromise(
      Effect.flatMap(QueueStorage, (s) =>
        s.enqueueMany(
          Array.from({ length: 5000 }, (_, i) => ({ kind: "probe", queue, args: { n: from + i } }))
        )
      )
    )
  const measure = async (probe: Effect.Effect<unknown, unknown, any>, n: number) => {
    const cpu0 = process.cpuUsage()
    const t0 = now()
    await runtime.runPromise(Effect.forEach(Array.from({ length: n }), () => probe, { discard: true }))
    const wall = now() - t0
    const cpu = process.cpuUsage(cpu0)
    return { cpuUs: (cpu.user + cpu.system) / n, wallUs: (wall * 1000) / n }
  }
  for (const [, probe] of probes) await measure(probe, Math.min(200, calls))
  const results = new Map<string, Array<{ cpuUs: number; wallUs: number }>>()
  for (let r = 0; r < rounds; r++)
    for (const [label, probe] of probes) {
      const list = results.get(label) ?? []
      list.push(await measure(probe, calls))
      results.set(label, list)
    }
  const median = (xs: ReadonlyArray<number>) =>
    quantile(
      [...xs].sort((a, b) => a - b),
      0.5
    )
  console.log(`${calls} sequential calls × ${rounds} rounds; medians per call:`)
  for (const [label, list] of results)
    console.log(
      `${label.padEnd(28)} CPU ${String(round(median(list.map((x) => x.cpuUs)), 1)).padStart(7)} µs   wall ${String(round(median(list.map((x) => x.wallUs)), 1)).padStart(7)} µs`
    )
  await runtime.dispose()
  await Effect.runPromise(dropDatabase(serverUrl, name))
}

main().catch((error) => {
  console.error(error)
  process.exit(1)
})
