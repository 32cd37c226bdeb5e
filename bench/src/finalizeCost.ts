/**
 * A completion's server time, measured inside one backend as `claimCost.ts` measures a claim: the
 * figures behind docs/benchmarks.md, "Completions in their claims' slots". In a fresh database it
 * enqueues one backlog (one lane) spread over `--slots` ring slots, then times, in a PL/pgSQL loop
 * on one connection with each call rolled back, `claim(n)` alone and `claim(n)` followed by
 * `finalize_completions` of what it claimed; the difference is the completion's cost. Rounds
 * alternate the calls; the table gives each call's median, minimum and maximum µs.
 *
 *   node --conditions=@awa/source bench/src/finalizeCost.ts [--jobs 20000] [--slots 4] [--batch 100] [--rounds 6] [--calls 30]
 *   DATABASE_URL=postgres://…/postgres node --conditions=@awa/source bench/src/finalizeCost.ts   # any server
 *   node --conditions=@awa/source bench/src/finalizeCost.ts --sql alt.sql   # a prototype's finalize_completions_alt beside it
 *
 * `--slots n`: a rotation after every n-th of the backlog, as a drain's backlog spans the slots
 * rotated in while it was enqueued; the claims then lie in the oldest slot while every slot up to
 * the current one is live. Before migration 0054 finalize looked for each job's ready row and
 * closures in every live slot; since then, in its claims' slots. Works against builds from 0053 on
 * (it vacuums `claim_spans`; copy it into an older worktree to compare).
 */
import { Awa } from "@awa/runtime"
import { QueueStorage } from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, Redacted, References } from "effect"
import { SqlClient } from "effect/sql"
import {
  acquireServerAt,
  costTable,
  createDatabase,
  databaseName,
  intArg,
  quantile,
  rolledBackTimer,
  stringArg,
  withClient
} from "./lib.ts"
import { runSqlFiles } from "./sqlFiles.ts"

const jobs = intArg("--jobs", 20_000)
const slots = intArg("--slots", 4)
const batch = intArg("--batch", 100)
const rounds = intArg("--rounds", 6)
const calls = intArg("--calls", 30)

const queue = "cost_finalize"
const chunk = 1_000

const claimOnly = `SELECT count(*) FROM awa.claim('${queue}', ${batch}, 0, 0)`
const claimAndComplete = `
  WITH c AS MATERIALIZED (
    SELECT array_agg(job_id) AS ids, array_agg(run_lease) AS leases FROM awa.claim('${queue}', ${batch}, 0, 0))
  SELECT count(*) FROM c, awa.finalize_completions(c.ids, c.leases)`

/**
 * `--sql <file>[,<file>…]`: a prototype's SQL files (`sqlFiles.ts`) run after the install; one of
 * them defines `awa.finalize_completions_alt` with the same signature, timed beside the installed
 * function in the same rounds.
 */
const altSql = stringArg("--sql", "")
const altFiles = altSql === "" ? [] : altSql.split(",")

const probes: ReadonlyArray<readonly [string, string]> = [
  [`claim(${batch})`, claimOnly],
  [`claim(${batch}) + finalize_completions(${batch})`, claimAndComplete],
  ...(altFiles.length === 0
    ? []
    : [
        [
          `claim(${batch}) + finalize_completions_alt(${batch})`,
          claimAndComplete.replace("awa.finalize_completions(", "awa.finalize_completions_alt(")
        ] as const
      ])
]

/** The backlog, through the storage layer, a rotation after every `slots`-th part of it. */
const load = (url: string) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const perSlot = Math.ceil(jobs / slots)
    for (let from = 0; from < jobs; from += chunk) {
      const n = Math.min(chunk, jobs - from)
      yield* storage.enqueueMany(
        Array.from({ length: n }, (_, i) => ({ kind: "cost", queue, args: { n: from + i } }))
      )
      if (from + n < jobs && Math.floor((from + n) / perSlot) > Math.floor(from / perSlot))
        yield* storage.rotate
    }
  }).pipe(
    Effect.provide(
      Awa.layerPg({ migrateOnStart: true, rotateMinRows: 1 }).pipe(
        Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 4 })),
        Layer.provideMerge(Layer.succeed(References.MinimumLogLevel, "Warn"))
      )
    )
  )

const measure = (url: string) =>
  withClient(url, (sql) =>
    Effect.gen(function* () {
      yield* sql.unsafe("VACUUM ANALYZE").unprepared
      yield* sql.unsafe(rolledBackTimer).unprepared
      const [live] = yield* sql<{ n: number }>`SELECT count(DISTINCT slot)::int AS n FROM awa.ready`
      const samples = new Map<string, Array<number>>(probes.map(([label]) => [label, []]))
      // a first pass plans every statement on this connection
      for (const [, statement] of probes) yield* sql`SELECT pg_temp.awa_rolled_back_cost(${statement}, 5)`
      for (let r = 0; r < rounds; r++)
        for (const [label, statement] of probes) {
          // the rolled-back calls leave dead rows where they wrote: cleared before each measurement
          yield* sql.unsafe("VACUUM awa.claims, awa.claim_marks, awa.claim_spans, awa.closures, awa.terminal")
            .unprepared
          const [row] = yield* sql<{
            us: number
          }>`SELECT pg_temp.awa_rolled_back_cost(${statement}, ${calls}) AS us`
          samples.get(label)!.push(Number(row!.us))
        }
      return { samples, live: live!.n }
    })
  )

const program = Effect.gen(function* () {
  const server = yield* acquireServerAt(process.env.DATABASE_URL)
  const url = yield* createDatabase(server.url, databaseName("awa_finalize_cost"))
  yield* load(url)
  if (altFiles.length > 0)
    yield* withClient(url, (sql) => Effect.provideService(runSqlFiles(altFiles), SqlClient.SqlClient, sql))
  const { samples, live } = yield* measure(url)
  console.log(
    `finalize cost in one backend: ${jobs.toLocaleString("en-US")} jobs over ${live} slot(s), batches of ${batch}, ${rounds} rounds of ${calls} calls`
  )
  console.log(
    costTable(
      probes.map(([label]) => label),
      samples
    )
  )
  // the medians the table shows
  const [claim, both, alt] = probes.map(([label]) =>
    quantile(
      [...samples.get(label)!].sort((a, b) => a - b),
      0.5
    )
  )
  console.log(`finalize_completions(${batch}): ~${Math.round(both! - claim!)} µs (difference of the medians)`)
  if (alt !== undefined)
    console.log(
      `finalize_completions_alt(${batch}): ~${Math.round(alt - claim!)} µs (difference of the medians)`
    )
})

Effect.runPromise(Effect.scoped(program)).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
