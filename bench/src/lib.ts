/**
 * Helpers shared by the benchmarks (`storage.ts`, `compare.ts`, `stats.ts`, `dashboard.ts`): the
 * Postgres server, one-shot admin clients, fresh databases, number/table formatting, command-line
 * integers, call timing, and stored-job fixtures.
 */
import { randomBytes } from "node:crypto"
import os from "node:os"
import type { NewJob } from "@awa/core"
import { QueueStorage } from "@awa/storage"
import * as EmbeddedPostgres from "@awa/testing/EmbeddedPostgres"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Redacted } from "effect"
import { Reactivity } from "effect/reactivity"
import type { SystemAdapter } from "./systems/types.ts"

// ---------------------------------------------------------------------------------------------
// What is measured

/**
 * The workspace's packages resolve to their sources only under the "@awa/source" condition, which
 * npm sets (`.npmrc`: `npm run bench`, `npm exec -- node bench/src/…`). A script started with a
 * bare `node` measures `packages/<name>/dist` instead, built whenever someone last ran
 * `npm run build`: its SQL migrations and runtime can be hours behind the tree. Said loudly, once.
 */
const storageEntry = import.meta.resolve("@awa/storage")
if (!storageEntry.includes("/src/"))
  console.error(
    `warning: measuring the built packages (${storageEntry}), not the sources: run through npm ` +
      "(npm exec -- node bench/src/…) or set NODE_OPTIONS=--conditions=@awa/source"
  )

// ---------------------------------------------------------------------------------------------
// Numbers

export const now = () => performance.now()
/** The machine's 1, 5 and 15-minute load averages, for the record printed with each probe. */
export const loadLine = () =>
  os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(" ")
export const perJob = (value: number, jobs: number) => (jobs === 0 ? 0 : value / jobs)
export const round = (value: number, digits = 2) => Number(value.toFixed(digits))
export const sum = (values: ReadonlyArray<number>) => values.reduce((a, b) => a + b, 0)

/** Call or latency timings: count, mean and a few quantiles (nearest rank), in ms. */
export interface Calls {
  readonly count: number
  readonly meanMs: number
  readonly p50Ms: number
  readonly p95Ms: number
  readonly maxMs: number
}

/** Nearest-rank quantile of an ascending array. */
export const quantile = (sorted: ReadonlyArray<number>, q: number): number =>
  sorted.length === 0
    ? 0
    : sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!

export const summarize = (samples: ReadonlyArray<number>): Calls => {
  const sorted = [...samples].sort((a, b) => a - b)
  return {
    count: sorted.length,
    meanMs: round(sum(sorted) / Math.max(1, sorted.length), 3),
    p50Ms: round(quantile(sorted, 0.5), 3),
    p95Ms: round(quantile(sorted, 0.95), 3),
    maxMs: round(sorted.at(-1) ?? 0, 3)
  }
}

// ---------------------------------------------------------------------------------------------
// Tables

const pad = (cells: ReadonlyArray<string | number>, widths: ReadonlyArray<number>) =>
  cells.map((c, i) => (i === 0 ? String(c).padEnd(widths[i]!) : String(c).padStart(widths[i]!))).join("  ")

/** A plain-text table: first column left-aligned, the others right-aligned. */
export const table = (
  header: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<string | number>>
): string => {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => String(r[i]).length)))
  return [
    pad(header, widths),
    widths.map((w) => "-".repeat(w)).join("  "),
    ...rows.map((r) => pad(r, widths))
  ].join("\n")
}

/** Median, minimum and maximum of each label's samples (µs), one row per label in `labels`' order. */
export const costTable = (
  labels: ReadonlyArray<string>,
  samples: ReadonlyMap<string, ReadonlyArray<number>>
) =>
  table(
    ["call", "median µs", "min µs", "max µs"],
    labels.map((label) => {
      const s = [...samples.get(label)!].sort((a, b) => a - b)
      return [label, round(quantile(s, 0.5), 1), round(s[0]!, 1), round(s.at(-1)!, 1)]
    })
  )

// ---------------------------------------------------------------------------------------------
// A call's server time in one backend (claimCost.ts, sweepCost.ts)

/**
 * A session's temporary function `pg_temp.awa_rolled_back_cost(statement, n)`: runs the statement
 * n times in a PL/pgSQL loop, each run rolled back in a subtransaction (every call finds the same
 * rows), and returns the µs per call. No client, no round trip, no scheduler between calls.
 */
export const rolledBackTimer = `
CREATE FUNCTION pg_temp.awa_rolled_back_cost(p_sql text, p_n int) RETURNS double precision LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz;
BEGIN
  t0 := clock_timestamp();
  FOR i IN 1 .. p_n LOOP
    BEGIN
      EXECUTE p_sql;
      RAISE EXCEPTION 'rolled back';
    EXCEPTION WHEN raise_exception THEN NULL;
    END;
  END LOOP;
  RETURN extract(epoch FROM clock_timestamp() - t0) * 1e6 / p_n;
END $$`

/**
 * A session's temporary procedure `pg_temp.awa_transaction_cost(statement, n, null)`: runs the
 * statement n times in a PL/pgSQL loop, each run in a transaction of its own that it rolls back,
 * and returns the µs per call in its INOUT argument. Unlike `rolledBackTimer`'s subtransactions,
 * which leave every lock the first call took held for the rest of the loop, each call here
 * acquires and releases its locks as a committed call would (a generic plan locks every ring
 * child it names); only the commit's WAL flush is left out. Call it with CALL, outside a
 * transaction.
 */
export const transactionTimer = `
CREATE PROCEDURE pg_temp.awa_transaction_cost(p_sql text, p_n int, INOUT us double precision) LANGUAGE plpgsql AS $$
DECLARE t0 timestamptz;
BEGIN
  t0 := clock_timestamp();
  FOR i IN 1 .. p_n LOOP
    EXECUTE p_sql;
    ROLLBACK;
  END LOOP;
  us := extract(epoch FROM clock_timestamp() - t0) * 1e6 / p_n;
END $$`

// ---------------------------------------------------------------------------------------------
// Server and databases

/**
 * `url` (e.g. `--server`) or else `DATABASE_URL` when set, otherwise a temporary embedded
 * PostgreSQL with durability ON (fsync, synchronous_commit and full_page_writes at their
 * defaults), stopped and deleted when the scope closes.
 */
export const acquireServerAt = (url: string | undefined) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      EmbeddedPostgres.resolve(url === undefined ? process.env : { DATABASE_URL: url }, () =>
        EmbeddedPostgres.startTemporary({ durable: true })
      )
    ),
    (server) => Effect.promise(() => server.stop())
  )

export const acquireServer = acquireServerAt(undefined)

/** Runs `f` on a one-connection client to `url`, closed afterwards. */
export const withClient = <A, E>(url: string, f: (sql: PgClient.PgClient) => Effect.Effect<A, E>) =>
  PgClient.makeClient({ url: Redacted.make(url), applicationName: "awa-bench-admin" }).pipe(
    Effect.flatMap(f),
    Effect.scoped,
    Effect.provide(Reactivity.layer)
  )

/** Runs one statement (no parameters, no result) on a fresh connection to `url`. */
export const execute = (url: string, statement: string) =>
  withClient(url, (sql) => sql.unsafe(statement).unprepared).pipe(Effect.asVoid)

/** A random database name with `prefix`. */
export const databaseName = (prefix: string) => `${prefix}_${randomBytes(4).toString("hex")}`

/** Creates database `name` on the server at `serverUrl` (optionally from a template); returns its URL. */
export const createDatabase = (serverUrl: string, name: string, template?: string) =>
  execute(serverUrl, `CREATE DATABASE ${name}${template === undefined ? "" : ` TEMPLATE ${template}`}`).pipe(
    Effect.as(EmbeddedPostgres.withDatabase(serverUrl, name))
  )

export const dropDatabase = (serverUrl: string, name: string) =>
  execute(serverUrl, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).pipe(Effect.ignore)

// ---------------------------------------------------------------------------------------------
// Arguments, timing and stored-job fixtures (stats.ts, dashboard.ts)

/** `--name <value>` from the command line, else `fallback`. */
export const stringArg = (name: string, fallback: string): string => {
  const argv = process.argv.slice(2)
  const i = argv.indexOf(name)
  return i === -1 ? fallback : argv[i + 1]!
}

/** `--name <non-negative integer>` from the command line, else `fallback`. */
export const intArg = (name: string, fallback: number): number => {
  const argv = process.argv.slice(2)
  const i = argv.indexOf(name)
  if (i === -1) return fallback
  const n = Number(argv[i + 1])
  if (!Number.isInteger(n) || n < 0)
    throw new Error(`${name} needs a non-negative integer (got ${argv[i + 1]})`)
  return n
}

/** `effect` timed end to end `calls` times, after 3 warm-up calls. */
export const timeCalls = <A, E, R>(effect: Effect.Effect<A, E, R>, calls = 20) =>
  Effect.gen(function* () {
    for (let i = 0; i < 3; i++) yield* effect
    const samples: Array<number> = []
    for (let i = 0; i < calls; i++) {
      const t = now()
      yield* effect
      samples.push(now() - t)
    }
    return summarize(samples)
  })

const fillRound = 10_000
const day = 86_400_000
const keepDay = { completedMs: day, failedMs: 3 * day, cancelledMs: 3 * day }

/** `count` jobs of `kind` spread round-robin over `queues`. */
const jobsOver = (queues: ReadonlyArray<string>, kind: string, count: number, runAt?: Date): Array<NewJob> =>
  Array.from({ length: count }, (_, i) => ({ kind, queue: queues[i % queues.length]!, args: { i }, runAt }))

/**
 * Stored history through the storage layer's own paths: `count` jobs enqueued, claimed and
 * completed in rounds of 10,000 over `queues`, each round followed by rotate, prune (retention
 * 1 day: completed jobs move to the history ring and stay stored) and trimLedgers, as the leader does.
 */
export const fillHistory = (queues: ReadonlyArray<string>, kind: string, count: number) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    for (let done = 0; done < count; done += fillRound) {
      const n = Math.min(fillRound, count - done)
      yield* storage.enqueueMany(jobsOver(queues, kind, n))
      yield* Effect.forEach(
        queues,
        (queue) =>
          Effect.flatMap(storage.claim({ queue, max: n, deadlineMs: 0, agingIntervalMs: 0 }), (claimed) =>
            storage.finalizeMany(
              claimed.map((c) => ({
                jobId: c.jobId,
                runLease: c.runLease,
                outcome: { _tag: "Complete" as const }
              }))
            )
          ),
        { concurrency: 2, discard: true }
      )
      yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 })
      yield* storage.prune({ ...keepDay, carryAfterMs: 0 })
      yield* storage.pruneHistory(keepDay)
      yield* storage.rotateHistory(0)
      yield* storage.trimLedgers(1000)
      if ((done / fillRound) % 10 === 0) yield* Console.log(`  ${done + n} jobs stored (load ${loadLine()})`)
    }
  })

/**
 * Open work: `backlog` available jobs over `queues`, 1,000 scheduled a day ahead, and in
 * `dlqQueue` 500 dead-lettered jobs and 200 open attempts (1,700 jobs besides the backlog).
 */
export const addOpenWork = (queues: ReadonlyArray<string>, kind: string, dlqQueue: string, backlog: number) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    for (let done = 0; done < backlog; done += fillRound)
      yield* storage.enqueueMany(jobsOver(queues, kind, Math.min(fillRound, backlog - done)))
    yield* storage.enqueueMany(jobsOver(queues, kind, 1000, new Date(Date.now() + day)))
    yield* storage.configureQueue(dlqQueue, { dlq: true })
    yield* storage.enqueueMany(
      Array.from({ length: 700 }, (_, i) => ({ kind, queue: dlqQueue, args: { i }, maxAttempts: 1 }))
    )
    const failing = yield* storage.claim({ queue: dlqQueue, max: 500, deadlineMs: 0, agingIntervalMs: 0 })
    yield* storage.finalizeMany(
      failing.map((c) => ({
        jobId: c.jobId,
        runLease: c.runLease,
        outcome: { _tag: "Fail" as const, error: "bench" }
      }))
    )
    yield* storage.claim({ queue: dlqQueue, max: 200, deadlineMs: 0, agingIntervalMs: 0 })
  })

/** Waits until storage shows no open job of the adapter's queues (polled every 5 ms). */
export const untilNoOpenJobs = async (adapter: Pick<SystemAdapter, "openJobs">) => {
  while ((await adapter.openJobs()) > 0) await new Promise((r) => setTimeout(r, 5))
}

/**
 * The end of a drain of `n` jobs, as the harness's drain phase takes it: the system's own count
 * of acknowledged completions reaching `completed0 + n` where it has one (polled every
 * millisecond), else storage showing no open job.
 */
export const untilDrained = async (
  adapter: Pick<SystemAdapter, "openJobs" | "completions">,
  completed0: number,
  n: number
) => {
  const completions = adapter.completions
  if (completions === undefined) return untilNoOpenJobs(adapter)
  while (completions() < completed0 + n) await new Promise((r) => setTimeout(r, 1))
}
