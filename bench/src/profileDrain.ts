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
 * `--statements`: `pg_stat_statements` (if the server loads it) reset as the drain starts, and the
 * database's top statements by time at its end (nested ones too when it tracks them).
 * `--no-check`: no check after the interval that storage shows no open job (a prototype installed
 * by `AWA_BENCH_SQL` may leave the jobs view unable to tell).
 * `--alloc`: also a sampling allocation profile (.heapprofile beside the CPU profile), summarized
 * as bytes allocated per job by the allocating function.
 *
 * The interval ends at the system's own count of acknowledged completions where it has one (as
 * the bench's drain phase), else when storage shows no open job.
 *
 * Writes bench/results/drain-<system>-<time>.cpuprofile (open it in Chrome DevTools or
 * speedscope) and prints jobs/s, this process's CPU per 1,000 jobs and by thread (main, V8's
 * GC and compiler workers, the heartbeat thread), and the server's CPU per 1,000 jobs by
 * process, each backend of the drained database with the statement it ran last (Linux, a server
 * on this machine: the embedded one, or a local cluster). Postgres: `DATABASE_URL`, or a
 * temporary embedded server with durability on.
 */
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs"
import { Session } from "node:inspector/promises"
import { join } from "node:path"
import { EmbeddedPostgres } from "@awa/testing"
import { Effect } from "effect"
import { resetStatements, topStatements } from "./compare/observer.ts"
import {
  createDatabase,
  databaseName,
  dropDatabase,
  stringArg,
  untilDrained,
  untilNoOpenJobs,
  withClient
} from "./lib.ts"
import { factories } from "./systems/factories.ts"
import type { Profile, SystemName } from "./systems/types.ts"

const system = stringArg("--system", "awa") as SystemName
const jobs = Number(stringArg("--jobs", "20000"))
const awaProfile = stringArg("--profile", "tuned") as Profile
const warm = Number(stringArg("--warm", "1000"))
const keepDatabase = process.argv.includes("--keep-database")
const allocations = process.argv.includes("--alloc")
const statements = process.argv.includes("--statements")
/** `--no-check`: skip the check, after the interval, that storage shows no open job (for prototypes whose views it cannot read). */
const check = !process.argv.includes("--no-check")
const resultsDir = join(import.meta.dirname, "..", "results")

/**
 * CPU (utime + stime, ms) of every process named `postgres` on this machine, by pid, with its
 * title ("postgres: user db host idle", "postgres: walwriter", …). Linux only; the server must run
 * here (the embedded one, or a local cluster). A process that appears later counts from 0.
 */
const postgresCpu = () => {
  const byPid = new Map<number, { ms: number; title: string }>()
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8")
      if (!stat.includes("(postgres)")) continue
      const fields = stat.split(") ")[1]!.split(" ")
      const title = readFileSync(`/proc/${entry}/cmdline`, "utf8").replaceAll("\0", " ").trim()
      byPid.set(Number(entry), { ms: (Number(fields[11]) + Number(fields[12])) * 10, title })
    } catch {
      // the process ended between the listing and the read
    }
  }
  return byPid
}

/** CPU (ms) of each thread of this process, by thread id, with its name (main, V8 workers, libuv, worker threads). */
const threadCpu = () => {
  const byTid = new Map<number, { ms: number; name: string }>()
  for (const tid of readdirSync("/proc/self/task")) {
    try {
      const stat = readFileSync(`/proc/self/task/${tid}/stat`, "utf8")
      const name = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"))
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
      byTid.set(Number(tid), { ms: (Number(fields[11]) + Number(fields[12])) * 10, name })
    } catch {
      // the thread ended
    }
  }
  return byTid
}

/** The server's CPU between two samples, grouped by role: the drained database's backends, the rest by title. */
const serverCpuReport = (
  before: ReturnType<typeof postgresCpu>,
  after: ReturnType<typeof postgresCpu>,
  database: string
) => {
  const byRole = new Map<string, number>()
  const backends: Array<number> = []
  for (const [pid, { ms, title }] of after) {
    const spent = ms - (before.get(pid)?.ms ?? 0)
    if (spent <= 0) continue
    if (title.includes(` ${database} `)) backends.push(spent)
    else {
      const role = title
        .replace(/^postgres: /, "")
        .split(" ")[0]!
        .replace(/^\/.*/, "postmaster")
      byRole.set(role, (byRole.get(role) ?? 0) + spent)
    }
  }
  backends.sort((a, b) => b - a)
  const total = backends.reduce((a, b) => a + b, 0) + [...byRole.values()].reduce((a, b) => a + b, 0)
  return { total, backends, byRole }
}

/** Bytes allocated per job during the drain, by the function that allocated them (self), largest first. */
const summarizeAllocations = (profile: { head: AllocationNode }, jobs: number) => {
  const byFunction = new Map<string, number>()
  let total = 0
  const walk = (node: AllocationNode) => {
    const self = node.selfSize
    if (self > 0) {
      const { functionName, url, lineNumber } = node.callFrame
      const where = `${functionName || "(anonymous)"} ${url.replace(/^.*node_modules\//, "").replace(/^file:\/\/.*\/packages\//, "")}:${lineNumber + 1}`
      byFunction.set(where, (byFunction.get(where) ?? 0) + self)
      total += self
    }
    for (const child of node.children) walk(child)
  }
  walk(profile.head)
  const top = [...byFunction].sort((a, b) => b[1] - a[1]).slice(0, 25)
  return [
    `allocated (sampled): ${Math.round(total / jobs)} B per job`,
    ...top.map(([where, bytes]) => `  ${String(Math.round(bytes / jobs)).padStart(6)} B  ${where}`)
  ].join("\n")
}
interface AllocationNode {
  readonly callFrame: { functionName: string; url: string; lineNumber: number }
  readonly selfSize: number
  readonly children: ReadonlyArray<AllocationNode>
}

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
      // ends as the measured drain does: at the system's own count of acknowledged completions
      await untilDrained(adapter, 0, warm)
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
    // `--alloc`: also a sampling allocation profile of the drain (every 16 KiB allocated)
    if (allocations)
      await session.post("HeapProfiler.startSampling", {
        samplingInterval: 16384,
        includeObjectsCollectedByMajorGC: true,
        includeObjectsCollectedByMinorGC: true
      })
    if (statements) await Effect.runPromise(resetStatements(baseUrl))
    const completed0 = adapter.completions?.() ?? 0
    const server0 = postgresCpu()
    const threads0 = threadCpu()
    const cpu0 = process.cpuUsage()
    const t0 = performance.now()
    await adapter.startWorkers(() => {
      if (++started === jobs) resolveDone()
    })
    await done
    // The interval ends as the bench's drain phase does: at the system's own count of acknowledged
    // completions where it has one (polled every millisecond), else when storage has no open job.
    await untilDrained(adapter, completed0, jobs)
    const ms = performance.now() - t0
    if (process.env.AWA_BENCH_MARK) writeFileSync(process.env.AWA_BENCH_MARK, "draining\ndrained\n")
    const cpu = process.cpuUsage(cpu0)
    const server1 = postgresCpu()
    const threads1 = threadCpu()
    // for correctness only, outside the interval
    if (check) await untilNoOpenJobs(adapter)
    const serverCpu = serverCpuReport(server0, server1, database)
    // what each of the database's backends ran last: which part of the system it serves
    const lastQueries = await Effect.runPromise(
      withClient(
        baseUrl,
        (sql) =>
          sql<{ pid: number; query: string }>`
            SELECT pid, left(regexp_replace(query, '[[:space:]]+', ' ', 'g'), 70) AS query
            FROM pg_stat_activity WHERE datname = ${database} AND pid <> pg_backend_pid()`
      )
    )
    const { profile } = await session.post("Profiler.stop")
    const allocationProfile = allocations
      ? (await session.post("HeapProfiler.stopSampling")).profile
      : undefined
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
    if (allocationProfile !== undefined) {
      writeFileSync(file.replace(/\.cpuprofile$/, ".heapprofile"), JSON.stringify(allocationProfile))
      console.log(summarizeAllocations(allocationProfile, jobs))
    }
    const cpuMs = (cpu.user + cpu.system) / 1000
    console.log(
      `${system}${system === "awa" ? ` (${awaProfile})` : ""}: ${jobs} jobs in ${ms.toFixed(0)} ms = ${Math.round((jobs / ms) * 1000)} jobs/s; ` +
        `this process ${((cpuMs / jobs) * 1000).toFixed(1)} ms CPU per 1,000 jobs ` +
        `(user ${((cpu.user / 1000 / jobs) * 1000).toFixed(1)}, system ${((cpu.system / 1000 / jobs) * 1000).toFixed(1)}); ` +
        `~${transactions} transactions on the server (${(jobs / transactions).toFixed(1)} jobs each)\nprofile: ${file}`
    )
    // 10 ms clock ticks: read the figures as ±10 ms per process
    console.log(
      `server (processes on this machine): ${((serverCpu.total / jobs) * 1000).toFixed(1)} ms CPU per 1,000 jobs; ` +
        `this database's backends ${serverCpu.backends.join(" / ")} ms; ` +
        [...serverCpu.byRole].map(([role, ms]) => `${role} ${ms} ms`).join(", ")
    )
    const threadReport = [...threads1]
      .map(([tid, { ms, name }]) => ({
        name: tid === process.pid ? "main" : name,
        ms: ms - (threads0.get(tid)?.ms ?? 0)
      }))
      .filter((t) => t.ms > 0)
      .sort((a, b) => b.ms - a.ms)
    console.log(`this process by thread: ${threadReport.map((t) => `${t.name} ${t.ms} ms`).join(", ")}`)
    if (statements)
      for (const st of await Effect.runPromise(topStatements(baseUrl, url, jobs, 12)))
        console.log(
          `  statement ${String(st.msPer1000Jobs).padStart(4)} ms/1,000 jobs  ${String(st.calls).padStart(6)} calls  ` +
            `exec ${st.execMs} ms, plan ${st.planMs} ms  ${st.query.slice(0, 90)}`
        )
    for (const { pid, query } of lastQueries) {
      const spent = (server1.get(pid)?.ms ?? 0) - (server0.get(pid)?.ms ?? 0)
      if (spent > 0) console.log(`  ${String(spent).padStart(5)} ms  ${query}`)
    }
  } finally {
    if (keepDatabase) console.log(`database kept: ${database}`)
    else await Effect.runPromise(dropDatabase(baseUrl, database))
    await server?.stop()
  }
}

await main()
