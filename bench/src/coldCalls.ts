/**
 * What a call costs a process that has not made it before: Node's CPU per call over consecutive
 * ranges of calls (the first 100, the next 200, …), each layer in a fresh process of its own,
 * with the schema installed by another process first, as the harness's phases run
 * (docs/benchmarks.md, "Why the harness's drain cost Awa more"). V8 compiles a path only after a
 * few hundred calls, so a short phase measures mostly this.
 *
 *   node --conditions=@awa/source bench/src/coldCalls.ts [--layers select1,claim-empty,…] \
 *     [--ranges 100,300,1000,3000] [--runs 3]
 *
 * Layers: `select1` (`SELECT 1` through the pool: the driver and Effect's run loop),
 * `claim-rows` (a 100-row `SELECT` shaped as a claim's answer, per row), `claim-rows-lean` (the
 * same answer as migration 0061 leaves it: empty values and repeated times NULL), `claim-empty`
 * (`storage.claim` of an empty queue: its checks, the hot connection, the span), `enqueue-one`
 * (`storage.enqueueMany` of one job), `insert` (`client.insert`, tracing off). Prints the median
 * over `--runs` processes of each range's µs of CPU per call (per row for both `claim-rows` layers).
 * `DATABASE_URL`, or a temporary embedded server with durability on.
 */
import { execFile } from "node:child_process"
import { fileURLToPath } from "node:url"
import { Job } from "@awa/core"
import { Awa, AwaClient } from "@awa/runtime"
import { QueueStorage } from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, ManagedRuntime, Redacted, References, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { installInChild } from "./compare/childProcess.ts"
import {
  acquireServer,
  createDatabase,
  databaseName,
  dropDatabase,
  intArg,
  quantile,
  stringArg
} from "./lib.ts"

const layers = ["select1", "claim-rows", "claim-rows-lean", "claim-empty", "enqueue-one", "insert"] as const
type LayerName = (typeof layers)[number]

const ranges = stringArg("--ranges", "100,300,1000,3000").split(",").map(Number)

/** A claim's answer: its 16 columns, values as a drain's jobs have them. */
const claimShaped = `SELECT g::bigint AS job_id, 1::bigint AS run_lease, 1 AS attempt, 25 AS max_attempts,
  'bench'::text AS kind, 'bench_queue'::text AS queue, 2::smallint AS priority, jsonb_build_object('seq', g) AS args,
  '{}'::jsonb AS metadata, '{}'::text[] AS tags, '[]'::jsonb AS errors, now() AS run_at, now() AS created_at,
  now() AS claimed_at, now() + interval '5 min' AS deadline_at, NULL::jsonb AS progress
  FROM generate_series(1, 100) g`

/**
 * The same answer as claim and claim_keyed give it since migration 0061: empty values, `run_at`
 * equal to `created_at` and the call's times after the first row as NULL.
 */
const claimShapedLean = `SELECT g::bigint AS job_id, 1::bigint AS run_lease, 1 AS attempt, 25 AS max_attempts,
  'bench'::text AS kind, 'bench_queue'::text AS queue, 2::smallint AS priority, jsonb_build_object('seq', g) AS args,
  NULL::jsonb AS metadata, NULL::text[] AS tags, NULL::jsonb AS errors, NULL::timestamptz AS run_at, now() AS created_at,
  CASE WHEN g = 1 THEN now() END AS claimed_at, CASE WHEN g = 1 THEN now() + interval '5 min' END AS deadline_at,
  NULL::jsonb AS progress
  FROM generate_series(1, 100) g`

const Probe = Job.define({ kind: "probe", args: Schema.Struct({ seq: Schema.Number }), queue: "cold_probe" })

/** One layer's calls in this (fresh) process: CPU µs per call (per row for claim-rows*) by range. */
const measureHere = async (layer: LayerName, url: string) => {
  const runtime = ManagedRuntime.make(
    Awa.layerPg({ migrateOnStart: false, tracing: false }).pipe(
      Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 10 })),
      Layer.provideMerge(Layer.succeed(References.MinimumLogLevel, "Warn"))
    )
  )
  let seq = 0
  const call: Effect.Effect<unknown, unknown, SqlClient.SqlClient | QueueStorage | AwaClient.AwaClient> =
    layer === "select1"
      ? Effect.flatMap(SqlClient.SqlClient, (sql) => sql`SELECT 1`)
      : layer === "claim-rows" || layer === "claim-rows-lean"
        ? Effect.flatMap(SqlClient.SqlClient, (sql) =>
            sql.unsafe(layer === "claim-rows" ? claimShaped : claimShapedLean)
          )
        : layer === "claim-empty"
          ? Effect.flatMap(QueueStorage, (s) =>
              s.claim({ queue: "cold_empty", max: 100, deadlineMs: 0, agingIntervalMs: 0 })
            )
          : layer === "enqueue-one"
            ? Effect.flatMap(QueueStorage, (s) =>
                s.enqueueMany([{ kind: "probe", queue: "cold_probe", args: { seq: seq++ } }])
              )
            : Effect.flatMap(AwaClient.AwaClient, (c) => c.insert(Probe, { seq: seq++ }))
  // the pool's first connection, outside the figures
  await runtime.runPromise(Effect.flatMap(SqlClient.SqlClient, (sql) => sql`SELECT 1`))
  const perCall: Array<number> = []
  let done = 0
  for (const bound of ranges) {
    const cpu0 = process.cpuUsage()
    const n = bound - done
    for (; done < bound; done++) await runtime.runPromise(call)
    const cpu = process.cpuUsage(cpu0)
    perCall.push((cpu.user + cpu.system) / n / (layer.startsWith("claim-rows") ? 100 : 1))
  }
  await runtime.dispose()
  return perCall
}

/** Runs `layer` in a fresh process (this script, `--layer`), returns its figures. */
const measureApart = (layer: LayerName, url: string) =>
  new Promise<Array<number>>((resolve, reject) =>
    execFile(
      process.execPath,
      [
        ...process.execArgv,
        fileURLToPath(import.meta.url),
        "--layer",
        layer,
        "--url",
        url,
        "--ranges",
        ranges.join(",")
      ],
      { encoding: "utf8", timeout: 10 * 60_000 },
      (error, stdout, stderr) =>
        error === null
          ? resolve(JSON.parse(stdout.trim().split("\n").at(-1)!) as Array<number>)
          : reject(new Error(`${layer}: ${error.message}\n${stderr}`))
    )
  )

const program = Effect.gen(function* () {
  const chosen = stringArg("--layers", layers.join(",")).split(",") as Array<LayerName>
  for (const layer of chosen) if (!layers.includes(layer)) throw new Error(`unknown layer ${layer}`)
  const runs = intArg("--runs", 3)
  const server = yield* acquireServer
  const name = databaseName("cold_calls")
  const url = yield* createDatabase(server.url, name)
  yield* Effect.addFinalizer(() => dropDatabase(server.url, name).pipe(Effect.ignore))
  yield* installInChild("awa", url)
  const header = ranges.map((bound, i) => `calls ${i === 0 ? 1 : ranges[i - 1]! + 1}–${bound}`)
  console.log(`µs of CPU per call (claim-rows, claim-rows-lean: per row), median of ${runs} fresh processes`)
  console.log(["layer".padEnd(12), ...header.map((h) => h.padStart(16))].join(""))
  for (const layer of chosen) {
    const samples: Array<Array<number>> = []
    for (let r = 0; r < runs; r++) samples.push(yield* Effect.promise(() => measureApart(layer, url)))
    const cells = ranges.map((_, i) =>
      quantile(
        samples.map((s) => s[i]!).sort((a, b) => a - b),
        0.5
      ).toFixed(1)
    )
    console.log([layer.padEnd(12), ...cells.map((c) => c.padStart(16))].join(""))
  }
})

const layerArg = process.argv.indexOf("--layer")
if (layerArg >= 0) {
  const layer = process.argv[layerArg + 1] as LayerName
  measureHere(layer, stringArg("--url", "")).then(
    (perCall) => console.log(JSON.stringify(perCall)),
    (error: unknown) => {
      console.error(error)
      process.exitCode = 1
    }
  )
} else {
  Effect.runPromise(Effect.scoped(program)).catch((error: unknown) => {
    console.error(error)
    process.exitCode = 1
  })
}
