/**
 * Idle-queues probe (docs/benchmarks.md, "Many idle queues"; issue 14 property 5): one worker
 * process serving `--queues` queues (default 1,000) with no work. Measured over `--window`
 * seconds after `--warmup` seconds: `claim` calls per second (server-side, from
 * `pg_stat_user_functions` with `track_functions = 'pl'`), and the server CPU of the database's
 * backends (utime + stime from /proc, so the server must run on this machine). Then the pickup
 * latency of one job per probe on a random queue, woken by its NOTIFY.
 *
 *   node bench/src/idle-queues.ts                          # 1,000 queues, default idle polling
 *   node bench/src/idle-queues.ts --mode fixed             # the old fixed 200 ms poll, for comparison
 *   node bench/src/idle-queues.ts --queues 200 --warmup 60 --window 30
 *
 * Postgres: `DATABASE_URL` (a superuser, on this machine), or a temporary embedded server.
 */
import { readFileSync } from "node:fs"
import { Job } from "@awa/core"
import { Awa, AwaClient, Handler, type Worker } from "@awa/runtime"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Clock, Console, Deferred, Effect, Layer, Redacted, Schema } from "effect"
import {
  acquireServer,
  createDatabase,
  databaseName,
  dropDatabase,
  execute,
  loadLine,
  round,
  stringArg
} from "./lib.ts"

const queueCount = Number(stringArg("--queues", "1000"))
const warmupS = Number(stringArg("--warmup", "90"))
const windowS = Number(stringArg("--window", "60"))
const mode = stringArg("--mode", "backoff") as "backoff" | "fixed"
const probes = Number(stringArg("--probes", "20"))

const Probe = Job.define({ kind: "idle_probe", args: Schema.Struct({ sentAt: Schema.Number }), queue: "iq0" })

/** utime + stime of a process, in seconds (Linux /proc; 0 when the process is gone). */
const cpuSeconds = (pid: number) => {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ")
    return (Number(fields[11]) + Number(fields[12])) / 100
  } catch {
    return 0
  }
}

const sample = (sql: PgClient.PgClient, db: string) =>
  Effect.gen(function* () {
    const [calls] = yield* sql<{ n: number }>`
      SELECT coalesce(sum(calls), 0)::float8 AS n FROM pg_stat_user_functions WHERE funcname = 'claim'`
    const pids = yield* sql<{ pid: number }>`SELECT pid FROM pg_stat_activity WHERE datname = ${db}`
    const cpu = pids.reduce((a, p) => a + cpuSeconds(p.pid), 0)
    return { calls: calls!.n, cpu, backends: pids.length, at: performance.now() }
  })

const program = Effect.gen(function* () {
  const server = yield* acquireServer
  const db = databaseName("awa_idle")
  const url = yield* createDatabase(server.url, db)
  yield* execute(server.url, `ALTER DATABASE ${db} SET track_functions = 'pl'`)
  yield* Effect.addFinalizer(() => dropDatabase(server.url, db))
  const latencies: Array<number> = []
  let picked: Deferred.Deferred<void> | undefined
  const queues = Array.from({ length: queueCount }, (_, i) => `iq${i}`)
  const poll: Worker.QueueOptions =
    mode === "fixed" ? { pollInterval: "200 millis", idlePollMax: "200 millis" } : {}
  const worker = Awa.worker({
    queues: Object.fromEntries(queues.map((q) => [q, poll])),
    handlers: [
      Handler.handler(Probe, (args) =>
        Effect.flatMap(Clock.currentTimeMillis, (t) =>
          Effect.suspend(() => {
            latencies.push(t - args.sentAt)
            return picked === undefined ? Effect.void : Deferred.succeed(picked, undefined)
          })
        )
      )
    ]
  })
  const pg = PgClient.layer({ url: Redacted.make(url), maxConnections: 10 })
  const stack = worker.pipe(Layer.provideMerge(Awa.layerPg({ migrateOnStart: true })), Layer.provideMerge(pg))
  yield* Effect.gen(function* () {
    const sql = yield* PgClient.PgClient
    const client = yield* AwaClient.AwaClient
    yield* Console.log(`${queueCount} queues, mode ${mode}; warming up ${warmupS} s`)
    yield* Effect.sleep(`${warmupS} seconds`)
    const a = yield* sample(sql, db)
    yield* Effect.sleep(`${windowS} seconds`)
    const b = yield* sample(sql, db)
    const seconds = (b.at - a.at) / 1000
    for (let i = 0; i < probes; i++) {
      picked = yield* Deferred.make<void>()
      const q = queues[Math.floor(Math.random() * queues.length)]!
      yield* client.insert(Probe, { sentAt: yield* Clock.currentTimeMillis }, { queue: q })
      yield* Deferred.await(picked)
      yield* Effect.sleep("200 millis")
    }
    const sorted = [...latencies].sort((x, y) => x - y)
    const result = {
      queues: queueCount,
      mode,
      windowS: round(seconds, 1),
      claimCallsPerS: round((b.calls - a.calls) / seconds, 1),
      serverCpuCores: round((b.cpu - a.cpu) / seconds, 3),
      backends: b.backends,
      pickupMsP50: sorted[Math.floor(sorted.length / 2)],
      pickupMsMax: sorted.at(-1),
      load: loadLine()
    }
    yield* Console.log(JSON.stringify(result))
  }).pipe(Effect.provide(stack))
})

NodeRuntime.runMain(Effect.scoped(program))
