/**
 * A steady drain with a producer, for one system in this process: jobs/s sustained, and the
 * process's memory over time (what a worker's container must hold). A producer keeps a backlog
 * of 2,000–3,000 jobs (a batch of 1,000 through the system's batch API whenever fewer than 3,000
 * are inserted and not started); the system's workers (50 in flight, the comparison's settings,
 * see systems/) drain it. Every `--every` seconds a full GC is forced and the interval's jobs/s
 * and the memory after it are printed. A heap that keeps growing after GC is state the system
 * retains per job; RSS also holds what V8 keeps reserved (heapTotal), other threads (Awa's
 * heartbeat thread) and the driver's buffers.
 *
 *   node --expose-gc --conditions=@awa/source bench/src/soak.ts [--system awa] [--seconds 60]
 *     [--every 10] [--profile tuned|defaults] [--rate n]
 *
 * `--rate n`: n jobs/s offered (in batches every 10 ms) instead of a standing backlog.
 *
 * One system per process, so that each one's memory is its own: run it once per system (the
 * order alternating) to compare. Postgres: `DATABASE_URL`, or a temporary embedded server with
 * durability on; a fresh database each run.
 */
import { EmbeddedPostgres } from "@awa/testing"
import { Effect } from "effect"
import { createDatabase, databaseName, dropDatabase, intArg, stringArg } from "./lib.ts"
import { factories } from "./systems/factories.ts"
import type { Profile, SystemName } from "./systems/types.ts"

const system = stringArg("--system", "awa") as SystemName
const profile = stringArg("--profile", "tuned") as Profile
const seconds = intArg("--seconds", 60)
const every = intArg("--every", 10)
/** Jobs per second offered; 0 (the default): as many as the workers take. */
const rate = intArg("--rate", 0)
const gc = (globalThis as { gc?: () => void }).gc
if (gc === undefined) throw new Error("run with node --expose-gc")

const mb = (bytes: number) => (bytes / 1e6).toFixed(1)

const main = async () => {
  const server = process.env.DATABASE_URL
    ? undefined
    : await EmbeddedPostgres.startTemporary({ durable: true })
  const baseUrl = process.env.DATABASE_URL ?? server!.url
  const database = databaseName("soak")
  const url = await Effect.runPromise(createDatabase(baseUrl, database))
  try {
    const adapter = await (await factories[system]())(url, { profile })
    await adapter.install()
    let started = 0
    await adapter.startWorkers(() => {
      started++
    })
    console.log(
      `${system} ${adapter.version} (${system === "awa" ? profile : "its settings"}), ${seconds} s, ${rate > 0 ? `${rate} jobs/s offered` : "a standing backlog"}`
    )
    console.log("seconds  jobs/s  heapUsed MB  heapTotal MB  external MB  rss MB   (memory after a full GC)")
    let inserted = 0
    const t0 = performance.now()
    let mark = { at: t0, started: 0 }
    let peakRss = 0
    while (performance.now() - t0 < seconds * 1000) {
      // at `--rate`: what is due by now, in one batch per 10 ms; else a backlog of 2,000-3,000
      const due = rate > 0 ? Math.floor(((performance.now() - t0) * rate) / 1000) - inserted : 0
      if (rate > 0 ? due > 0 : inserted - started < 3000) {
        const n = rate > 0 ? due : 1000
        const from = inserted
        inserted += n
        await adapter.enqueueBatch(Array.from({ length: n }, (_, i) => from + i))
      } else await new Promise((resolve) => setTimeout(resolve, 10))
      const now = performance.now()
      if (now - mark.at >= every * 1000) {
        const startedPerSecond = ((started - mark.started) * 1000) / (now - mark.at)
        mark = { at: now, started }
        gc!()
        const m = process.memoryUsage()
        peakRss = Math.max(peakRss, m.rss)
        console.log(
          [
            String(Math.round((now - t0) / 1000)).padStart(7),
            String(Math.round(startedPerSecond)).padStart(7),
            mb(m.heapUsed).padStart(12),
            mb(m.heapTotal).padStart(13),
            mb(m.external).padStart(12),
            mb(m.rss).padStart(7)
          ].join(" ")
        )
      }
    }
    console.log(
      `${system}: ${started} jobs started in ${seconds} s (${Math.round(started / seconds)} jobs/s), peak rss after GC ${mb(peakRss)} MB`
    )
    await adapter.stopWorkers()
    await adapter.close()
  } finally {
    await Effect.runPromise(dropDatabase(baseUrl, database))
    await server?.stop()
  }
}

main().catch((error) => {
  console.error(error)
  process.exitCode = 1
})
