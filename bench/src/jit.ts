/**
 * JIT probe (issue 13, ADR 0021): drains a backlog through `PgQueueStorage` with the server's JIT
 * on and off, and reports the drain time and the `claim` / `finalizeMany` call times of each.
 *
 *   DATABASE_URL=postgres://…/postgres node bench/src/jit.ts --jobs 200 --batch 50
 *
 * Needs a server compiled with LLVM JIT to mean anything (Debian's PostgreSQL packages are; the
 * embedded PostgreSQL 17 of the tests is not). Each mode runs on a fresh migrated database whose
 * `jit` is set with `ALTER DATABASE … SET jit = on|off` (every other setting is the server's), so
 * the only difference between the two runs is the session's `jit`. Phases: `enqueueMany` of N
 * jobs, then one worker-like loop of `claim(batch)` + `finalizeMany(batch × Complete)` until the
 * queue is empty. No maintenance runs (no rotate, no prune): the probe isolates the two hot calls.
 *
 * Output: one table on stdout. No thresholds (the figures depend on the machine and its load).
 */
import { Migrations } from "@awa/sql"
import { PgQueueStorage, QueueStorage } from "@awa/storage"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Layer, Redacted } from "effect"
import {
  acquireServer,
  type Calls,
  createDatabase,
  databaseName,
  dropDatabase,
  execute,
  loadLine,
  now,
  round,
  summarize,
  table,
  withClient
} from "./lib.ts"

const argument = (name: string, fallback: number): number => {
  const i = process.argv.indexOf(name)
  if (i === -1) return fallback
  const n = Number(process.argv[i + 1])
  if (!Number.isInteger(n) || n < 1)
    throw new Error(`${name} needs a positive integer (got ${process.argv[i + 1]})`)
  return n
}

interface Run {
  readonly jit: "on" | "off"
  readonly drainSeconds: number
  readonly claim: Calls
  readonly finalize: Calls
}

const drain = (jobs: number, batch: number) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    for (let i = 0; i < jobs; i += 1000) {
      const n = Math.min(1000, jobs - i)
      yield* storage.enqueueMany(
        Array.from({ length: n }, (_, k) => ({ kind: "jit", queue: "jit", args: { k: i + k } }))
      )
    }
    const claims: Array<number> = []
    const finalizes: Array<number> = []
    const start = now()
    for (;;) {
      const t0 = now()
      const claimed = yield* storage.claim({ queue: "jit", max: batch, deadlineMs: 0, agingIntervalMs: 0 })
      claims.push(now() - t0)
      if (claimed.length === 0) break
      const t1 = now()
      yield* storage.finalizeMany(
        claimed.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
      )
      finalizes.push(now() - t1)
    }
    return { drainSeconds: (now() - start) / 1000, claim: summarize(claims), finalize: summarize(finalizes) }
  })

const runMode = (serverUrl: string, jit: "on" | "off", jobs: number, batch: number) =>
  Effect.acquireUseRelease(
    Effect.gen(function* () {
      const name = databaseName("awa_jit")
      const url = yield* createDatabase(serverUrl, name)
      yield* execute(serverUrl, `ALTER DATABASE ${name} SET jit = ${jit}`)
      yield* Migrations.migrate().pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })))
      return { name, url }
    }),
    ({ url }) =>
      drain(jobs, batch).pipe(
        Effect.map((r): Run => ({ jit, ...r })),
        Effect.provide(
          PgQueueStorage.layer().pipe(
            Layer.provide(
              PgClient.layer({ url: Redacted.make(url), maxConnections: 1, applicationName: "awa-jit" })
            )
          )
        )
      ),
    ({ name }) => dropDatabase(serverUrl, name)
  )

const program = Effect.gen(function* () {
  const jobs = argument("--jobs", 5000)
  const batch = argument("--batch", 50)
  const server = yield* acquireServer
  const version = yield* withClient(server.url, (sql) =>
    Effect.map(
      sql<{ v: string; jit: string; available: boolean }>`
        SELECT current_setting('server_version') AS v, current_setting('jit') AS jit, pg_jit_available() AS available`,
      (rows) => rows[0]!
    )
  )
  yield* Console.log(
    `PostgreSQL ${version.v}, server jit=${version.jit}, llvmjit available=${version.available}; ` +
      `${jobs} jobs, claim/finalize batch ${batch}; load ${loadLine()}`
  )
  const runs: Array<Run> = []
  for (const jit of ["off", "on"] as const) runs.push(yield* runMode(server.url, jit, jobs, batch))
  const row = (r: Run, name: "claim" | "finalize") => [
    `${name} (jit ${r.jit})`,
    r[name].count,
    r[name].p50Ms,
    r[name].p95Ms,
    r[name].maxMs
  ]
  yield* Console.log(
    table(
      ["call", "calls", "p50 ms", "p95 ms", "max ms"],
      runs.flatMap((r) => [row(r, "claim"), row(r, "finalize")])
    )
  )
  yield* Console.log(
    table(
      ["drain", "seconds", "jobs/s"],
      runs.map((r) => [`jit ${r.jit}`, round(r.drainSeconds, 2), Math.round(jobs / r.drainSeconds)])
    )
  )
  const [off, on] = runs
  yield* Console.log(`drain ratio jit on / jit off: ${round(on!.drainSeconds / off!.drainSeconds, 2)}`)
}).pipe(Effect.scoped)

NodeRuntime.runMain(program)
