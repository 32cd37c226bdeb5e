/**
 * Cost of key-execution grants (capabilities.md §23, migration 0033, ADR 0029) at the storage
 * level: no runtime, no handlers.
 *
 *   node bench/src/keyGrants.ts                      # 20,000 jobs per queue, 1,000 keys
 *   node bench/src/keyGrants.ts --jobs 50000 --keys 100
 *   node bench/src/keyGrants.ts --hot 0              # everything through the pool (before ADR 0033)
 *   node bench/src/keyGrants.ts --window 1           # the latency probe claims 1 job a call (default 50)
 *
 * Postgres: `DATABASE_URL` when set, otherwise a temporary embedded PostgreSQL with durability on.
 * A fresh database per run. Two queues with the same backlog: `plain` (no key, ungated `claim`)
 * and `keyed` (a `concurrencyKey` on every job, drawn round-robin from `--keys`, policy
 * `maxInFlight` 2, `claim_keyed`). No maintenance runs: the ring does not rotate, so every claim
 * and closure stays in one slot and a key's grant count reads all of the key's claims so far (at
 * most jobs / keys), more than a rotating ring keeps (about one wrap, ~16 s of claims).
 *
 *   1. claim latency: `claim(max --window)` + complete, alternating plain / keyed, `--probes` times
 *      each, on backlogs of `--jobs` of their own: per-call claim time, p50 / p95 / p99 / max;
 *   2. drain: claim 512 (the keyed claim takes at most 64 rows and 32 keys per call) +
 *      `finalizeMany` Complete, until each queue (`--jobs` each) is empty, plain first: jobs/s.
 *
 * Output: a table on stdout and `bench/results/keygrants-latest.json`.
 */
import { mkdirSync, writeFileSync } from "node:fs"
import os from "node:os"
import { Migrations } from "@awa/sql"
import {
  type ClaimedJob,
  HotConnections,
  KeyGrants,
  PgKeyGrants,
  PgQueueStorage,
  QueueStorage
} from "@awa/storage"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Layer, Redacted } from "effect"
import {
  acquireServer,
  createDatabase,
  databaseName,
  dropDatabase,
  now,
  quantile,
  round,
  table
} from "./lib.ts"

const arg = (name: string, fallback: number) => {
  const i = process.argv.indexOf(`--${name}`)
  return i >= 0 ? Number(process.argv[i + 1]) : fallback
}
const jobs = arg("jobs", 20_000)
const keys = arg("keys", 1000)
const probes = arg("probes", 300)
// the claim latency probe's window: claim(max window); each window's keys are distinct
const claimWindow = arg("window", 50)
// 0: claim, finalize and claim_keyed through the pool, as before ADR 0033
const hotConnections = arg("hot", 1) !== 0

const complete = (claimed: ReadonlyArray<ClaimedJob>) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.finalizeMany(
      claimed.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
    )
  )

const enqueue = (queue: string, keyed: boolean) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    for (let i = 0; i < jobs; i += 1000)
      yield* storage.enqueueMany(
        Array.from({ length: Math.min(1000, jobs - i) }, (_, j) => ({
          kind: "bench",
          queue,
          args: { n: i + j },
          ...(keyed ? { concurrencyKey: `tenant-${(i + j) % keys}` } : {})
        }))
      )
  })

const claimPlain = (queue: string) => (max: number) =>
  Effect.flatMap(QueueStorage, (s) => s.claim({ queue, max, deadlineMs: 0, agingIntervalMs: 0 }))
const claimKeyed = (queue: string) => (max: number) =>
  Effect.flatMap(KeyGrants, (g) =>
    Effect.map(g.claim({ queue, policy: "bench", max, deadlineMs: 0, agingIntervalMs: 0 }), (c) =>
      c._tag === "Claimed" ? c.jobs : c._tag === "Idle" ? [] : undefined
    )
  )

const stats = (samples: Array<number>) => {
  const sorted = [...samples].sort((a, b) => a - b)
  return {
    p50Ms: round(quantile(sorted, 0.5), 3),
    p95Ms: round(quantile(sorted, 0.95), 3),
    p99Ms: round(quantile(sorted, 0.99), 3),
    maxMs: round(sorted.at(-1) ?? 0, 3)
  }
}

/** Drains until a claim finds the queue idle (`undefined`: gated or contended, claim again). */
const drain = <E, R>(claim: (max: number) => Effect.Effect<ReadonlyArray<ClaimedJob> | undefined, E, R>) =>
  Effect.gen(function* () {
    const started = now()
    let done = 0
    for (;;) {
      const batch = yield* claim(512)
      if (batch === undefined) continue
      if (batch.length === 0) break
      yield* complete(batch)
      done += batch.length
    }
    const seconds = (now() - started) / 1000
    return { jobs: done, seconds: round(seconds, 2), jobsPerSecond: Math.round(done / seconds) }
  })

const run = Effect.gen(function* () {
  const server = yield* acquireServer
  const name = databaseName("awa_bench_keys")
  const url = yield* createDatabase(server.url, name)
  yield* Effect.addFinalizer(() => dropDatabase(server.url, name))
  yield* Migrations.migrate().pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })))
  const body = Effect.gen(function* () {
    const grants = yield* KeyGrants
    yield* grants.create({ id: "bench", maxInFlight: 2 })
    // probes and drains on backlogs of their own, `jobs` each
    yield* enqueue("plain-probe", false)
    yield* enqueue("keyed-probe", true)
    yield* enqueue("plain", false)
    yield* enqueue("keyed", true)
    const plain: Array<number> = []
    const keyed: Array<number> = []
    for (let i = 0; i < probes; i++) {
      let t = now()
      const a = yield* claimPlain("plain-probe")(claimWindow)
      plain.push(now() - t)
      yield* complete(a)
      t = now()
      const b = yield* claimKeyed("keyed-probe")(claimWindow)
      keyed.push(now() - t)
      yield* complete(b ?? [])
    }
    const drainPlain = yield* drain(claimPlain("plain"))
    const drainKeyed = yield* drain(claimKeyed("keyed"))
    return {
      claim: { plain: stats(plain), keyed: stats(keyed) },
      drain: { plain: drainPlain, keyed: drainKeyed }
    }
  }).pipe(
    Effect.provide(
      Layer.mergeAll(PgQueueStorage.layer({ hotConnections }), PgKeyGrants.layer({ hotConnections })).pipe(
        // one set of hot-path connections for both, as Awa.layerPg builds them (ADR 0033)
        Layer.provide(HotConnections.layer({ hotConnections })),
        Layer.provideMerge(
          PgClient.layer({ url: Redacted.make(url), maxConnections: 4, applicationName: "awa-bench" })
        )
      )
    )
  )
  const result = yield* body
  const version = yield* Effect.succeed(server.url.replace(/\/\/[^@]*@/, "//"))
  const out = {
    at: new Date().toISOString(),
    jobs,
    keys,
    probes,
    window: claimWindow,
    server: version,
    machine: `${os.cpus().length} × ${os.cpus()[0]?.model ?? "cpu"}, load ${os
      .loadavg()
      .map((l) => l.toFixed(2))
      .join(" ")}`,
    ...result
  }
  yield* Console.log(
    table(
      [`claim(${claimWindow})`, "p50 ms", "p95 ms", "p99 ms", "max ms"],
      [
        [
          "plain (claim)",
          result.claim.plain.p50Ms,
          result.claim.plain.p95Ms,
          result.claim.plain.p99Ms,
          result.claim.plain.maxMs
        ],
        [
          "keyed (claim_keyed)",
          result.claim.keyed.p50Ms,
          result.claim.keyed.p95Ms,
          result.claim.keyed.p99Ms,
          result.claim.keyed.maxMs
        ]
      ]
    )
  )
  yield* Console.log(
    table(
      ["drain", "jobs", "s", "jobs/s"],
      [
        ["plain", result.drain.plain.jobs, result.drain.plain.seconds, result.drain.plain.jobsPerSecond],
        ["keyed", result.drain.keyed.jobs, result.drain.keyed.seconds, result.drain.keyed.jobsPerSecond]
      ]
    )
  )
  yield* Console.log(out.machine)
  mkdirSync("bench/results", { recursive: true })
  writeFileSync("bench/results/keygrants-latest.json", `${JSON.stringify(out, null, 2)}\n`)
})

NodeRuntime.runMain(Effect.scoped(run))
