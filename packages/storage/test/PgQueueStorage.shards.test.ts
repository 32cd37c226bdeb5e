/**
 * Sharded enqueue heads (capabilities.md §22, migration 0042): a queue's `enqueueShards` spreads
 * each priority over that many lanes, so producers and claimers of one hot queue stop waiting for
 * each other's lane lock; FIFO holds per shard and per ordering key; a shard is kept through
 * retries; lowering the width loses nothing.
 */

import { ValidationError } from "@awa/core"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Schedule } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, holdOpenUntil, someoneWaits, withEagerDatabase } from "./pgFixtures.ts"

const job = (
  queue: string,
  n: number,
  more: { readonly orderingKey?: string; readonly concurrencyKey?: string } = {}
) => ({
  kind: "shard",
  queue,
  args: { n },
  ...more
})

/** Jobs per shard of the queue's stored rows (ready and deferred). */
const shardsOf = (queue: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ shard: number; n: number }>`
      SELECT shard, count(*)::int AS n FROM (
        SELECT r.shard FROM awa.ready r WHERE r.queue = ${queue}
        UNION ALL SELECT d.shard FROM awa.deferred d WHERE d.queue = ${queue}) x
      GROUP BY shard ORDER BY shard`.pipe(Effect.map((rows) => new Map(rows.map((r) => [r.shard, r.n]))))
  )

/** The shard of each job of the queue, by its `n`. */
const shardByN = (queue: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ n: number; shard: number }>`
      SELECT (r.args ->> 'n')::int AS n, r.shard FROM awa.ready r WHERE r.queue = ${queue}
      UNION ALL SELECT (d.args ->> 'n')::int, d.shard FROM awa.deferred d WHERE d.queue = ${queue}`.pipe(
      Effect.map((rows) => new Map(rows.map((r) => [r.n, r.shard])))
    )
  )

/** Whether `fiber` was ever seen waiting for an advisory lock before it finished. */
const waitedForALane = <A, E>(fiber: Fiber.Fiber<A, E>) =>
  Effect.gen(function* () {
    let waited = false
    yield* Effect.gen(function* () {
      if (fiber.pollUnsafe() !== undefined) return
      if (yield* someoneWaits) waited = true
      return yield* Effect.fail("not yet" as const)
    }).pipe(Effect.retry(Schedule.spaced("2 millis")))
    return waited
  })

describe("sharded enqueue heads", () => {
  it.live(
    "insert transactions take a sharded queue's shards in turn; a queue of width 1 keeps one lane",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("spread")
          const plain = fresh("plain")
          yield* storage.configureQueue(q, { enqueueShards: 4 })
          for (let n = 0; n < 8; n++) {
            yield* storage.enqueueMany([job(q, n)])
            yield* storage.enqueueMany([job(plain, n)])
          }
          assert.deepStrictEqual(
            [...(yield* shardsOf(q)).entries()],
            [
              [0, 2],
              [1, 2],
              [2, 2],
              [3, 2]
            ]
          )
          assert.deepStrictEqual([...(yield* shardsOf(plain)).entries()], [[0, 8]])
          // every job is claimed, whichever lane it is in
          const claimed = yield* storage.claim(claimOf(q, 100))
          assert.deepStrictEqual(
            claimed.map((c) => (c.args as { n: number }).n).sort((a, b) => a - b),
            [0, 1, 2, 3, 4, 5, 6, 7]
          )
        })
      )
  )

  it.live("an insertMany of several chunks stays in one shard (one draw per transaction)", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("chunks")
        yield* storage.configureQueue(q, { enqueueShards: 8 })
        yield* storage.enqueueMany(Array.from({ length: 5_001 }, (_, n) => job(q, n)))
        const shards = yield* shardsOf(q)
        assert.strictEqual(shards.size, 1)
        assert.strictEqual([...shards.values()][0], 5_001)
      })
    )
  )

  it.live("jobs with one ordering key share a shard and are claimed in insert order", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("ordered")
        yield* storage.configureQueue(q, { enqueueShards: 4 })
        const keys = ["a", "b", "c", "d", "e", "f"]
        // interleaved, each job its own transaction; key = n mod 6
        for (let n = 0; n < 36; n++) yield* storage.enqueueMany([job(q, n, { orderingKey: keys[n % 6]! })])
        const shard = yield* shardByN(q)
        for (let n = 6; n < 36; n++) assert.strictEqual(shard.get(n), shard.get(n % 6), `job ${n}`)
        assert.isAbove(new Set(shard.values()).size, 1, "six keys all went to one shard")
        // a concurrency key without an ordering key follows the same digest
        yield* storage.enqueueMany([job(q, 100, { concurrencyKey: "c" })])
        assert.strictEqual((yield* shardByN(q)).get(100), shard.get(2))
        // claimed a few at a time (lanes interleave), each key's jobs come in insert order
        const seen = new Map<string, Array<number>>()
        for (;;) {
          const claimed = yield* storage.claim(claimOf(q, 5))
          if (claimed.length === 0) break
          for (const c of claimed) {
            const n = (c.args as { n: number }).n
            if (n === 100) continue
            const k = keys[n % 6]!
            seen.set(k, [...(seen.get(k) ?? []), n])
          }
          yield* completeAll(claimed)
        }
        for (const [i, k] of keys.entries()) {
          assert.deepStrictEqual(
            seen.get(k),
            Array.from({ length: 6 }, (_, r) => i + 6 * r),
            `key ${k}`
          )
        }
      })
    )
  )

  it.live("a producer does not wait for another producer's open transaction on a sharded queue", () =>
    withEagerDatabase({}, (url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("producers")
        yield* storage.configureQueue(q, { enqueueShards: 2 })
        const release = yield* Deferred.make<void>()
        // another producer's insert, uncommitted: it holds its lane's enqueue lock to commit
        const holder = yield* holdOpenUntil(
          url,
          `SELECT awa.enqueue_one('shard', '${q}', 2, '{"n":0}', '{}', '[]', 25, NULL, NULL, 0)`,
          release
        )
        const producer = yield* storage
          .enqueueMany([job(q, 1)])
          .pipe(Effect.forkChild({ startImmediately: true }))
        const waited = yield* waitedForALane(producer)
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        yield* Fiber.join(producer)
        assert.isFalse(waited, "the second producer waited for the first one's lane")
        assert.deepStrictEqual([...(yield* shardsOf(q)).keys()], [0, 1])
      })
    )
  )

  it.live("a claimer takes the next shard's jobs instead of waiting for a shard another claimer holds", () =>
    withEagerDatabase({}, (url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("claimers")
        yield* storage.configureQueue(q, { enqueueShards: 2 })
        for (let n = 0; n < 4; n++) yield* storage.enqueueMany([job(q, n)])
        // the first-ranked lane: the one holding the oldest job
        const [first] = yield* sql<{ shard: number }>`
          SELECT r.shard FROM awa.ready r WHERE r.queue = ${q} ORDER BY r.lane_seq LIMIT 1`
        const release = yield* Deferred.make<void>()
        const holder = yield* holdOpenUntil(
          url,
          `SELECT pg_advisory_xact_lock(awa.lock_ns('claim'), awa.lane_key('${q}', 2, ${first!.shard}))`,
          release
        )
        const claimer = yield* storage.claim(claimOf(q, 2)).pipe(Effect.forkChild({ startImmediately: true }))
        const waited = yield* waitedForALane(claimer)
        const claimed = yield* Fiber.join(claimer)
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        assert.isFalse(waited, "the claimer waited for the held shard")
        const byN = yield* shardByN(q)
        assert.deepStrictEqual(
          claimed.map((c) => byN.get((c.args as { n: number }).n)),
          [1 - first!.shard, 1 - first!.shard]
        )
        // the held shard's jobs are still there, in order
        const rest = yield* storage.claim(claimOf(q, 10))
        assert.deepStrictEqual(
          rest.map((c) => byN.get((c.args as { n: number }).n)),
          [first!.shard, first!.shard]
        )
      })
    )
  )

  it.live("a scheduled job and a retried one keep their shard and are claimed from it", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("kept")
        yield* storage.configureQueue(q, { enqueueShards: 4 })
        // scheduled first, so that its shard's lane does not exist when promote moves it
        const [scheduled] = yield* storage.enqueueMany([
          { ...job(q, 0, { orderingKey: "k" }), runAt: new Date(Date.now() + 3_600_000) }
        ])
        const shard = (yield* shardByN(q)).get(0)!
        yield* sql`UPDATE awa.deferred SET run_at = now() WHERE job_id = ${scheduled!.id}`
        assert.isAbove(yield* storage.promoteDue(10), 0)
        const [claimed] = yield* storage.claim(claimOf(q, 1))
        assert.strictEqual(claimed?.jobId, scheduled!.id, "the promoted job was not claimable")
        yield* storage.finalizeMany([
          {
            jobId: claimed!.jobId,
            runLease: claimed!.runLease,
            outcome: { _tag: "Retry", delayMs: 0, error: "again" }
          }
        ])
        assert.strictEqual((yield* shardByN(q)).get(0), shard)
        yield* storage.promoteDue(10)
        assert.strictEqual((yield* shardByN(q)).get(0), shard)
        const [again] = yield* storage.claim(claimOf(q, 1))
        assert.strictEqual(again?.jobId, scheduled!.id)
        assert.strictEqual(again?.attempt, 2)
      })
    )
  )

  it.live("a retried failed job and a DLQ retry join their key's shard, also in another queue", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("reenter")
        const other = fresh("moved")
        yield* storage.configureQueue(q, { enqueueShards: 4 })
        yield* storage.configureQueue(other, { enqueueShards: 3 })
        /** The shard of job `n`'s newest ready row in `queue`. */
        const newestShard = (queue: string, n: number) =>
          Effect.map(
            sql<{ shard: number }>`
              SELECT r.shard FROM awa.ready r WHERE r.queue = ${queue} AND (r.args ->> 'n')::int = ${n}
              ORDER BY r.lane_seq DESC LIMIT 1`,
            (rows) => rows[0]?.shard
          )
        // a key whose shard is not 0 in either queue (so a re-entry at shard 0 would show)
        const keys = ["a", "b", "c", "d", "e", "f", "g", "h"]
        for (const [i, k] of keys.entries()) {
          yield* storage.enqueueMany([job(q, 100 + i, { orderingKey: k })])
          yield* storage.enqueueMany([job(other, 100 + i, { orderingKey: k })])
        }
        const inQ = yield* shardByN(q)
        const inOther = yield* shardByN(other)
        const i = keys.findIndex((_, i) => inQ.get(100 + i) !== 0 && inOther.get(100 + i) !== 0)
        assert.isAtLeast(i, 0, "no key off shard 0 in both queues")
        const key = keys[i]!
        const failAll = (max: number) =>
          Effect.flatMap(storage.claim(claimOf(q, max)), (claimed) =>
            storage.finalizeMany(
              claimed.map((c) => ({
                jobId: c.jobId,
                runLease: c.runLease,
                outcome: { _tag: "Fail" as const, error: "x" }
              }))
            )
          )
        yield* completeAll(yield* storage.claim(claimOf(q, 50)))
        // retry_job: a failed job (no DLQ) made available again
        const [first] = yield* storage.enqueueMany([job(q, 1, { orderingKey: key })])
        yield* failAll(1)
        yield* storage.retryJob(first!.id)
        assert.strictEqual(yield* newestShard(q, 1), inQ.get(100 + i), "retry_job left the key's shard")
        // the DLQ: one entry moved to the other queue, one retried in bulk in place
        yield* storage.configureQueue(q, { dlq: true })
        const [second] = yield* storage.enqueueMany([job(q, 2, { orderingKey: key })])
        yield* failAll(2)
        yield* storage.retryFromDlq(first!.id, { queue: other })
        assert.strictEqual(
          yield* newestShard(other, 1),
          inOther.get(100 + i),
          "a DLQ retry left the key's shard"
        )
        yield* storage.retryDlqBulk({ queue: q }, {})
        assert.strictEqual(
          yield* newestShard(q, 2),
          inQ.get(100 + i),
          "a bulk DLQ retry left the key's shard"
        )
        assert.strictEqual((yield* storage.getJob(second!.id)).state, "available")
      })
    )
  )

  it.live("lowering the width loses nothing: the old shards are still claimed", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("lower")
        yield* storage.configureQueue(q, { enqueueShards: 4 })
        for (let n = 0; n < 8; n++) yield* storage.enqueueMany([job(q, n)])
        yield* storage.configureQueue(q, { enqueueShards: 1 })
        for (let n = 8; n < 10; n++) yield* storage.enqueueMany([job(q, n)])
        assert.strictEqual((yield* shardsOf(q)).get(0), 4)
        const all: Array<number> = []
        for (;;) {
          const claimed = yield* storage.claim(claimOf(q, 3))
          if (claimed.length === 0) break
          all.push(...claimed.map((c) => (c.args as { n: number }).n))
          yield* completeAll(claimed)
        }
        assert.deepStrictEqual(
          all.sort((a, b) => a - b),
          Array.from({ length: 10 }, (_, n) => n)
        )
      })
    )
  )

  it.live("bad widths and ordering keys are refused with a ValidationError, nothing written", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("bad")
        yield* storage.configureQueue(q, { enqueueShards: 3 })
        for (const bad of [0, 65, 1.5, Number.NaN]) {
          const error = yield* Effect.flip(storage.configureQueue(q, { enqueueShards: bad }))
          assert.instanceOf(error, ValidationError)
          assert.strictEqual((error as ValidationError).field, "enqueueShards")
        }
        const [meta] = yield* sql<{
          w: number
        }>`SELECT enqueue_shards AS w FROM awa.queue_meta WHERE queue = ${q}`
        assert.strictEqual(meta?.w, 3)
        for (const bad of ["", "x".repeat(1025), "a\u0000b"]) {
          const error = yield* Effect.flip(storage.enqueueMany([job(q, 1), job(q, 2, { orderingKey: bad })]))
          assert.instanceOf(error, ValidationError)
          assert.strictEqual((error as ValidationError).field, "orderingKey")
        }
        assert.strictEqual((yield* shardsOf(q)).size, 0)
      })
    )
  )
})

describe("sharded enqueue heads under concurrency", () => {
  it.live(
    "concurrent producers and claimers: every job claimed once, each producer's jobs of a key in insert order",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("race")
          yield* storage.configureQueue(q, { enqueueShards: 4 })
          const producers = 4
          const perProducer = 150
          const keys = 10
          // n encodes (producer, index): producer p's i-th job is p * 1000 + i
          const produce = (p: number) =>
            Effect.forEach(
              Array.from({ length: perProducer }, (_, i) => i),
              (i) =>
                storage.enqueueMany([
                  job(q, p * 1000 + i, i % 3 === 0 ? {} : { orderingKey: `key-${(p + i) % keys}` })
                ]),
              { discard: true }
            )
          const claimedInOrder: Array<number> = []
          let producing = producers
          const claimer = Effect.gen(function* () {
            for (;;) {
              const claimed = yield* storage.claim(claimOf(q, 7))
              for (const c of claimed) claimedInOrder.push((c.args as { n: number }).n)
              if (claimed.length > 0) yield* completeAll(claimed)
              else if (producing === 0) return
              else yield* Effect.yieldNow
            }
          })
          const claimers = yield* Effect.forEach([1, 2, 3], () =>
            Effect.forkChild(claimer, { startImmediately: true })
          )
          yield* Effect.forEach(
            Array.from({ length: producers }, (_, p) => p),
            (p) =>
              Effect.ensuring(
                produce(p),
                Effect.sync(() => void producing--)
              ),
            { concurrency: "unbounded", discard: true }
          )
          yield* Effect.forEach(claimers, Fiber.join, { discard: true })
          // a last pass after every producer committed: nothing left behind
          assert.deepStrictEqual(yield* storage.claim(claimOf(q, 100)), [])
          const expected = Array.from({ length: producers }, (_, p) =>
            Array.from({ length: perProducer }, (_, i) => p * 1000 + i)
          ).flat()
          assert.deepStrictEqual(
            [...claimedInOrder].sort((a, b) => a - b),
            expected,
            "a job was lost or claimed twice"
          )
          // FIFO per ordering key: one producer's jobs of one key share a shard, and their
          // positions in it follow the producer's insert order (claims take a lane in position
          // order, which the contract tests; Node's arrival order of two claimers' answers is not
          // the lanes' order, so it is not what is checked)
          const rows = yield* sql<{ n: number; shard: number; lane_seq: string }>`
            SELECT (r.args ->> 'n')::int AS n, r.shard, r.lane_seq::text FROM awa.ready r WHERE r.queue = ${q}`
          const lastOf = new Map<
            string,
            { readonly i: number; readonly shard: number; readonly seq: bigint }
          >()
          for (const row of [...rows].sort((a, b) => a.n - b.n)) {
            const p = Math.floor(row.n / 1000)
            const i = row.n % 1000
            if (i % 3 === 0) continue
            const k = `producer ${p}, key ${(p + i) % keys}`
            const last = lastOf.get(k)
            const seq = BigInt(row.lane_seq)
            if (last !== undefined) {
              assert.strictEqual(row.shard, last.shard, k)
              assert.isTrue(seq > last.seq, `${k}: job ${i} is not after job ${last.i} in its lane`)
            }
            lastOf.set(k, { i, shard: row.shard, seq })
          }
          assert.isAbove(new Set(rows.map((r) => r.shard)).size, 1)
        })
      )
  )
})
