/**
 * One system's drain, several times in one process: a warm-up drain, then `--rounds` drains of
 * `--jobs`, each enqueued (not measured) and drained by a freshly started worker. Prints, per
 * drain, jobs/s and this process's CPU per job (every thread: main, V8's, Awa's heartbeat
 * thread). The first measured drain is what the harness's drain phase measures (20,000 after a
 * 1,000-job warm-up, V8 still compiling); the later ones show the same code warm. No profiler
 * runs (a CPU profile costs the drain a tenth or more), so it is the tool for A/B runs of a
 * change to the Node side: alternate builds, same sitting (docs/benchmarks.md, "The held attempts
 * in shared memory").
 *
 *   DATABASE_URL=postgres://…/postgres node --conditions=@awa/source bench/src/drainRounds.ts \
 *     [--system awa] [--jobs 20000] [--warm 1000] [--rounds 3] [--idle 0] [--analyze]
 *
 * `--idle ms`: the process idles this long before each drain, its backlog enqueued (the harness
 * waits up to 20 s for a quiet machine there). `--analyze`: `ANALYZE` and `CHECKPOINT` before each
 * drain, as the harness's drain phase does (cached plans are made again after it).
 *
 * The system is installed by a short-lived process of its own first, as the harness installs it
 * before it forks a phase's process, so this process has run none of the install's statements.
 * That matters: an Awa process that ran the migrations itself drained the same backlog with ~35 %
 * less CPU per job. V8's compiling of the driver's per-call path is part of it (docs/benchmarks.md,
 * "Why the harness's drain cost Awa more"), the collector's state another (a full GC forced before
 * the first drain took a third or more off it: "… V8's young generation"). `--install-here`: this
 * process installs it (the warmer process this tool measured before).
 *
 * A drain ends at the system's own count of acknowledged completions where it has one (as the
 * harness's drain phase), else when storage shows no open job. Without `DATABASE_URL`, an
 * embedded server with durability on.
 */
import { Effect } from "effect"
import { installInChild } from "./compare/childProcess.ts"
import {
  acquireServer,
  createDatabase,
  databaseName,
  dropDatabase,
  execute,
  intArg,
  stringArg,
  untilDrained,
  untilNoOpenJobs
} from "./lib.ts"
import { factories } from "./systems/factories.ts"
import type { SystemAdapter, SystemName } from "./systems/types.ts"

const system = stringArg("--system", "awa") as SystemName
const jobs = intArg("--jobs", 20_000)
const warm = intArg("--warm", 1000)
const rounds = intArg("--rounds", 3)
const idleMs = intArg("--idle", 0)
const analyze = process.argv.includes("--analyze")
const installHere = process.argv.includes("--install-here")

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Enqueues `n` jobs from `base`, then times a worker start and the drain of all of them. */
const drainOnce = async (adapter: SystemAdapter, url: string, n: number, base: number) => {
  for (let seq = 0; seq < n; seq += 1000)
    await adapter.enqueueBatch(Array.from({ length: Math.min(1000, n - seq) }, (_, i) => base + seq + i))
  if (idleMs > 0) await sleep(idleMs)
  if (analyze) {
    await Effect.runPromise(execute(url, "ANALYZE"))
    await Effect.runPromise(execute(url, "CHECKPOINT"))
  }
  const completed0 = adapter.completions?.() ?? 0
  let started = 0
  const cpu0 = process.cpuUsage()
  const t0 = performance.now()
  await new Promise<void>((resolve) => {
    void adapter.startWorkers(() => {
      if (++started === n) resolve()
    })
  })
  await untilDrained(adapter, completed0, n)
  const ms = performance.now() - t0
  const cpu = process.cpuUsage(cpu0)
  await untilNoOpenJobs(adapter)
  await adapter.stopWorkers()
  return { jobsPerSec: Math.round((n / ms) * 1000), cpuUsPerJob: (cpu.user + cpu.system) / n }
}

const program = Effect.gen(function* () {
  const server = yield* acquireServer
  const name = databaseName("drain_rounds")
  const url = yield* createDatabase(server.url, name)
  yield* Effect.addFinalizer(() => dropDatabase(server.url, name).pipe(Effect.ignore))
  if (!installHere) yield* installInChild(system, url)
  yield* Effect.promise(async () => {
    const adapter = await (await factories[system]())(url, { profile: "tuned" })
    await adapter.install()
    try {
      const w = await drainOnce(adapter, url, warm, -10_000_000)
      console.log(
        `${system} warm-up ${warm}: ${w.jobsPerSec} jobs/s, ${w.cpuUsPerJob.toFixed(1)} µs CPU per job`
      )
      for (let r = 1; r <= rounds; r++) {
        const d = await drainOnce(adapter, url, jobs, r * 10_000_000)
        console.log(
          `${system} drain ${r} of ${jobs}: ${d.jobsPerSec} jobs/s, ${d.cpuUsPerJob.toFixed(1)} µs CPU per job`
        )
      }
    } finally {
      await adapter.close()
    }
  })
})

Effect.runPromise(Effect.scoped(program)).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
