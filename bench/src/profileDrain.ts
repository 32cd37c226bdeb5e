/**
 * Profiles one system's drain and nothing else: enqueues a backlog, then records a V8 CPU
 * profile of this process only while the workers drain it (the `--cpu-prof` of `npm run bench`
 * covers the child's whole life: start-up, warm-up and the backlog's enqueue).
 *
 *   node bench/src/profileDrain.ts [--system awa] [--jobs 20000] [--profile tuned|defaults] [--warm 1000]
 *
 * `--profile` (Awa only): `tuned`, the comparison's setting (tracing off), or `defaults`, what a
 * user gets (tracing on with no tracer installed); see systems/awa.ts. Default `tuned`.
 * `--warm`: jobs drained by a first worker, started and stopped before the measured drain.
 * `--keep-database`: leave the drained database in place (its name is printed) to query it after.
 *
 * Writes bench/results/drain-<system>-<time>.cpuprofile (open it in Chrome DevTools or
 * speedscope) and prints jobs/s and this process's CPU per 1,000 jobs. Postgres: `DATABASE_URL`,
 * or a temporary embedded server with durability on.
 */
import { mkdirSync, writeFileSync } from "node:fs"
import { Session } from "node:inspector/promises"
import { join } from "node:path"
import { EmbeddedPostgres } from "@awa/testing"
import { Effect } from "effect"
import { createDatabase, databaseName, dropDatabase, withClient } from "./lib.ts"
import type { Profile, SystemName } from "./systems/types.ts"

const arg = (name: string, fallback: string) => {
  const i = process.argv.indexOf(name)
  return i >= 0 ? process.argv[i + 1]! : fallback
}
const system = arg("--system", "awa") as SystemName
const jobs = Number(arg("--jobs", "20000"))
const awaProfile = arg("--profile", "tuned") as Profile
const warm = Number(arg("--warm", "1000"))
const keepDatabase = process.argv.includes("--keep-database")
const resultsDir = join(import.meta.dirname, "..", "results")

const factories = {
  awa: async () => (await import("./systems/awa.ts")).make,
  "graphile-worker": async () => (await import("./systems/graphile.ts")).make,
  "pg-boss": async () => (await import("./systems/pgboss.ts")).make
} satisfies Record<SystemName, unknown>

const main = async () => {
  const server = process.env.DATABASE_URL
    ? undefined
    : await EmbeddedPostgres.startTemporary({ durable: true })
  const baseUrl = process.env.DATABASE_URL ?? server!.url
  const database = databaseName("profile_drain")
  const url = await Effect.runPromise(createDatabase(baseUrl, database))
  try {
    const adapter = await (await factories[system]())(url, { profile: awaProfile })
    await adapter.install()
    // Warm-up, as the bench's drain phase does: a first worker start (Awa's layer-owned
    // heartbeat thread, ~1 s of CPU, starts with it), JIT and plans, outside the measured interval.
    if (warm > 0) {
      await adapter.enqueueBatch(Array.from({ length: warm }, (_, i) => -1 - i))
      let warmed = 0
      await new Promise<void>((resolve) => {
        void adapter.startWorkers(() => {
          if (++warmed === warm) resolve()
        })
      })
      while ((await adapter.openJobs()) > 0) await new Promise((r) => setTimeout(r, 5))
      await adapter.stopWorkers()
    }
    for (let seq = 0; seq < jobs; seq += 1000)
      await adapter.enqueueBatch(Array.from({ length: Math.min(1000, jobs - seq) }, (_, i) => seq + i))
    let started = 0
    let resolveDone: () => void = () => {}
    const done = new Promise<void>((resolve) => {
      resolveDone = resolve
    })
    // statements and commits on the server during the drain (pg_stat_database counts transactions)
    const commits = () =>
      Effect.runPromise(
        withClient(
          baseUrl,
          (sql) =>
            sql<{
              n: string
            }>`SELECT xact_commit::text AS n FROM pg_stat_database WHERE datname = ${database}`
        )
      ).then((rows) => Number(rows[0]!.n))
    // as the peer bench does before each phase: no checkpoint (and its full-page writes) mid-drain
    await Effect.runPromise(withClient(baseUrl, (sql) => sql`CHECKPOINT`))
    const commits0 = await commits()
    // a marker for profilers of the server (perf, …) waiting for the drain to begin
    if (process.env.AWA_BENCH_MARK) writeFileSync(process.env.AWA_BENCH_MARK, "draining\n")
    const session = new Session()
    session.connect()
    await session.post("Profiler.enable")
    await session.post("Profiler.start")
    const cpu0 = process.cpuUsage()
    const t0 = performance.now()
    await adapter.startWorkers(() => {
      if (++started === jobs) resolveDone()
    })
    await done
    while ((await adapter.openJobs()) > 0) await new Promise((r) => setTimeout(r, 5))
    const ms = performance.now() - t0
    if (process.env.AWA_BENCH_MARK) writeFileSync(process.env.AWA_BENCH_MARK, "draining\ndrained\n")
    const cpu = process.cpuUsage(cpu0)
    const { profile } = await session.post("Profiler.stop")
    // the count is flushed by backends at transaction end, at most every 10 s: close first
    await adapter.stopWorkers()
    await new Promise((r) => setTimeout(r, 1000))
    const transactions = (await commits()) - commits0
    await adapter.close()
    mkdirSync(resultsDir, { recursive: true })
    const file = join(
      resultsDir,
      `drain-${system}${system === "awa" ? `-${awaProfile}` : ""}-${new Date().toISOString().replace(/[:.]/g, "-")}.cpuprofile`
    )
    writeFileSync(file, JSON.stringify(profile))
    const cpuMs = (cpu.user + cpu.system) / 1000
    console.log(
      `${system}${system === "awa" ? ` (${awaProfile})` : ""}: ${jobs} jobs in ${ms.toFixed(0)} ms = ${Math.round((jobs / ms) * 1000)} jobs/s; ` +
        `this process ${((cpuMs / jobs) * 1000).toFixed(1)} ms CPU per 1,000 jobs; ` +
        `~${transactions} transactions on the server (${(jobs / transactions).toFixed(1)} jobs each)\nprofile: ${file}`
    )
  } finally {
    if (keepDatabase) console.log(`database kept: ${database}`)
    else await Effect.runPromise(dropDatabase(baseUrl, database))
    await server?.stop()
  }
}

await main()
