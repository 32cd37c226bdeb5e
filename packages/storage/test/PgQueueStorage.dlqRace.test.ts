/**
 * Property 4 of issue 14 (storage-engine review M2, A4, m4): a DLQ retry racing the move to the
 * DLQ gives one job, run once; no finalize batch is aborted by another item's row; a stale rescue
 * yields to a heartbeat that committed after its scan. Each race is made deterministic by holding
 * the lock the racing call needs from a third session and waiting until the call waits on it.
 */
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Redacted, type Scope } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh } from "./pgFixtures.ts"

type Env = QueueStorage | PgClient.PgClient | SqlClient.SqlClient

/** Storage on its own pool of `url`: one per session, so their locks are really separate. */
const session = (url: string, maxConnections = 2) =>
  pgLayer().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections })))

const withDatabase = <A, E>(body: (url: string) => Effect.Effect<A, E, Env | Scope.Scope>) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) => body(url).pipe(Effect.provide(session(url))))

/** Waits (polling the catalog) until some backend waits for an advisory lock. */
const untilAdvisoryWaiter = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  for (;;) {
    const [row] = yield* sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`
    if (row!.n > 0) return
    yield* Effect.sleep("5 millis")
  }
})

/** Until some session waits for a row lock (the transaction id of the row's locker). */
const untilRowLockWaiter = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  for (;;) {
    const [row] = yield* sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_locks WHERE locktype IN ('transactionid', 'tuple') AND NOT granted`
    if (row!.n > 0) return
    yield* Effect.sleep("5 millis")
  }
})

/**
 * Runs `body` while another session holds a lock: the transaction-scoped advisory lock `lockSql`
 * (an expression), or whatever `{ statement }` takes; `whileHeld` runs after the lock is granted,
 * and the holder commits when it ends, after running `beforeCommit` (SQL) in its transaction, if
 * given.
 */
const holding = <A, E, R>(
  url: string,
  lockSql: string | { readonly statement: string },
  whileHeld: Effect.Effect<A, E, R>,
  beforeCommit?: string
) =>
  Effect.gen(function* () {
    const held = yield* Deferred.make<void>()
    const release = yield* Deferred.make<void>()
    const holder = yield* Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* sql.withTransaction(
        Effect.gen(function* () {
          yield* sql.unsafe(
            typeof lockSql === "string" ? `SELECT pg_advisory_xact_lock(${lockSql})` : lockSql.statement
          )
          yield* Deferred.succeed(held, undefined)
          yield* Deferred.await(release)
          if (beforeCommit !== undefined) yield* sql.unsafe(beforeCommit)
        })
      )
    }).pipe(Effect.provide(session(url, 1)), Effect.forkChild)
    yield* Deferred.await(held)
    const out = yield* whileHeld.pipe(Effect.ensuring(Deferred.succeed(release, undefined)))
    yield* Fiber.join(holder)
    return out
  })

const representations = (id: bigint) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<{ rank: number; state: string }>`
      SELECT rank, state FROM awa.job_representations WHERE job_id = ${id} ORDER BY rank`
  )

const failItem = (c: { jobId: bigint; runLease: bigint }) => ({
  jobId: c.jobId,
  runLease: c.runLease,
  outcome: { _tag: "Fail" as const, error: "boom" }
})

describe("PgQueueStorage: DLQ retry, batches and rescue under races (issue 14, property 4)", () => {
  it.live(
    "a retry that waits for the job lock while the job moves to the DLQ retries it out of the DLQ: one job, run once",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("dlqrace")
          yield* storage.configureQueue(q, { dlq: true })
          const [j] = yield* storage.enqueueMany([{ kind: "k", queue: q, args: {}, maxAttempts: 1 }])
          const [c] = yield* storage.claim(claimOf(q, 1))
          const result = yield* holding(
            url,
            `awa.lock_ns('job'), hashint8(${j!.id}::bigint)`,
            Effect.gen(function* () {
              // the operator's retry starts while the job is still running, and waits for the lock
              const retry = yield* storage
                .retryJob(j!.id)
                .pipe(Effect.provide(session(url, 1)), Effect.forkChild)
              yield* untilAdvisoryWaiter
              // the worker's failure moves the job to the DLQ meanwhile
              yield* storage.finalizeMany([failItem(c!)])
              return retry
            })
          ).pipe(Effect.flatMap(Fiber.join))
          assert.strictEqual(result.state, "available")
          // the job is out of the DLQ and in the ring once: one representation, available
          assert.deepStrictEqual(
            (yield* representations(j!.id)).map((r) => [r.rank, r.state]),
            [[3, "available"]]
          )
          assert.strictEqual((yield* storage.listDlq({ queue: q })).length, 0)
          const again = yield* storage.claim(claimOf(q, 10))
          assert.deepStrictEqual(
            again.map((x) => [x.jobId, x.runLease]),
            [[j!.id, 2n]]
          )
          assert.deepStrictEqual(yield* storage.claim(claimOf(q, 10)), [])
          // its next failure goes back to the DLQ without error
          yield* storage.finalizeMany([failItem(again[0]!)])
          assert.strictEqual((yield* storage.getDlq(j!.id)).originalRunLease, 2n)
        })
      ),
    60_000
  )

  it.live("retry_job on a job in the DLQ moves it out of the DLQ instead of copying it into the ring", () =>
    withDatabase(() =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("dlqdirect")
        yield* storage.configureQueue(q, { dlq: true })
        const [j] = yield* storage.enqueueMany([{ kind: "k", queue: q, args: {}, maxAttempts: 1 }])
        const [c] = yield* storage.claim(claimOf(q, 1))
        yield* storage.finalizeMany([failItem(c!)])
        const [row] = yield* sql<{ r: string }>`SELECT awa.retry_job(${j!.id}) AS r`
        assert.strictEqual(row!.r, "available")
        assert.deepStrictEqual(
          (yield* representations(j!.id)).map((r) => [r.rank, r.state]),
          [[3, "available"]]
        )
        assert.strictEqual((yield* storage.claim(claimOf(q, 10))).length, 1)
        assert.deepStrictEqual(yield* storage.claim(claimOf(q, 10)), [])
      })
    )
  )

  it.live("an item whose DLQ or deferred row already exists does not abort the batch: the others apply", () =>
    withDatabase(() =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("dlqbatch")
        yield* storage.configureQueue(q, { dlq: true })
        const [a, b, d] = yield* storage.enqueueMany([
          { kind: "k", queue: q, args: { n: 1 }, maxAttempts: 1 },
          { kind: "k", queue: q, args: { n: 2 }, maxAttempts: 3 },
          { kind: "k", queue: q, args: { n: 3 } }
        ])
        const [ca, cb, cd] = yield* storage.claim(claimOf(q, 3))
        // a corrupt state an older release could leave (review M2): a's DLQ entry of a newer
        // attempt than this one, and b's deferred row, both beside their open attempts
        yield* sql`
            INSERT INTO awa.dlq (job_id, kind, queue, priority, args, metadata, tags, errors, progress, attempt,
                                 max_attempts, original_run_lease, run_at, created_at, dlq_at, dlq_reason)
            SELECT job_id, kind, queue, priority, args, metadata, tags, errors, progress, 1, max_attempts,
                   run_lease + 5, run_at, created_at, now(), 'terminal_error'
            FROM awa.ready WHERE job_id = ${a!.id}`
        yield* sql`
            INSERT INTO awa.deferred (job_id, state, kind, queue, priority, shard, args, metadata, tags, errors,
                                      attempt, run_lease, max_attempts, run_at, created_at)
            SELECT job_id, 'retryable', kind, queue, priority, 0, args, metadata, tags, errors, 1, run_lease + 5,
                   max_attempts, now() + interval '1 hour', created_at
            FROM awa.ready WHERE job_id = ${b!.id}`
        const results = yield* storage.finalizeMany([
          failItem(ca!),
          {
            jobId: cb!.jobId,
            runLease: cb!.runLease,
            outcome: { _tag: "Retry", delayMs: 0, error: "again" }
          },
          { jobId: cd!.jobId, runLease: cd!.runLease, outcome: { _tag: "Complete" } }
        ])
        assert.deepStrictEqual(
          results.map((r) => r._tag),
          ["Stale", "Stale", "Applied"]
        )
        assert.strictEqual((yield* storage.getJob(d!.id)).state, "completed")
        // the two not applied are still open, for rescue or their owner to decide
        const [open] = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM awa.claims c
            WHERE c.job_id IN (${a!.id}, ${b!.id})
              AND NOT EXISTS (SELECT 1 FROM awa.closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)`
        assert.strictEqual(open!.n, 2)
      })
    )
  )

  it.live("an older DLQ entry of the same job is replaced by the newer attempt's failure", () =>
    withDatabase(() =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("dlqnewer")
        yield* storage.configureQueue(q, { dlq: true })
        const [a] = yield* storage.enqueueMany([
          { kind: "k", queue: q, args: { n: 1 }, maxAttempts: 1 },
          { kind: "k", queue: q, args: { n: 2 } }
        ])
        const [ca, cd] = yield* storage.claim(claimOf(q, 2))
        yield* sql`
          INSERT INTO awa.dlq (job_id, kind, queue, priority, args, metadata, tags, errors, progress, attempt,
                               max_attempts, original_run_lease, run_at, created_at, dlq_at, dlq_reason)
          SELECT job_id, kind, queue, priority, args, metadata, tags, errors, progress, 1, max_attempts,
                 0, run_at, created_at, now(), 'terminal_error'
          FROM awa.ready WHERE job_id = ${a!.id}`
        const results = yield* storage.finalizeMany([
          failItem(ca!),
          { jobId: cd!.jobId, runLease: cd!.runLease, outcome: { _tag: "Complete" } }
        ])
        assert.deepStrictEqual(
          results.map((r) => r._tag),
          ["Applied", "Applied"]
        )
        assert.strictEqual((yield* storage.getDlq(a!.id)).originalRunLease, 1n)
      })
    )
  )

  it.live(
    "a stale rescue whose scan predates a heartbeat that commits before it gets the attempt lock leaves the attempt alone",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("stale")
          yield* storage.enqueueMany([{ kind: "k", queue: q, args: {} }])
          const [c] = yield* storage.claim(claimOf(q, 1))
          const started = yield* Deferred.make<void>()
          const go = yield* Deferred.make<void>()
          // the rescuer's transaction, so its cutoff (now() − 0 ms), starts after the claim and
          // before the heartbeat; its scan then finds the attempt stale
          const rescuer = yield* Effect.gen(function* () {
            const sql = yield* SqlClient.SqlClient
            return yield* sql.withTransaction(
              Effect.gen(function* () {
                yield* sql`SELECT now()`
                yield* Deferred.succeed(started, undefined)
                yield* Deferred.await(go)
                return yield* sql<{ job_id: bigint }>`SELECT job_id FROM awa.rescue('stale', 0, 10)`
              })
            )
          }).pipe(Effect.provide(session(url, 1)), Effect.forkChild)
          yield* Deferred.await(started)
          yield* holding(
            url,
            // the attempt's claims row: its lock since migration 0028 (finalize, heartbeat)
            {
              statement: `SELECT 1 FROM awa.claims WHERE job_id = ${c!.jobId} AND run_lease = ${c!.runLease} FOR NO KEY UPDATE`
            },
            Effect.gen(function* () {
              // the rescue scans and then waits in finalize for the attempt's row
              yield* Deferred.succeed(go, undefined)
              yield* untilRowLockWaiter
            }),
            // the worker's heartbeat commits first, newer than the rescue's cutoff (the holder's
            // transaction started after the rescuer's; heartbeat re-takes the row lock it holds)
            `SELECT * FROM awa.heartbeat('[{"job_id":${c!.jobId},"run_lease":${c!.runLease}}]'::jsonb)`
          )
          assert.deepStrictEqual(yield* Fiber.join(rescuer), [])
          assert.strictEqual((yield* storage.getJob(c!.jobId)).state, "running")
        })
      ),
    60_000
  )
})
