/**
 * The enqueue entry points of migration 0012 (enqueue_one for one job, enqueue_batch for several)
 * against 0003's enqueue(jsonb), which cron and older code still call: the same rows, the same
 * lane lock, FIFO when all three race on one lane, and all-or-nothing across pipelined chunks.
 */
import { randomUUID } from "node:crypto"
import { CheckMemo, checkNewJobSync, type NewJob, UniqueKey, ValidationError } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it, layer } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Random, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type ClaimedJob, QueueStorage } from "../src/QueueStorage.ts"

const fresh = (label: string) => `${label}-${randomUUID().slice(0, 8)}`

/** A job row in enqueue(jsonb)'s input format, as PgQueueStorage rendered it before 0012. */
const legacyRow = (job: NewJob) => {
  const checked = checkNewJobSync(job, { nowMillis: Date.now() }, new CheckMemo())
  if (checked instanceof ValidationError) throw checked
  return (
    `{"kind":${JSON.stringify(checked.kind)},"queue":${JSON.stringify(checked.queue)},"priority":${checked.priority},` +
    `"args":${checked.argsJson},"metadata":${checked.metadataJson},"tags":${JSON.stringify(checked.tags)},` +
    `"max_attempts":${checked.maxAttempts},"run_at":${checked.runAt ? JSON.stringify(checked.runAt.toISOString()) : "null"},` +
    `"unique_key":${checked.uniqueKey ? `"${UniqueKey.toHex(checked.uniqueKey)}"` : "null"},"unique_states":${checked.uniqueStates}}`
  )
}

interface StoredRow {
  readonly job_id: bigint
  readonly table: string
  readonly state: string
  readonly kind: string
  readonly queue: string
  readonly priority: number
  readonly args: unknown
  readonly metadata: unknown
  readonly tags: ReadonlyArray<string>
  readonly max_attempts: number
  readonly run_at: string
  readonly unique_key: string | null
  readonly unique_states: number
  readonly attempt: number
  readonly run_lease: bigint
  readonly errors: unknown
  readonly lane_seq: bigint | null
}

/** Everything stored for the given ids, in id order; run_at as text, or "now" when it is the insert's now(). */
const stored = (ids: ReadonlyArray<bigint>) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<StoredRow>`
      SELECT job_id, t, state, kind, queue, priority, args, metadata, tags, max_attempts,
             CASE WHEN run_at = created_at THEN 'now' ELSE run_at::text END AS run_at,
             encode(unique_key, 'hex') AS unique_key, unique_states, attempt, run_lease, errors, lane_seq
      FROM (SELECT 'ready' AS t, 'available' AS state, job_id, kind, queue, priority, args, metadata, tags,
                   max_attempts, run_at, created_at, unique_key, unique_states, attempt, run_lease, errors, lane_seq
            FROM awa.ready
            UNION ALL
            SELECT 'deferred', state, job_id, kind, queue, priority, args, metadata, tags, max_attempts, run_at,
                   created_at, unique_key, unique_states, attempt, run_lease, errors, NULL
            FROM awa.deferred) x
      WHERE job_id = ANY (${ids.map(String)}::bigint[])
      ORDER BY job_id`
  )

const withoutIdentity = (rows: ReadonlyArray<StoredRow>) =>
  rows.map(({ job_id: _id, lane_seq: _seq, ...rest }) => rest)

class Rollback {
  readonly rows: ReadonlyArray<StoredRow>
  constructor(rows: ReadonlyArray<StoredRow>) {
    this.rows = rows
  }
}

const StorageLive = pgLayer().pipe(Layer.provideMerge(TestDatabase.layer()))

describe("enqueue entry points", () => {
  layer(StorageLive, { excludeTestServices: true, timeout: "60 seconds" })("on Postgres", (it) => {
    it.effect("store exactly what enqueue(jsonb) stores, for single jobs and for mixed batches", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const storage = yield* QueueStorage
        const q1 = fresh("parity-a")
        const q2 = fresh("parity-b")
        const past = new Date(Date.now() - 3_600_000)
        const future = new Date(Date.now() + 3_600_000)
        const sharedMeta = { team: "x", nested: { b: 1, a: [1, "z"] } }
        const sharedTags = ["t1", "t2"]
        const jobs: ReadonlyArray<NewJob> = [
          { kind: "p", queue: q1, args: { n: 1 }, metadata: sharedMeta, tags: sharedTags },
          { kind: "p", queue: q1, args: { n: 2 }, metadata: sharedMeta, tags: sharedTags },
          { kind: "p", queue: q2, priority: 1, args: { n: 3 }, maxAttempts: 3 },
          { kind: "p", queue: q1, args: { n: 4 }, metadata: sharedMeta, tags: sharedTags },
          { kind: "p", queue: q1, args: { n: 5 }, runAt: past },
          { kind: "p", queue: q2, args: "plain string", runAt: future, tags: ["later"] },
          { kind: "q", queue: q1, args: [1, { b: 2, a: 1 }], unique: { byArgs: true } },
          {
            kind: "q",
            queue: q2,
            args: { n: 8 },
            runAt: future,
            unique: { states: ["scheduled", "available"] }
          },
          { kind: "p", queue: q1, priority: 4, args: { x: null }, metadata: { other: true } },
          { kind: "p", queue: q2, args: null }
        ]
        // enqueue(jsonb), rolled back after reading what it stored
        const viaLegacy = (batch: ReadonlyArray<NewJob>) =>
          sql
            .withTransaction(
              Effect.gen(function* () {
                const out = yield* sql<{ job_id: bigint }>`
                  SELECT job_id FROM awa.enqueue(${`[${batch.map(legacyRow).join(",")}]`}::jsonb) ORDER BY ord`
                return yield* Effect.fail(new Rollback(yield* stored(out.map((r) => r.job_id))))
              })
            )
            .pipe(
              Effect.flip,
              Effect.map((r) => {
                if (!(r instanceof Rollback)) throw r
                return r.rows
              })
            )
        const expected = yield* viaLegacy(jobs)
        assert.strictEqual(expected.length, jobs.length)
        // one batch: enqueue_batch, several headers, available and deferred mixed
        const batch = yield* storage.enqueueMany(jobs)
        const batchRows = yield* stored(batch.map((e) => e.id))
        assert.deepStrictEqual(withoutIdentity(batchRows), withoutIdentity(expected))
        assert.deepStrictEqual(
          batch.map((e) => e.state),
          expected.map((r) => r.state)
        )
        // the same jobs one call each (enqueue_one), after releasing the two unique keys
        yield* sql`DELETE FROM awa.unique_claims WHERE job_id = ANY (${batch.map((e) => String(e.id))}::bigint[])`
        const singles: Array<bigint> = []
        for (const job of jobs) {
          const [one] = yield* storage.enqueueMany([job])
          singles.push(one!.id)
          assert.strictEqual(one!.state, expected[singles.length - 1]!.state)
        }
        assert.deepStrictEqual(withoutIdentity(yield* stored(singles)), withoutIdentity(expected))
        // positions follow the input order within each lane
        const available = batchRows.filter((r) => r.table === "ready")
        for (const lane of new Set(available.map((r) => `${r.queue}/${r.priority}`))) {
          const seqs = available.filter((r) => `${r.queue}/${r.priority}` === lane).map((r) => r.lane_seq!)
          assert.deepStrictEqual(
            seqs,
            [...seqs].sort((a, b) => (a < b ? -1 : 1))
          )
        }
      })
    )

    it.effect(
      "args that are JSON null are stored as JSON null (enqueue(jsonb) turned them into SQL NULL)",
      () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("null-args")
          const one = yield* storage.enqueueMany([{ kind: "n", queue: q, args: null }])
          const two = yield* storage.enqueueMany([
            { kind: "n", queue: q, args: null },
            { kind: "n", queue: q, args: null, runAt: new Date(Date.now() + 60_000) }
          ])
          for (const e of [...one, ...two]) assert.isNull((yield* storage.getJob(e.id)).args)
          const claimed = yield* storage.claim({ queue: q, max: 5, deadlineMs: 0, agingIntervalMs: 0 })
          assert.deepStrictEqual(
            claimed.map((c) => c.args),
            [null, null]
          )
        })
    )

    it.effect("every entry point takes the lane's enqueue lock, the one promote and retries take", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const storage = yield* QueueStorage
        const queues = [fresh("lock"), `${fresh("ünï")} ☃ 😀`, `${fresh("x")}${"y".repeat(180)}`]
        const paths: ReadonlyArray<
          readonly [string, (q: string, p: number) => Effect.Effect<unknown, unknown>]
        > = [
          ["enqueue_one", (q, p) => storage.enqueueMany([{ kind: "l", queue: q, priority: p, args: {} }])],
          [
            "enqueue_batch",
            (q, p) =>
              storage.enqueueMany([
                { kind: "l", queue: q, priority: p, args: {} },
                { kind: "l", queue: q, priority: p, args: { n: 2 } }
              ])
          ],
          [
            "enqueue_batch, two headers",
            (q, p) =>
              storage.enqueueMany([
                { kind: "l", queue: q, priority: p, args: {} },
                { kind: "l", queue: q, priority: p, args: {}, metadata: { m: 1 } }
              ])
          ]
        ]
        for (const [name, enqueue] of paths) {
          for (const q of queues) {
            for (const p of [1, 4]) {
              const locked = yield* Deferred.make<void>()
              const release = yield* Deferred.make<void>()
              const holder = yield* sql
                .withTransaction(
                  Effect.gen(function* () {
                    yield* enqueue(q, p)
                    yield* Deferred.succeed(locked, undefined)
                    yield* Deferred.await(release)
                  })
                )
                .pipe(Effect.forkChild)
              yield* Deferred.await(locked)
              // another connection: the lock as lane_key() names it is taken
              const [free] = yield* sql<{ ok: boolean }>`
                SELECT pg_try_advisory_xact_lock(awa.lock_ns('enqueue'), awa.lane_key(${q}, ${p}, 0)) AS ok`
              yield* Deferred.succeed(release, undefined)
              yield* Fiber.join(holder)
              assert.isFalse(free!.ok, `${name} on ${q}/${p}`)
            }
          }
        }
      })
    )

    it.effect(
      "a batch over several pipelined chunks is all-or-nothing: a conflict in the last chunk stores none",
      () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          // the same database, split into chunks of 3: four calls in one transaction
          const inChunksOf3 = <A, E>(effect: Effect.Effect<A, E, QueueStorage>) =>
            Effect.provide(effect, pgLayer({ enqueueChunkSize: 3 }), { local: true })
          const q = fresh("chunks")
          const unique = { byArgs: true }
          yield* storage.enqueueMany([{ kind: "c", queue: q, args: { n: 10 }, unique }])
          const jobs = Array.from(
            { length: 11 },
            (_, n): NewJob => ({ kind: "c", queue: q, args: { n }, unique })
          )
          const error = yield* Effect.flip(
            inChunksOf3(Effect.flatMap(QueueStorage, (s) => s.enqueueMany(jobs)))
          )
          assert.strictEqual(error._tag, "UniqueConflict")
          assert.strictEqual((yield* storage.listJobs({ queue: q })).length, 1)
          // chunks are checked in turn, while earlier ones go in: bad input in the last chunk
          // still leaves nothing stored
          const bad: Array<NewJob> = [...jobs.slice(0, 9), { kind: "c", queue: q, args: { n: Number.NaN } }]
          const enqueueBad = inChunksOf3(Effect.flatMap(QueueStorage, (s) => s.enqueueMany(bad)))
          const invalid = yield* Effect.flip(enqueueBad)
          assert.strictEqual(invalid._tag, "ValidationError")
          if (invalid._tag === "ValidationError") assert.strictEqual(invalid.field, "args.n")
          assert.strictEqual((yield* storage.listJobs({ queue: q })).length, 1)
          // inside the caller's transaction, which goes on and commits: still none of them
          const sql = yield* SqlClient.SqlClient
          yield* sql.withTransaction(
            Effect.gen(function* () {
              yield* Effect.flip(enqueueBad)
              yield* storage.enqueueMany([{ kind: "c", queue: q, args: { n: 100 } }])
            })
          )
          assert.strictEqual((yield* storage.listJobs({ queue: q })).length, 2)
          // without the conflicting job the other 10 go in, in order, with ids in input order
          const ok = yield* inChunksOf3(Effect.flatMap(QueueStorage, (s) => s.enqueueMany(jobs.slice(0, 10))))
          assert.strictEqual(ok.length, 10)
          const claimed = yield* storage.claim({ queue: q, max: 20, deadlineMs: 0, agingIntervalMs: 0 })
          assert.deepStrictEqual(
            claimed.map((c) => (c.args as { n: number }).n),
            [10, 100, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
          )
          assert.deepStrictEqual(
            claimed.slice(2).map((c) => c.jobId),
            ok.map((e) => e.id)
          )
        })
    )
  })
})

describe("enqueue entry points under concurrency", () => {
  it.live("FIFO per lane holds with single inserts, batches and enqueue(jsonb) racing, with rollbacks", () =>
    Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
      Effect.gen(function* () {
        const q = fresh("fifo-mixed")
        const client = () =>
          pgLayer().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))
        const job = (n: number): NewJob => ({ kind: "f", queue: q, args: { n } })
        const producer = (p: number) =>
          Effect.gen(function* () {
            const sql = yield* SqlClient.SqlClient
            const storage = yield* QueueStorage
            for (let round = 0; round < 6; round++) {
              const n = p * 100 + round * 2
              const rollback = (yield* Random.nextIntBetween(0, 4)) === 0
              yield* sql
                .withTransaction(
                  Effect.gen(function* () {
                    switch (p % 3) {
                      case 0: // enqueue_one, twice
                        yield* storage.enqueueMany([job(n)])
                        yield* storage.enqueueMany([job(n + 1)])
                        break
                      case 1: // enqueue_batch
                        yield* storage.enqueueMany([job(n), job(n + 1)])
                        break
                      default: // 0003's enqueue(jsonb)
                        yield* sql`SELECT * FROM awa.enqueue(${`[${[job(n), job(n + 1)].map(legacyRow).join(",")}]`}::jsonb)`
                    }
                    yield* Effect.sleep(`${yield* Random.nextIntBetween(0, 8)} millis`)
                    if (rollback) return yield* Effect.fail("rollback" as const)
                  })
                )
                .pipe(Effect.ignore)
            }
          }).pipe(Effect.provide(client(), { local: true }))
        const claimed: Array<ClaimedJob> = []
        const claimer = Effect.gen(function* () {
          const storage = yield* QueueStorage
          for (let idle = 0; idle < 30; ) {
            const batch = yield* storage.claim({ queue: q, max: 3, deadlineMs: 0, agingIntervalMs: 0 })
            claimed.push(...batch)
            if (batch.length === 0) {
              idle++
              yield* Effect.sleep("20 millis")
            } else idle = 0
          }
        }).pipe(Effect.provide(client(), { local: true }))
        yield* Effect.all(
          [
            Effect.forEach(
              Array.from({ length: 12 }, (_, p) => p),
              producer,
              { concurrency: 12 }
            ),
            claimer
          ],
          { concurrency: 2 }
        )
        const committed = yield* Effect.flatMap(
          SqlClient.SqlClient,
          (sql) => sql<{ job_id: bigint }>`SELECT job_id FROM awa.ready WHERE queue = ${q} ORDER BY lane_seq`
        ).pipe(Effect.provide(client(), { local: true }))
        assert.isAbove(committed.length, 0)
        // every committed job was claimed exactly once, in position order: no position committed
        // behind a claim mark (that would be a job lost to the cursor)
        assert.deepStrictEqual(
          claimed.map((c) => c.jobId),
          committed.map((r) => r.job_id)
        )
        const args = claimed.map((c) => (c.args as { n: number }).n)
        for (const [i, n] of args.entries()) if (n % 2 === 1) assert.strictEqual(args[i - 1], n - 1)
      })
    )
  )
})
