/**
 * A duplicate is an answer, not a server error (migration 0018, issue 13): the enqueue functions
 * return state 'duplicate' with the holder instead of raising SQLSTATE AWU01 (which the server
 * logged as an ERROR per rejected job, and which aborted the caller's transaction). Nothing is
 * written for a rejected call, and the typed `UniqueConflict` of the API is unchanged.
 */
import { randomUUID } from "node:crypto"
import {
  CheckMemo,
  checkNewJobSync,
  type NewJob,
  UniqueConflict,
  UniqueKey,
  ValidationError
} from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"

const fresh = (label: string) => `${label}-${randomUUID().slice(0, 8)}`

const checked = (job: NewJob) => {
  const c = checkNewJobSync(job, { nowMillis: Date.now() }, new CheckMemo())
  if (c instanceof ValidationError) throw c
  return c
}

const keyOf = (job: NewJob) => UniqueKey.toHex(checked(job).uniqueKey!)

/** Rows stored for jobs of `queue` (ready, deferred) and keys held by them. (Unique keys do not
 * depend on the queue: each test uses its queue name as its kind too, so their keys differ.) */
const storedFor = (queue: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql<{ ready: number; deferred: number; keys: number }>`
        SELECT (SELECT count(*)::int FROM awa.ready WHERE queue = ${queue}) AS ready,
               (SELECT count(*)::int FROM awa.deferred WHERE queue = ${queue}) AS deferred,
               (SELECT count(*)::int FROM awa.unique_claims u
                WHERE u.job_id IN (SELECT job_id FROM awa.ready WHERE queue = ${queue}
                                   UNION ALL SELECT job_id FROM awa.deferred WHERE queue = ${queue})) AS keys`,
      (rows) => rows[0]!
    )
  )

layer(pgLayer().pipe(Layer.provideMerge(TestDatabase.layer())), {
  excludeTestServices: true,
  timeout: "60 seconds"
})("duplicates are answers, not server errors", (it) => {
  it.effect("enqueue_one answers 'duplicate' with the holder; the transaction goes on", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const sql = yield* SqlClient.SqlClient
      const q = fresh("one")
      const job: NewJob = { kind: q, queue: q, args: { n: 1 }, unique: { byArgs: true } }
      const [holder] = yield* storage.enqueueMany([job])
      const c = checked(job)
      yield* sql.withTransaction(
        Effect.gen(function* () {
          const rows = yield* sql<{ job_id: bigint; state: string }>`
              SELECT job_id, state FROM awa.enqueue_one(${c.kind}, ${c.queue}, ${c.priority}, ${c.argsJson}::jsonb,
                ${c.metadataJson}::jsonb, NULL::jsonb, ${c.maxAttempts}, NULL::timestamptz, ${c.uniqueKey!}::bytea,
                ${c.uniqueStates})`
          assert.deepStrictEqual(rows, [{ job_id: holder!.id, state: "duplicate" }])
          // the transaction is not aborted: it can go on writing
          yield* storage.enqueueMany([{ kind: q, queue: q, args: { n: 2 } }])
        })
      )
      assert.deepStrictEqual(yield* storedFor(q), { ready: 2, deferred: 0, keys: 1 })
    })
  )

  it.effect("enqueue_batch answers the first lost key and its holder, and keeps none of its keys", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const sql = yield* SqlClient.SqlClient
      const q = fresh("batch")
      const unique = { byArgs: true }
      const held: NewJob = { kind: q, queue: q, args: { n: 3 }, unique }
      const [holder] = yield* storage.enqueueMany([held])
      const batch = [1, 2, 3, 4].map((n): NewJob => ({ kind: q, queue: q, args: { n }, unique }))
      const keys = `[${batch.map((j) => `"${keyOf(j)}"`).join(",")}]`
      const header = `[{"kind":"${q}","queue":"${q}","priority":2,"metadata":{},"tags":[],"max_attempts":25,"unique_states":${checked(held).uniqueStates}}]`
      const args = `[${batch.map((j) => JSON.stringify(j.args)).join(",")}]`
      yield* sql.withTransaction(
        Effect.gen(function* () {
          const [row] = yield* sql<{
            job_ids: ReadonlyArray<bigint> | null
            conflict_key: string | null
            conflict_holder: bigint | null
          }>`
              SELECT job_ids, conflict_key, conflict_holder
              FROM awa.enqueue_batch(${header}::jsonb, ${args}::jsonb, NULL::int[], ${keys}::jsonb)`
          assert.deepStrictEqual(row, {
            job_ids: null,
            conflict_key: keyOf(held),
            conflict_holder: holder!.id
          })
          assert.deepStrictEqual(yield* storedFor(q), { ready: 1, deferred: 0, keys: 1 })
        })
      )
      // through the API: the same typed error as before, and the free keys of the batch stay free
      const error = yield* Effect.flip(storage.enqueueMany(batch))
      assert.instanceOf(error, UniqueConflict)
      assert.deepStrictEqual(
        { key: (error as UniqueConflict).key, holder: (error as UniqueConflict).existingJobId },
        { key: keyOf(held), holder: holder!.id }
      )
      const others = yield* storage.enqueueMany([batch[0]!, batch[1]!, batch[3]!])
      assert.strictEqual(others.length, 3)
    })
  )

  it.effect("two rows of one batch with the same key: rejected, the holder is the earlier row", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = fresh("twins")
      const twin: NewJob = { kind: q, queue: q, args: { n: 1 }, unique: { byArgs: true } }
      const error = yield* Effect.flip(
        storage.enqueueMany([{ kind: q, queue: q, args: { n: 0 } }, twin, twin])
      )
      assert.instanceOf(error, UniqueConflict)
      assert.strictEqual((error as UniqueConflict).key, keyOf(twin))
      assert.deepStrictEqual(yield* storedFor(q), { ready: 0, deferred: 0, keys: 0 })
    })
  )

  it.effect("enqueue(jsonb) answers one 'duplicate' row and writes nothing", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const sql = yield* SqlClient.SqlClient
      const q = fresh("legacy")
      const job: NewJob = { kind: q, queue: q, args: { n: 1 }, unique: { byArgs: true } }
      const [holder] = yield* storage.enqueueMany([job])
      const c = checked(job)
      const row = (n: number, key: string | null) =>
        `{"kind":"${q}","queue":"${q}","priority":2,"args":{"n":${n}},"metadata":{},"tags":[],"max_attempts":25,` +
        `"unique_key":${key === null ? "null" : `"${key}"`},"unique_states":${c.uniqueStates}}`
      yield* sql.withTransaction(
        Effect.gen(function* () {
          const rows = yield* sql<{ ord: number; job_id: bigint; state: string }>`
              SELECT ord, job_id, state FROM awa.enqueue(${`[${row(5, null)},${row(1, keyOf(job))}]`}::jsonb)`
          assert.deepStrictEqual(rows, [{ ord: 2, job_id: holder!.id, state: "duplicate" }])
          assert.deepStrictEqual(yield* storedFor(q), { ready: 1, deferred: 0, keys: 1 })
        })
      )
    })
  )

  it.effect("a scheduled job's key conflicts the same way", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = fresh("later")
      const runAt = new Date(Date.now() + 3_600_000)
      const job: NewJob = { kind: q, queue: q, args: { n: 1 }, runAt, unique: { byArgs: true } }
      const [holder] = yield* storage.enqueueMany([job])
      const error = yield* Effect.flip(storage.enqueueMany([job]))
      assert.instanceOf(error, UniqueConflict)
      assert.strictEqual((error as UniqueConflict).existingJobId, holder!.id)
      assert.deepStrictEqual(yield* storedFor(q), { ready: 0, deferred: 1, keys: 1 })
    })
  )
})
