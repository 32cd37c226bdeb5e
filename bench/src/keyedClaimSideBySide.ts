/**
 * Issue 20's cost proof with both claims in the same minutes: one worker process serving two
 * queues at once, `sbs_plain` (no key) and `sbs_keyed` (under a key policy, `--keys` keys at most
 * `--limit` in flight each), a producer inserting one job at a time into each in turn at
 * `--rate` jobs/s per queue. Every claim call of each queue is timed in Node's view (the call
 * `pickupTrace.ts` times), and the two are compared window by window.
 *
 * Why beside `keyedClaimPairs.ts`: there a pair's two runs are a minute apart, and this machine's
 * speed moves by a third between minutes (every call of one run, claims, finalizations and
 * maintenance alike, 30 % faster than the next), which is more than the 10 % being judged. Here
 * both kinds of claim share every moment: the machine's state, the process's garbage collections,
 * prune's exclusive locks, the finalizations they overlap. What still differs is the claim itself,
 * and what a dearer claim brings with it (it overlaps more of the other calls).
 *
 *   DATABASE_URL=postgres://… node --conditions=@awa/source bench/src/keyedClaimSideBySide.ts
 *     [--windows 8] [--seconds 30] [--keys 50] [--limit 2] [--rate 100] [--warm 5]
 *
 * `--aa`: the control (an A/A run): the second queue has no key policy and its jobs no key, so
 * both queues claim through the plain claim; what the ratio shows then is this measure's own
 * spread between two identical claims, the yardstick for the keyed run's ratio.
 *
 * `--sql <file>`: runs the file's statement (one: `runSqlFiles`) after the schema is installed,
 * e.g. an earlier migration's text of `claim_keyed`, to compare two builds of a function in the
 * same tool.
 *
 * Prints one row per window (each kind's claim p50 / p99, the p99 ratio, the calls that overlapped
 * a finalization) and, over all windows pooled, each kind's quantiles and the p99 ratio.
 */
import { Job } from "@awa/core"
import { Awa, AwaClient, Handler } from "@awa/runtime"
import { KeyGrants, QueueStorage } from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, ManagedRuntime, Redacted, References, Schema, Scope } from "effect"
import { createDatabase, databaseName, dropDatabase, intArg, now, quantile, round } from "./lib.ts"
import { runSqlFiles } from "./sqlFiles.ts"

const windows = intArg("--windows", 8)
const seconds = intArg("--seconds", 30)
const keys = intArg("--keys", 50)
const limit = intArg("--limit", 2)
const rate = intArg("--rate", 100)
const warmSeconds = intArg("--warm", 5)
/** `--aa`: the second queue is plain as well (the measure's control). */
const control = process.argv.includes("--aa")
const sqlFileAt = process.argv.indexOf("--sql")
const sqlFile = sqlFileAt > 0 ? process.argv[sqlFileAt + 1] : undefined
const serverUrl = process.env.DATABASE_URL
if (serverUrl === undefined) throw new Error("DATABASE_URL is required")

const plainQueue = "sbs_plain"
const keyedQueue = "sbs_keyed"
const policy = "sbs"
const Args = Schema.Struct({ seq: Schema.Number })
const PlainJob = Job.define({ kind: "sbs_plain", args: Args, queue: plainQueue })
const KeyedJob = Job.define({
  kind: "sbs_keyed",
  args: Args,
  queue: keyedQueue,
  ...(control ? {} : { concurrencyKey: ({ seq }: { readonly seq: number }) => `tenant-${seq % keys}` })
})

type Kind = "plain" | "keyed"
interface Call {
  readonly kind: Kind | "finalize"
  readonly start: number
  end: number
  jobs: number
}
/** The calls of the window being measured; `undefined` between windows (warm-up, the summary). */
let calls: Array<Call> | undefined

const timed = <A, E, R>(kind: Call["kind"], effect: Effect.Effect<A, E, R>, jobsOf: (a: A) => number) =>
  Effect.suspend(() => {
    const into = calls
    if (into === undefined) return effect
    const call: Call = { kind, start: now(), end: 0, jobs: 0 }
    return Effect.tap(effect, (a) =>
      Effect.sync(() => {
        call.end = now()
        call.jobs = jobsOf(a)
        into.push(call)
      })
    )
  })

/** The storage's claim (the plain queue's), keyed claim and finalization, each call timed. */
const timing = Layer.mergeAll(
  Layer.effect(
    QueueStorage,
    Effect.map(Effect.service(QueueStorage), (s) =>
      QueueStorage.of({
        ...s,
        // the control's second queue claims here too: timed as the keyed queue's claims
        claim: (params) =>
          timed(params.queue === keyedQueue ? "keyed" : "plain", s.claim(params), (jobs) => jobs.length),
        finalizeMany: (items) => timed("finalize", s.finalizeMany(items), () => items.length)
      })
    )
  ),
  Layer.effect(
    KeyGrants,
    Effect.map(Effect.service(KeyGrants), (g) =>
      KeyGrants.of({
        ...g,
        claim: (params) => timed("keyed", g.claim(params), (c) => (c._tag === "Claimed" ? c.jobs.length : 0))
      })
    )
  )
)

interface Stats {
  readonly n: number
  readonly p50: number
  readonly p99: number
  readonly overlapping: number
}

const overlapsAFinalize = (finalizes: ReadonlyArray<Call>) => (c: Call) =>
  finalizes.some((f) => f.start < c.end && f.end > c.start)

const statsOf = (all: ReadonlyArray<Call>, kind: Kind): Stats => {
  const mine = all.filter((c) => c.kind === kind)
  const sorted = mine.map((c) => c.end - c.start).sort((a, b) => a - b)
  const overlaps = overlapsAFinalize(all.filter((c) => c.kind === "finalize"))
  return {
    n: mine.length,
    p50: quantile(sorted, 0.5),
    p99: quantile(sorted, 0.99),
    overlapping: mine.filter(overlaps).length
  }
}

const main = Effect.gen(function* () {
  const name = databaseName("sbs")
  const url = yield* createDatabase(serverUrl, name)
  yield* Effect.addFinalizer(() => dropDatabase(serverUrl, name))
  const pg = PgClient.layer({
    url: Redacted.make(url),
    maxConnections: 10,
    applicationName: "keyed-side-by-side"
  })
  const base = Awa.layerPg({ migrateOnStart: true, tracing: false }).pipe(
    Layer.provideMerge(pg),
    Layer.provideMerge(Layer.succeed(References.MinimumLogLevel, "Warn"))
  )
  const runtime = ManagedRuntime.make(Layer.merge(base, timing.pipe(Layer.provide(base))))
  yield* Effect.addFinalizer(() => Effect.promise(() => runtime.dispose()))
  const run = <A, E>(effect: Effect.Effect<A, E, ManagedRuntime.ManagedRuntime.Services<typeof runtime>>) =>
    Effect.promise(() => runtime.runPromise(effect))
  if (sqlFile !== undefined) yield* run(runSqlFiles([sqlFile]))
  yield* run(Effect.flatMap(Effect.service(KeyGrants), (g) => g.create({ id: policy, maxInFlight: limit })))
  const client = yield* run(Effect.service(AwaClient.AwaClient))

  let started = 0
  const onStart = Effect.sync(() => {
    started++
  })
  const scope = yield* run(Scope.make())
  yield* run(
    Layer.buildWithScope(
      Awa.worker({
        queues: {
          [plainQueue]: { maxConcurrency: 50 },
          [keyedQueue]: control ? { maxConcurrency: 50 } : { maxConcurrency: 50, keyPolicy: policy }
        },
        handlers: [Handler.handler(PlainJob, () => onStart), Handler.handler(KeyedJob, () => onStart)],
        tracing: false,
        shutdownTimeout: "10 seconds"
      }),
      scope
    )
  )

  // One job at a time into each queue in turn, `rate` per second per queue, on a fixed schedule.
  let inserted = 0
  const offer = (secondsToRun: number) =>
    Effect.promise(async () => {
      const n = rate * 2 * secondsToRun
      const inserts: Array<Promise<unknown>> = []
      const t0 = now() + 5
      for (let i = 0; i < n; i++) {
        const wait = t0 + (i * 1000) / (rate * 2) - now()
        if (wait > 0) await new Promise((r) => setTimeout(r, wait))
        const seq = inserted++
        inserts.push(
          runtime.runPromise(
            seq % 2 === 0 ? client.insert(PlainJob, { seq }) : client.insert(KeyedJob, { seq })
          )
        )
      }
      await Promise.all(inserts)
      while (started < inserted) await new Promise((r) => setTimeout(r, 10))
    })

  yield* offer(warmSeconds)
  console.log(
    `${windows} windows of ${seconds} s; per queue ${rate} jobs/s; ` +
      (control
        ? `control: both queues plain ("keyed" below is ${keyedQueue}, without a key)`
        : `keyed: ${keys} keys at most ${limit} in flight each`)
  )
  console.log(
    "| window | claim p50 keyed / plain ms | claim p99 keyed / plain ms | keyed ÷ plain p99 | calls keyed / plain | overlapping a finalization, keyed / plain |"
  )
  console.log("| ---: | --- | --- | ---: | --- | --- |")
  const pooled: Array<Call> = []
  const ratios: Array<number> = []
  for (let w = 1; w <= windows; w++) {
    const these: Array<Call> = []
    calls = these
    yield* offer(seconds)
    calls = undefined
    pooled.push(...these)
    const k = statsOf(these, "keyed")
    const p = statsOf(these, "plain")
    ratios.push(k.p99 / p.p99)
    console.log(
      `| ${w} | ${round(k.p50, 3)} / ${round(p.p50, 3)} | ${round(k.p99, 3)} / ${round(p.p99, 3)} | ${round(k.p99 / p.p99, 2)} | ${k.n} / ${p.n} | ${k.overlapping} / ${p.overlapping} |`
    )
  }
  yield* run(Scope.close(scope, { _tag: "Success", value: undefined } as never))
  const k = statsOf(pooled, "keyed")
  const p = statsOf(pooled, "plain")
  const sortedRatios = [...ratios].sort((a, b) => a - b)
  console.log(
    `pooled: keyed p50 ${round(k.p50, 3)} p99 ${round(k.p99, 3)} ms over ${k.n} calls; plain p50 ${round(p.p50, 3)} p99 ${round(p.p99, 3)} ms over ${p.n} calls; ` +
      `p99 ratio ${round(k.p99 / p.p99, 3)}×, p50 ratio ${round(k.p50 / p.p50, 3)}×; ` +
      `per-window p99 ratio median ${round(quantile(sortedRatios, 0.5), 3)}× (${round(sortedRatios[0]!, 2)}–${round(sortedRatios.at(-1)!, 2)}), ` +
      `within 1.10× in ${ratios.filter((r) => r <= 1.1).length} of ${windows}`
  )
})

Effect.runPromise(Effect.scoped(main)).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
