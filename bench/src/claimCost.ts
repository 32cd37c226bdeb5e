/**
 * A claim call's server time, measured inside one backend (no client, no round trip, no
 * scheduler between calls): the figures behind docs/benchmarks.md, "A claim's cursor read in the
 * live slots only". In a fresh database it enqueues three backlogs (one lane; eight shards; a
 * `concurrencyKey` on every job under a policy no key reaches), then times `claim` and
 * `claim_keyed` calls in a PL/pgSQL loop on one connection, each call rolled back in a
 * subtransaction so every call finds the same backlog. Rounds alternate the calls; the table
 * gives each call's median, minimum and maximum µs over the rounds.
 *
 *   node --conditions=@awa/source bench/src/claimCost.ts [--jobs 20000] [--rounds 8] [--calls 300] [--slots 1]
 *     [--transactions]
 *   DATABASE_URL=postgres://…/postgres node --conditions=@awa/source bench/src/claimCost.ts   # any server
 *
 * `--slots n` spreads each backlog over n ring slots (a rotation after every n-th of it), as a
 * drain's backlog spans the slots rotated in while it was enqueued: probes that read every live
 * slot (the tombstone anti-join before migration 0052) cost more per row with more of them.
 *
 * Each measurement's loop runs in one transaction (its calls are rolled back one by one, and the
 * dead rows they leave are vacuumed before the next measurement). Read the figures as relative
 * (one build against another, one call against another), not as a claim's latency.
 * `--transactions`: each call in a transaction of its own, rolled back (a procedure's loop): the
 * locks a call takes are acquired and released per call, as in the runtime (in one transaction
 * the first call's locks stay held), so the difference is the lock table's share.
 */
import { Awa } from "@awa/runtime"
import { KeyGrants, QueueStorage } from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, Redacted, References } from "effect"
import {
  acquireServerAt,
  costTable,
  createDatabase,
  databaseName,
  intArg,
  rolledBackTimer,
  transactionTimer,
  withClient
} from "./lib.ts"

const jobs = intArg("--jobs", 20_000)
const rounds = intArg("--rounds", 8)
const calls = intArg("--calls", 300)
const slots = intArg("--slots", 1)
/** `--transactions`: each call in a transaction of its own (`transactionTimer`), not a subtransaction. */
const transactions = process.argv.includes("--transactions")

const plain = "cost_plain"
const sharded = "cost_sharded"
const keyed = "cost_keyed"
const policy = "cost_policy"

/** The calls timed: a label and the statement one loop iteration runs. */
const probes: ReadonlyArray<readonly [string, string]> = [
  ["claim(1), one lane", `SELECT count(*) FROM awa.claim('${plain}', 1, 0, 0)`],
  ["claim(50), one lane", `SELECT count(*) FROM awa.claim('${plain}', 50, 0, 0)`],
  ["claim(200), one lane", `SELECT count(*) FROM awa.claim('${plain}', 200, 0, 0)`],
  ["claim(1), 8 shards", `SELECT count(*) FROM awa.claim('${sharded}', 1, 0, 0)`],
  ["claim(50), 8 shards", `SELECT count(*) FROM awa.claim('${sharded}', 50, 0, 0)`],
  ["claim_keyed(1), one lane", `SELECT count(*) FROM awa.claim_keyed('${keyed}', '${policy}', 1, 0, 0)`],
  ["claim_keyed(50), one lane", `SELECT count(*) FROM awa.claim_keyed('${keyed}', '${policy}', 50, 0, 0)`]
]

const chunk = 5_000

/** The three backlogs and the policy, through the storage layer. */
const load = (url: string) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    yield* (yield* KeyGrants).create({ id: policy, maxInFlight: 1_000_000 })
    yield* storage.configureQueue(sharded, { enqueueShards: 8 })
    for (let from = 0; from < jobs; from += chunk) {
      const seqs = Array.from({ length: Math.min(chunk, jobs - from) }, (_, i) => from + i)
      yield* storage.enqueueMany(seqs.map((n) => ({ kind: "cost", queue: plain, args: { n } })))
      yield* storage.enqueueMany(
        seqs.map((n) => ({ kind: "cost", queue: sharded, args: { n }, orderingKey: `k${n}` }))
      )
      yield* storage.enqueueMany(
        seqs.map((n) => ({ kind: "cost", queue: keyed, args: { n }, concurrencyKey: `k${n % 1000}` }))
      )
      // the next part of each backlog in the next slot
      if (
        slots > 1 &&
        from + chunk < jobs &&
        Math.floor(((from + chunk) * slots) / jobs) > Math.floor((from * slots) / jobs)
      )
        yield* storage.rotate
    }
  }).pipe(
    Effect.provide(
      Awa.layerPg({ migrateOnStart: true }).pipe(
        Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 4 })),
        Layer.provideMerge(Layer.succeed(References.MinimumLogLevel, "Warn"))
      )
    )
  )

const measure = (url: string) =>
  withClient(url, (sql) =>
    Effect.gen(function* () {
      yield* sql.unsafe("VACUUM ANALYZE").unprepared
      yield* sql.unsafe(transactions ? transactionTimer : rolledBackTimer).unprepared
      /** µs per call of `statement`, over `n` calls. */
      const timed = (statement: string, n: number) =>
        Effect.map(
          transactions
            ? sql<{ us: number }>`CALL pg_temp.awa_transaction_cost(${statement}, ${n}, NULL)`
            : sql<{ us: number }>`SELECT pg_temp.awa_rolled_back_cost(${statement}, ${n}) AS us`,
          (rows) => Number(rows[0]!.us)
        )
      // the tables a rolled-back claim writes (claim_spans since migration 0053)
      const [spans] = yield* sql<{
        present: boolean
      }>`SELECT to_regclass('awa.claim_spans') IS NOT NULL AS present`
      const written = spans!.present
        ? "awa.claims, awa.claim_marks, awa.claim_spans"
        : "awa.claims, awa.claim_marks"
      const samples = new Map<string, Array<number>>(probes.map(([label]) => [label, []]))
      // a first pass plans every statement on this connection
      for (const [, statement] of probes) yield* timed(statement, Math.min(calls, 20))
      for (let r = 0; r < rounds; r++)
        for (const [label, statement] of probes) {
          // the rolled-back calls leave dead rows in the tables they write: cleared before each
          // measurement, so that late rounds do not step over more of them than early ones
          yield* sql.unsafe(`VACUUM ${written}`).unprepared
          samples.get(label)!.push(yield* timed(statement, calls))
        }
      return samples
    })
  )

const program = Effect.gen(function* () {
  const server = yield* acquireServerAt(process.env.DATABASE_URL)
  const url = yield* createDatabase(server.url, databaseName("awa_claim_cost"))
  yield* load(url)
  const samples = yield* measure(url)
  console.log(
    `claim cost in one backend: ${jobs.toLocaleString("en-US")} jobs per backlog over ${slots} slot(s), ${rounds} rounds of ${calls} calls, ` +
      (transactions ? "each call its own transaction" : "each call a subtransaction")
  )
  console.log(
    costTable(
      probes.map(([label]) => label),
      samples
    )
  )
})

Effect.runPromise(Effect.scoped(program)).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
