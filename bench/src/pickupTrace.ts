/**
 * A per-job timeline of pickups at a fixed rate, to find where a tail comes from (issue 20's
 * keyed p99). One process, as the harness's latency phase: a producer inserts one job at a time
 * at `--rate` jobs/s for `--seconds`, a worker (50 in flight, tracing off) runs them, and every
 * storage call the worker makes on the hot path (claim, keyed claim, finalize, closure
 * notification) and every signal it receives is logged with its start and end. For the slowest
 * jobs it prints what happened between their insert's commit and their start, and for all jobs
 * where the pickup's time goes, by segment (commit → wake-up → claim start → claim end → start).
 *
 *   DATABASE_URL=postgres://… node bench/src/pickupTrace.ts [--keys 50] [--limit 2] [--rate 200]
 *     [--seconds 20] [--warm 2] [--slowest 20] [--linger 1]
 *
 * `--keys 0`: no keys (the plain claim). Writes bench/results/pickup-trace-<time>.json.
 */
import { writeFileSync } from "node:fs"
import { join } from "node:path"
import { Job } from "@awa/core"
import { Awa, AwaClient, Handler } from "@awa/runtime"
import { KeyGrants, QueueStorage, StorageSignals } from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, ManagedRuntime, Redacted, References, Schema, Scope, Stream } from "effect"
import { resetStatements, topStatements } from "./compare/observer.ts"
import { createDatabase, databaseName, dropDatabase, intArg, now, quantile, round } from "./lib.ts"

const keys = intArg("--keys", 50)
const limit = intArg("--limit", 2)
const rate = intArg("--rate", 200)
const seconds = intArg("--seconds", 20)
const warmSeconds = intArg("--warm", 2)
const slowest = intArg("--slowest", 20)
/** `--linger ms`: the completion batcher's linger (`completion.linger`); default the worker's (1 ms). */
const lingerMs = process.argv.includes("--linger") ? intArg("--linger", 1) : undefined
/** `--no-closed`: closure notifications are dropped (to price them; gated claimers then wait for their poll). */
const noClosed = process.argv.includes("--no-closed")
/** `--statements`: the database's statements (pg_stat_statements) over the measured interval, by total time. */
const statements = process.argv.includes("--statements")
const serverUrl = process.env.DATABASE_URL
if (serverUrl === undefined) throw new Error("DATABASE_URL is required")

const queue = "trace"
const TraceJob = Job.define({
  kind: "trace",
  args: Schema.Struct({ seq: Schema.Number }),
  queue,
  ...(keys > 0 ? { concurrencyKey: ({ seq }: { readonly seq: number }) => `tenant-${seq % keys}` } : {})
})

interface Event {
  readonly what: string
  readonly start: number
  end?: number
  detail?: string
}
const events: Array<Event> = []
const seqsOf = (jobs: ReadonlyArray<{ readonly args: unknown }>) =>
  jobs.map((j) => (j.args as { seq: number }).seq)
/** Per job (by `seq`), the claim call that returned it. */
const claimOf = new Map<number, Event>()
/** Notes `e` as the claim of `jobs`; their seqs, for the event's detail. */
const noteClaimed = (jobs: ReadonlyArray<{ readonly args: unknown }>, e: Event): string => {
  const seqs = seqsOf(jobs)
  for (const seq of seqs) claimOf.set(seq, e)
  return seqs.join(",")
}
const timed = <A, E, R>(what: string, effect: Effect.Effect<A, E, R>, detail: (a: A, e: Event) => string) =>
  Effect.suspend(() => {
    const e: Event = { what, start: now() }
    events.push(e)
    return Effect.tap(effect, (a) =>
      Effect.sync(() => {
        e.end = now()
        e.detail = detail(a, e)
      })
    )
  })

/** The storage services, each hot-path call logged. */
const traced = Layer.mergeAll(
  Layer.effect(
    QueueStorage,
    Effect.map(Effect.service(QueueStorage), (s) => {
      // every call logged (maintenance too: prune, rotate, promote, rescue…), with a short result
      const wrapped: Record<string, unknown> = {}
      for (const [name, value] of Object.entries(s)) {
        wrapped[name] =
          typeof value === "function"
            ? (...args: Array<unknown>) =>
                timed(name, (value as (...a: Array<unknown>) => Effect.Effect<unknown>)(...args), (a, e) =>
                  name === "claim"
                    ? `${(a as ReadonlyArray<never>).length} ${noteClaimed(a as ReadonlyArray<{ args: unknown }>, e)}`
                    : name === "finalizeMany"
                      ? `${(args[0] as ReadonlyArray<unknown>).length}`
                      : (JSON.stringify(a, (_k, v) => (typeof v === "bigint" ? String(v) : v))?.slice(
                          0,
                          80
                        ) ?? "")
                )
            : Effect.isEffect(value)
              ? timed(
                  name,
                  value as Effect.Effect<unknown>,
                  (a) =>
                    JSON.stringify(a, (_k, v) => (typeof v === "bigint" ? String(v) : v))?.slice(0, 80) ?? ""
                )
              : value
      }
      return wrapped as unknown as typeof s
    })
  ),
  Layer.effect(
    KeyGrants,
    Effect.map(Effect.service(KeyGrants), (g) => ({
      ...g,
      claim: (params) =>
        timed("claimKeyed", g.claim(params), (c, e) =>
          c._tag === "Claimed" ? `${c.jobs.length} ${c.blocked ?? ""} ${noteClaimed(c.jobs, e)}` : c._tag
        ),
      notifyClosed: (policies) =>
        noClosed ? Effect.void : timed("notifyClosed", g.notifyClosed(policies), () => "")
    }))
  ),
  Layer.effect(
    StorageSignals.StorageSignals,
    Effect.map(Effect.service(StorageSignals.StorageSignals), (s) => ({
      signals: Stream.tap(s.signals, (signal) =>
        Effect.sync(() => {
          const at = now()
          events.push({ what: `signal ${signal._tag}`, start: at, end: at })
        })
      )
    }))
  )
)

const main = Effect.gen(function* () {
  const name = databaseName("trace")
  const url = yield* createDatabase(serverUrl, name)
  yield* Effect.addFinalizer(() => dropDatabase(serverUrl, name))
  const pg = PgClient.layer({ url: Redacted.make(url), maxConnections: 10, applicationName: "pickup-trace" })
  const base = Awa.layerPg({ migrateOnStart: true, tracing: false }).pipe(
    Layer.provideMerge(pg),
    Layer.provideMerge(Layer.succeed(References.MinimumLogLevel, "Warn"))
  )
  const runtime = ManagedRuntime.make(Layer.merge(base, traced.pipe(Layer.provide(base))))
  yield* Effect.addFinalizer(() => Effect.promise(() => runtime.dispose()))
  const run = <A, E>(effect: Effect.Effect<A, E, ManagedRuntime.ManagedRuntime.Services<typeof runtime>>) =>
    Effect.promise(() => runtime.runPromise(effect))
  if (keys > 0 && limit > 0)
    yield* run(
      Effect.flatMap(Effect.service(KeyGrants), (g) =>
        Effect.asVoid(g.create({ id: "trace", maxInFlight: limit }))
      )
    )
  const client = yield* run(Effect.service(AwaClient.AwaClient))

  const started = new Map<number, number>()
  const handler = Handler.handler(TraceJob, ({ seq }) =>
    Effect.sync(() => {
      if (!started.has(seq)) started.set(seq, now())
    })
  )
  const scope = yield* run(Scope.make())
  yield* run(
    Layer.buildWithScope(
      Awa.worker({
        queues: { [queue]: { maxConcurrency: 50, ...(keys > 0 && limit > 0 ? { keyPolicy: "trace" } : {}) } },
        handlers: [handler],
        tracing: false,
        shutdownTimeout: "10 seconds",
        ...(lingerMs === undefined ? {} : { completion: { linger: `${lingerMs} millis` } })
      }),
      scope
    )
  )

  const offer = (from: number, n: number) =>
    Effect.promise(async () => {
      const committed = new Float64Array(n)
      const inserts: Array<Promise<void>> = []
      const t0 = now() + 5
      for (let i = 0; i < n; i++) {
        const wait = t0 + (i * 1000) / rate - now()
        if (wait > 0) await new Promise((r) => setTimeout(r, wait))
        inserts.push(
          runtime.runPromise(client.insert(TraceJob, { seq: from + i })).then(() => {
            committed[i] = now()
          })
        )
      }
      await Promise.all(inserts)
      while (started.size < from + n) await new Promise((r) => setTimeout(r, 10))
      return committed
    })

  yield* offer(0, rate * warmSeconds)
  events.length = 0
  if (statements) yield* resetStatements(serverUrl)
  const cpu0 = process.cpuUsage()
  const from = rate * warmSeconds
  const n = rate * seconds
  const committed = yield* offer(from, n)
  const cpu = process.cpuUsage(cpu0)
  console.log(`node CPU ${round((cpu.user + cpu.system) / n, 1)} µs per job (user ${round(cpu.user / n, 1)})`)
  yield* run(Scope.close(scope, { _tag: "Success", value: undefined } as never))

  if (statements)
    for (const st of yield* topStatements(serverUrl, url, n, 30))
      console.log(
        `${String(Math.round((st.execMs * 1000) / st.calls)).padStart(6)} µs × ${String(st.calls).padStart(6)}  ${st.query.slice(0, 110)}`
      )
  const jobs = Array.from({ length: n }, (_, i) => {
    const seq = from + i
    return {
      seq,
      committed: committed[i]!,
      started: started.get(seq)!,
      pickup: started.get(seq)! - committed[i]!
    }
  })
  const sorted = jobs.map((j) => j.pickup).sort((a, b) => a - b)
  console.log(
    `keys ${keys} limit ${limit}: pickup p50 ${round(quantile(sorted, 0.5), 3)} p99 ${round(quantile(sorted, 0.99), 3)} max ${round(sorted.at(-1)!, 3)} ms`
  )
  printSegments(jobs)
  printClaimCalls()
  const t0 = jobs[0]!.committed
  const rel = (t: number) => round(t - t0, 2)
  for (const job of [...jobs].sort((a, b) => b.pickup - a.pickup).slice(0, slowest)) {
    console.log(
      `\nseq ${job.seq}: committed ${rel(job.committed)} started ${rel(job.started)} pickup ${round(job.pickup, 2)}`
    )
    for (const e of events) {
      const end = e.end ?? e.start
      if (end < job.committed - 5 || e.start > job.started) continue
      console.log(
        `  ${rel(e.start)} → ${rel(end)} (${round(end - e.start, 2)}) ${e.what} ${e.detail ?? ""}`.slice(
          0,
          200
        )
      )
    }
  }
  const file = join(
    import.meta.dirname,
    "..",
    "results",
    `pickup-trace-${new Date().toISOString().replace(/[:.]/g, "-")}.json`
  )
  writeFileSync(file, JSON.stringify({ keys, limit, rate, seconds, t0, jobs, events }))
  console.log(`\nwritten ${file}`)
})

/**
 * The claim calls of the measured interval (`claim` or `claimKeyed`, whichever the queue uses):
 * their duration in Node's view, p50 / p90 / p99 / max, over every call and over the calls that
 * returned at least one job. Issue 20's cost proof compares these, keyed against plain.
 */
const printClaimCalls = () => {
  const calls = events.filter((e) => (e.what === "claim" || e.what === "claimKeyed") && e.end !== undefined)
  const q = (xs: ReadonlyArray<number>) => {
    const sorted = [...xs].sort((a, b) => a - b)
    return `${[0.5, 0.9, 0.99].map((p) => round(quantile(sorted, p), 3)).join(" / ")} / ${round(sorted.at(-1) ?? 0, 3)}`
  }
  const durations = (es: ReadonlyArray<Event>) => es.map((e) => e.end! - e.start)
  const taking = calls.filter((e) => e.detail !== undefined && Number.parseInt(e.detail, 10) > 0)
  console.log(
    `claim calls, ms p50 / p90 / p99 / max: all ${calls.length} ${q(durations(calls))}; ` +
      `the ${taking.length} that took jobs ${q(durations(taking))}`
  )
  // A claim that overlaps a finalize call shares the two cores with it (its backend, Node's
  // answer handling): the longer a claim, the more often it overlaps one, so a dearer claim's
  // tail grows by more than its own cost.
  const finalizes = events.filter((e) => e.what === "finalizeMany" && e.end !== undefined)
  const overlaps = (c: Event) => finalizes.some((f) => f.start < c.end! && f.end! > c.start)
  const overlapping = calls.filter(overlaps)
  const alone = calls.filter((c) => !overlaps(c))
  console.log(
    `claim calls overlapping a finalize call: ${overlapping.length} ${q(durations(overlapping))}; ` +
      `alone: ${alone.length} ${q(durations(alone))}`
  )
}

/**
 * Where the pickups' time goes, by segment (p50 / p90 / p99 over the jobs whose wake-up came
 * before the claim that returned them): insert's commit → the first wake-up after it → the start
 * of that claim → its end → the handler's start. A job whose claim started before its wake-up
 * (taken by a claim already in flight) is only counted.
 */
const printSegments = (
  jobs: ReadonlyArray<{ readonly seq: number; readonly committed: number; readonly started: number }>
) => {
  const wakes = events.filter((e) => e.what === "signal Wake").map((e) => e.start)
  const firstWakeAfter = (t: number) => {
    let lo = 0
    let hi = wakes.length
    while (lo < hi) {
      const mid = (lo + hi) >> 1
      if (wakes[mid]! < t) lo = mid + 1
      else hi = mid
    }
    return wakes[lo]
  }
  const segs = {
    "commit→wake": [] as Array<number>,
    "wake→claim": [] as Array<number>,
    claim: [] as Array<number>,
    "claim→start": [] as Array<number>
  }
  let early = 0
  for (const job of jobs) {
    const c = claimOf.get(job.seq)
    const wake = firstWakeAfter(job.committed)
    if (c === undefined || c.end === undefined) continue
    if (wake === undefined || wake > c.start) {
      early++
      continue
    }
    segs["commit→wake"].push(wake - job.committed)
    segs["wake→claim"].push(c.start - wake)
    segs.claim.push(c.end - c.start)
    segs["claim→start"].push(job.started - c.end)
  }
  const q = (xs: Array<number>) => {
    const sorted = [...xs].sort((a, b) => a - b)
    return [0.5, 0.9, 0.99].map((p) => round(quantile(sorted, p), 3)).join(" / ")
  }
  console.log(
    `segments, ms p50 / p90 / p99 (${segs.claim.length} jobs; ${early} taken by a claim begun before their wake-up): ` +
      Object.entries(segs)
        .map(([name, xs]) => `${name} ${q(xs)}`)
        .join(", ")
  )
}

Effect.runPromise(Effect.scoped(main)).catch((error) => {
  console.error(error)
  process.exit(1)
})
