/**
 * The Node side of a drain without a database: `Awa.layerSim` (the in-memory storage engine),
 * the bench's worker settings (`maxConcurrency` 50, tracing as the profile says) and its no-op
 * handler. This process's CPU per 1,000 jobs is then the runtime's own cost per job plus the
 * simulation's, with no Postgres process competing for the two cores: a steadier A/B of
 * runtime changes than `profileDrain.ts` on a shared machine (ADR 0031).
 *
 *   node bench/src/simDrain.ts [--jobs 20000] [--profile tuned|defaults] [--rounds 5]
 *
 * Prints CPU per 1,000 jobs and jobs/s for each round after a warm-up round, then the median.
 */
import { Job } from "@awa/core"
import { Awa, AwaClient, Handler } from "@awa/runtime"
import { Deferred, Effect, Layer, References, Schema } from "effect"
import { stringArg } from "./lib.ts"

const jobs = Number(stringArg("--jobs", "20000"))
const tuned = stringArg("--profile", "tuned") === "tuned"
const rounds = Number(stringArg("--rounds", "5"))

const BenchJob = Job.define({ kind: "bench", args: Schema.Struct({ seq: Schema.Number }), queue: "bench" })

/** One drain of `jobs`: enqueued first (not measured), then a worker started and run to the end. */
const drainOnce = Effect.gen(function* () {
  const client = yield* AwaClient.AwaClient
  for (let seq = 0; seq < jobs; seq += 1000)
    yield* client.insertMany(
      BenchJob,
      Array.from({ length: Math.min(1000, jobs - seq) }, (_, i) => ({ seq: seq + i }))
    )
  let started = 0
  const done = yield* Deferred.make<void>()
  const handler = Handler.handler(BenchJob, () =>
    Effect.sync(() => {
      if (++started === jobs) Deferred.doneUnsafe(done, Effect.void)
    })
  )
  const cpu0 = process.cpuUsage()
  const t0 = performance.now()
  yield* Effect.scoped(
    Effect.gen(function* () {
      yield* Layer.build(
        Awa.worker({
          queues: { bench: { maxConcurrency: 50 } },
          handlers: [handler],
          maintenance: false,
          ...(tuned ? { tracing: false } : {})
        })
      )
      yield* Deferred.await(done)
    })
  )
  const ms = performance.now() - t0
  const cpu = process.cpuUsage(cpu0)
  return { cpuPer1000: ((cpu.user + cpu.system) / 1000 / jobs) * 1000, jobsPerSecond: (jobs / ms) * 1000 }
})

const main = Effect.gen(function* () {
  yield* drainOnce // warm-up
  const results: Array<number> = []
  for (let round = 1; round <= rounds; round++) {
    const { cpuPer1000, jobsPerSecond } = yield* drainOnce
    results.push(cpuPer1000)
    console.log(
      `round ${round}: ${cpuPer1000.toFixed(1)} ms CPU per 1,000 jobs, ${Math.round(jobsPerSecond)} jobs/s`
    )
  }
  results.sort((a, b) => a - b)
  console.log(
    `${tuned ? "tuned" : "defaults"}: median ${results[Math.floor(results.length / 2)]!.toFixed(1)} ms CPU per 1,000 jobs (min ${results[0]!.toFixed(1)}, max ${results.at(-1)!.toFixed(1)})`
  )
})

await Effect.runPromise(
  main.pipe(
    Effect.provide(
      Awa.layerSim({ ...(tuned ? { tracing: false } : {}) }).pipe(
        Layer.provideMerge(Layer.succeed(References.MinimumLogLevel, "Warn"))
      )
    )
  )
)
