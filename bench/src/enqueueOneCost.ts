/**
 * Where a one-at-a-time insert's Node CPU goes (issue 17's enqueue-one goal): the same number of
 * sequential calls, one layer at a time, on one connection pool, each round interleaved:
 *
 * - `select 1`: a bare statement through `@effect/sql-pg` (the driver and the Effect runtime);
 * - `enqueue_one`: the storage function called with the storage layer's own statement text;
 * - `storage.enqueueMany`: the storage layer (its checks, the statement, the answer);
 * - `client.insert`: the public API (args encoded by the job's Schema, options merged).
 *
 * For each: this process's CPU (user + system) and the wall time per call, medians over rounds.
 * `--batch n` (n ≥ 2): the same layers for calls of n jobs each (`enqueue_batch` with the
 * storage's own argument text, `storage.enqueueMany`, `client.insertMany`), per job.
 *
 *   DATABASE_URL=postgres://… node bench/src/enqueueOneCost.ts [--calls 3000] [--rounds 5] [--tracing] [--batch 1000]
 */
import { Job } from "@awa/core"
import { Awa, AwaClient } from "@awa/runtime"
import { QueueStorage } from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, ManagedRuntime, Redacted, References, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { intArg, now, round } from "./lib.ts"

const url = process.env.DATABASE_URL
if (url === undefined) throw new Error("DATABASE_URL is required")
const calls = intArg("--calls", 3000)
const rounds = intArg("--rounds", 5)
const tracing = process.argv.includes("--tracing")
const batch = intArg("--batch", 1)

const Probe = Job.define({ kind: "probe", args: Schema.Struct({ seq: Schema.Number }), queue: "cost_probe" })

const runtime = ManagedRuntime.make(
  Awa.layerPg({ migrateOnStart: true, tracing }).pipe(
    Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 10 })),
    Layer.provideMerge(Layer.succeed(References.MinimumLogLevel, "Warn"))
  )
)

type CostProbe = readonly [string, (seq: number) => Effect.Effect<unknown, unknown, any>]

const seqs = (from: number) => Array.from({ length: batch }, (_, i) => from * batch + i)

/** `enqueue_batch`'s arguments as the storage renders them for jobs of one header (migration 0012). */
const header = JSON.stringify([
  {
    kind: "probe",
    queue: "cost_probe",
    priority: 2,
    metadata: {},
    tags: [],
    max_attempts: 25,
    run_at: null,
    unique_states: 0
  }
])

/** The driver's floor: one bare statement per call (in batch mode divided by the batch like the rest). */
const selectOne: CostProbe = ["select 1", () => Effect.flatMap(SqlClient.SqlClient, (sql) => sql`SELECT 1`)]

const batchProbes: ReadonlyArray<CostProbe> = [
  selectOne,
  [
    "enqueue_batch (SQL only)",
    (seq) =>
      Effect.flatMap(
        SqlClient.SqlClient,
        (sql) =>
          sql`SELECT job_ids FROM awa.enqueue_batch(${header}::jsonb,
          ${`[${seqs(seq)
            .map((n) => `{"seq":${n}}`)
            .join(",")}]`}::jsonb, ${null}::int[], ${null}::jsonb)`
      )
  ],
  [
    "storage.enqueueMany",
    (seq) =>
      Effect.flatMap(QueueStorage, (s) =>
        s.enqueueMany(seqs(seq).map((n) => ({ kind: "probe", queue: "cost_probe", args: { seq: n } })))
      )
  ],
  [
    "client.insertMany",
    (seq) =>
      Effect.flatMap(AwaClient.AwaClient, (c) =>
        c.insertMany(
          Probe,
          seqs(seq).map((n) => ({ seq: n }))
        )
      )
  ]
]

const oneProbes: ReadonlyArray<CostProbe> = [
  selectOne,
  [
    "enqueue_one (SQL only)",
    (seq) =>
      Effect.flatMap(
        SqlClient.SqlClient,
        (sql) =>
          sql`SELECT job_id, state FROM awa.enqueue_one(${"probe"}, ${"cost_probe"}, ${2}, ${`{"seq":${seq}}`}::jsonb,
          ${"{}"}::jsonb, ${null}::jsonb, ${25}, ${null}::timestamptz, ${null}::bytea, ${0})`
      )
  ],
  [
    "storage.enqueueMany",
    (seq) =>
      Effect.flatMap(QueueStorage, (s) =>
        s.enqueueMany([{ kind: "probe", queue: "cost_probe", args: { seq } }])
      )
  ],
  ["client.insert", (seq) => Effect.flatMap(AwaClient.AwaClient, (c) => c.insert(Probe, { seq }))]
]

const probes = batch > 1 ? batchProbes : oneProbes

const measure = async (probe: (seq: number) => Effect.Effect<unknown, unknown, any>, from: number) => {
  const cpu0 = process.cpuUsage()
  const t0 = now()
  await runtime.runPromise(
    Effect.forEach(
      Array.from({ length: calls }, (_, i) => from + i),
      probe,
      { discard: true }
    )
  )
  const wall = now() - t0
  const cpu = process.cpuUsage(cpu0)
  // per job: a call carries `batch` of them (`select 1` too is divided, to sit in the same column)
  return { cpuUs: (cpu.user + cpu.system) / calls / batch, wallUs: (wall * 1000) / calls / batch }
}

const median = (xs: ReadonlyArray<number>) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

const main = async () => {
  const results = new Map<string, Array<{ cpuUs: number; wallUs: number }>>()
  let seq = 0
  // warm-up (V8 compiles each path), then the rounds, each taking the next `calls` sequence numbers
  for (const [, probe] of probes) {
    await measure(probe, seq)
    seq += calls
  }
  for (let r = 0; r < rounds; r++)
    for (const [name, probe] of probes) {
      const m = await measure(probe, seq)
      seq += calls
      results.set(name, [...(results.get(name) ?? []), m])
    }
  console.log(
    `${calls} sequential calls of ${batch} job(s) × ${rounds} rounds, tracing ${tracing ? "on" : "off"}; ` +
      `medians per job${batch > 1 ? " (select 1: per call ÷ batch)" : ""}:`
  )
  for (const [name, ms] of results)
    console.log(
      `${name.padEnd(24)} CPU ${String(round(median(ms.map((m) => m.cpuUs)), 2)).padStart(7)} µs` +
        `   wall ${String(round(median(ms.map((m) => m.wallUs)), 2)).padStart(7)} µs`
    )
  await runtime.dispose()
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
