/**
 * Awa through its Effect API: `Awa.layerPg` + `AwaClient.insert` / `insertMany` for producers,
 * `Awa.worker` with an Effect handler for consumers.
 *
 * Two profiles (issue 17, `--profile`):
 * - `tuned` (the comparison's setting since issue 5): `maxConcurrency: 50`, defaults otherwise
 *   (claim-ahead `prefetch` up to 512, sized to measured throughput; poll 200 ms as a fallback to
 *   LISTEN/NOTIFY; completion batches of up to 512 with 1 ms linger, two in flight; enqueue chunks
 *   of 5,000; leader maintenance on), except `tracing: false` on client and worker and a 10 s
 *   shutdown timeout.
 * - `defaults`: what a user gets from `Awa.layerPg` + `Awa.worker` with only `maxConcurrency`
 *   set: tracing on with no tracer installed (so no spans and no stored traceparent: ADR 0043),
 *   maintenance and ring policy at their defaults.
 * Both use `migrateOnStart` (install only) and the same pool of 10.
 */
import { Job } from "@awa/core"
import { Awa, AwaClient, Handler } from "@awa/runtime"
import { KeyGrants } from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { Effect, Exit, Layer, ManagedRuntime, Metric, Redacted, References, Schema, Scope } from "effect"
import { runSqlFiles } from "../sqlFiles.ts"
import { type AdapterFactory, inFlight, benchQueue as queue } from "./types.ts"

const poolSize = 10

/**
 * For issue 20's cost figures: `AWA_BENCH_KEYS=n` gives every job a `concurrencyKey` (`tenant-`
 * seq mod n, from the definition) and the queue the key policy `bench` (`AWA_BENCH_KEY_LIMIT`
 * jobs in flight per key, default 2), so the worker claims through `claim_keyed`. Recorded in the
 * settings. `AWA_BENCH_KEY_LIMIT=0`: the keys without a policy (the plain claim), to tell what the
 * keys cost from what the keyed claim costs.
 */
const keys = Number(process.env.AWA_BENCH_KEYS ?? "0")
const keyLimit = Number(process.env.AWA_BENCH_KEY_LIMIT ?? "2")
const keyPolicy = keys > 0 && keyLimit > 0 ? { keyPolicy: "bench" } : {}

/**
 * For issue 17's sharding figures: `AWA_BENCH_SHARDS=n` sets the bench queue's `enqueueShards`
 * (capabilities.md §22) before any phase, so its inserts spread over n lanes. Recorded in the
 * settings. The eight queues of `enqueue-one-8q` keep one lane each.
 */
const shards = Number(process.env.AWA_BENCH_SHARDS ?? "1")

const BenchJob = Job.define({
  kind: "bench",
  args: Schema.Struct({ seq: Schema.Number }),
  queue,
  ...(keys > 0 ? { concurrencyKey: ({ seq }: { readonly seq: number }) => `tenant-${seq % keys}` } : {})
})

/**
 * For investigations only: `AWA_WORKER_OPTIONS` (JSON) is merged into the worker options, e.g.
 * `{"maintenance":false}` or `{"completion":{"linger":"5 millis"}}`; it is recorded in the settings.
 */
const overrides = JSON.parse(process.env.AWA_WORKER_OPTIONS ?? "{}") as Record<string, unknown>

/**
 * For investigations only: `AWA_BENCH_SQL=<file>[,<file>…]` runs each file (one statement per
 * file: `runSqlFiles`) once the schema is installed: e.g. a prototype of a function, to price it
 * through the whole stack. The files' names are recorded in the settings.
 */
const extraSql = process.env.AWA_BENCH_SQL

export const make: AdapterFactory = async (url, options = { profile: "tuned" }) => {
  // `lean` is `tuned` with no completed job kept (see Profile)
  const tuned = options.profile !== "defaults"
  const lean = options.profile === "lean"
  const pg = PgClient.layer({
    url: Redacted.make(url),
    maxConnections: poolSize,
    applicationName: "bench-awa"
  })
  const runtime = ManagedRuntime.make(
    Awa.layerPg(tuned ? { migrateOnStart: true, tracing: false } : { migrateOnStart: true }).pipe(
      Layer.provideMerge(pg),
      // warnings and errors only, as for the peers ("became maintenance leader" is info)
      Layer.provideMerge(Layer.succeed(References.MinimumLogLevel, "Warn"))
    )
  )
  await runtime.runPromise(Effect.void)
  if (extraSql !== undefined) await runtime.runPromise(runSqlFiles(extraSql.split(",")))
  // `create` is idempotent: every process of the scale phase makes the same call
  if (keys > 0 && keyLimit > 0)
    await runtime.runPromise(
      Effect.flatMap(KeyGrants, (g) => g.create({ id: "bench", maxInFlight: keyLimit }))
    )
  const client = await runtime.runPromise(Effect.service(AwaClient.AwaClient))
  // idempotent too: every process of the scale phase sets the same width
  if (shards > 1) await runtime.runPromise(client.setEnqueueShards(queue, shards))
  let workers: Scope.Closeable | undefined
  const completions = completionsOf(() => runtime.runSync(Metric.snapshot))

  return {
    name: "awa",
    version: "0.1.0 (this repository)",
    settings: {
      profile: options.profile,
      maxConcurrency: inFlight,
      pollInterval: "200 ms (default; fallback to LISTEN/NOTIFY)",
      tracing: tuned ? false : "true (default; no tracer installed)",
      shutdownTimeout: tuned ? "10 seconds" : "default",
      prefetch:
        "512 (default: at most 512 claimed ahead, about two claim round trips of measured throughput)",
      completion: "default: batches ≤ 512, linger 1 ms, 2 in flight",
      enqueueChunkSize: "5,000 (default)",
      maintenance: lean
        ? "default but completedRetention 0 (completed jobs are not kept: prune copies none into history); leader: rotate check 1 s, rotating at 10,000 rows or 10 s; promote 250 ms"
        : "default (leader: rotate check 1 s, rotating at 10,000 rows or 10 s; promote 250 ms; completed retention 1 day)",
      poolSize,
      ...(Object.keys(overrides).length > 0 ? { overrides } : {}),
      ...(extraSql !== undefined ? { extraSql } : {}),
      ...(keys > 0
        ? { concurrencyKeys: keys, keyPolicy: keyLimit > 0 ? `bench, maxInFlight ${keyLimit}` : "none" }
        : {}),
      ...(shards > 1 ? { enqueueShards: shards } : {})
    },
    // migrateOnStart did it when the runtime was built
    install: async () => {},
    enqueueSequential: (seqs) =>
      runtime.runPromise(Effect.forEach(seqs, (seq) => client.insert(BenchJob, { seq }), { discard: true })),
    enqueueOne: (seq, onQueue) =>
      runtime.runPromise(
        Effect.asVoid(
          client.insert(BenchJob, { seq }, onQueue === undefined ? undefined : { queue: onQueue })
        )
      ),
    enqueueBatch: (seqs) =>
      runtime.runPromise(
        Effect.asVoid(
          client.insertMany(
            BenchJob,
            seqs.map((seq) => ({ seq }))
          )
        )
      ),
    startWorkers: async (onStart, concurrency = inFlight) => {
      const handler = Handler.handler(BenchJob, ({ seq }) => Effect.sync(() => onStart(seq)))
      const scope = await runtime.runPromise(Scope.make())
      await runtime.runPromise(
        Layer.buildWithScope(
          Awa.worker(
            tuned
              ? {
                  queues: { [queue]: { maxConcurrency: concurrency, ...keyPolicy } },
                  handlers: [handler],
                  tracing: false,
                  shutdownTimeout: "10 seconds",
                  ...(lean ? { maintenance: { completedRetention: "0 millis" } } : {}),
                  ...overrides
                }
              : {
                  queues: { [queue]: { maxConcurrency: concurrency, ...keyPolicy } },
                  handlers: [handler],
                  ...overrides
                }
          ),
          scope
        )
      )
      workers = scope
    },
    stopWorkers: async () => {
      const scope = workers
      workers = undefined
      if (scope !== undefined) await runtime.runPromise(Scope.close(scope, Exit.void))
    },
    openJobs: async () => {
      const counts = await runtime.runPromise(client.storage.countByQueueState)
      return counts
        .filter((c) => (c.queue === queue || c.queue.startsWith(`${queue}_`)) && c.state !== "completed")
        .reduce((n, c) => n + c.count, 0)
    },
    // `awa.job.completed` counts an attempt once its completion's finalize has committed (the
    // Executor records it from the batch's answer), summed over the bench queues' attributes.
    // `AWA_BENCH_STORAGE_SETTLE=1`: without it, as before 2026-12-02 (the drain polls storage).
    ...(process.env.AWA_BENCH_STORAGE_SETTLE === "1" ? {} : { completions }),
    close: () => runtime.dispose()
  }
}

/** The bench queues' acknowledged completions in a snapshot of the runtime's metrics (see `completions` above). */
const completionsOf = (snapshot: () => ReadonlyArray<Metric.Metric.Snapshot>) => (): number =>
  snapshot().reduce((n, m) => {
    if (m.id !== "awa.job.completed" || m.type !== "Counter") return n
    const q = String(m.attributes?.["awa.queue"] ?? "")
    return q === queue || q.startsWith(`${queue}_`) ? n + Number(m.state.count) : n
  }, 0)
