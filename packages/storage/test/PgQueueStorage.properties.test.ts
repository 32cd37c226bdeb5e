/**
 * Properties of the Postgres engine that the simulation cannot show (issue 3, storage-engine.md
 * §13): concurrency on separate connections, transactions, rotation and prune, dead tuples.
 */
import { randomUUID } from "node:crypto"
import { TestDatabase } from "@awa/testing"
import { PgClient, PgConnection } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Queue, Random, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import {
  type ClaimedJob,
  type PruneOutcome,
  QueueStorage,
  type RetentionParams
} from "../src/QueueStorage.ts"
import {
  claimOf,
  completeAll,
  day,
  eagerStorage,
  fresh,
  keepAll,
  keepNothing,
  withStorageDatabase as withDatabase
} from "./pgFixtures.ts"

const job = (queue: string, n = 0, priority = 2) => ({ kind: "prop", queue, args: { n }, priority })

/** One maintenance tick as the leader runs it: rotate, then prune until nothing more is prunable. */
const tick = (retention: RetentionParams = keepAll) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    yield* storage.rotate
    const outcomes: Array<PruneOutcome> = []
    for (let i = 0; i < 32; i++) {
      const outcome = yield* storage.prune(retention)
      outcomes.push(outcome)
      if (outcome._tag !== "Pruned") break
    }
    return outcomes
  })

const ringStats = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  return yield* sql<{ relname: string; ins: bigint; upd: bigint; del: bigint; dead: bigint; live: bigint }>`
    SELECT relname, n_tup_ins AS ins, n_tup_upd AS upd, n_tup_del AS del, n_dead_tup AS dead, n_live_tup AS live
    FROM pg_stat_user_tables WHERE schemaname = 'awa' ORDER BY relname`
})

describe("PgQueueStorage properties", () => {
  it.live("transactional enqueue: rollback never existed, commit is claimable and wakes listeners", () =>
    withDatabase((_url) =>
      Effect.gen(function* () {
        const sql = yield* PgClient.PgClient
        const storage = yield* QueueStorage
        // a queue name of the maximum length still fits the 63-byte channel: the payload carries it
        const q = `${"w".repeat(190)}${randomUUID().slice(0, 10)}`
        const marker = fresh("marker")
        const notes = yield* Effect.scoped(
          Effect.gen(function* () {
            const wake = yield* sql.listen("awa_wake_awa")
            // a worker waits on both queues (migration 0051: inserts wake only a waiting worker)
            const waiter = yield* PgConnection.make(sql.config)
            yield* waiter.query(
              "SELECT pg_advisory_lock_shared(awa.lock_ns('waiters'), awa.waiter_bucket(q)) FROM unnest($1::text[]) q",
              [[q, marker]]
            )
            yield* sql
              .withTransaction(
                Effect.andThen(storage.enqueueMany([job(q, 1)]), Effect.fail("rollback" as const))
              )
              .pipe(Effect.flip)
            assert.deepStrictEqual(yield* storage.claim(claimOf(q, 10)), [])
            yield* sql.withTransaction(
              Effect.gen(function* () {
                yield* storage.enqueueMany([job(q, 2)])
                // a nested transaction (savepoint) rolled back removes only its own job
                yield* sql
                  .withTransaction(
                    Effect.andThen(storage.enqueueMany([job(q, 3)]), Effect.fail("inner" as const))
                  )
                  .pipe(Effect.flip)
              })
            )
            // a marker committed last: notifications arrive in commit order, so everything the
            // transactions above sent has arrived once the marker has (no wait for time)
            yield* storage.enqueueMany([job(marker, 0)])
            const seen: Array<{ payload: string }> = []
            while (seen.at(-1)?.payload !== marker) seen.push(yield* Queue.take(wake))
            return seen.slice(0, -1)
          })
        )
        // only the committed transaction notified; the payload carries the (long) queue name
        assert.deepStrictEqual(
          notes.map((n) => n.payload),
          [q]
        )
        const claimed = yield* storage.claim(claimOf(q, 10))
        assert.deepStrictEqual(
          claimed.map((c) => c.args),
          [{ n: 2 }]
        )
      })
    )
  )

  it.live("FIFO per lane holds with 16 concurrent producers, random rollbacks and a slow producer", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const q = fresh("fifo16")
        const producer = (p: number) =>
          Effect.gen(function* () {
            const sql = yield* SqlClient.SqlClient
            const storage = yield* QueueStorage
            for (let round = 0; round < 6; round++) {
              const rollback = (yield* Random.nextIntBetween(0, 4)) === 0
              const slow = p === 0 && round === 1
              yield* sql
                .withTransaction(
                  Effect.gen(function* () {
                    yield* storage.enqueueMany([job(q, p * 100 + round * 2), job(q, p * 100 + round * 2 + 1)])
                    if (slow) yield* Effect.sleep("400 millis")
                    else yield* Effect.sleep(`${yield* Random.nextIntBetween(0, 5)} millis`)
                    if (rollback) return yield* Effect.fail("rollback" as const)
                  })
                )
                .pipe(Effect.ignore)
            }
          }).pipe(Effect.provide(eagerStorage(url, 1), { local: true }))
        const claimed: Array<ClaimedJob> = []
        const claimer = Effect.gen(function* () {
          const storage = yield* QueueStorage
          for (let idle = 0; idle < 30; ) {
            const batch = yield* storage.claim(claimOf(q, 3))
            claimed.push(...batch)
            if (batch.length === 0) {
              idle++
              yield* Effect.sleep("20 millis")
            } else idle = 0
          }
        }).pipe(Effect.provide(eagerStorage(url, 1), { local: true }))
        yield* Effect.all(
          [
            Effect.forEach(
              Array.from({ length: 16 }, (_, p) => p),
              producer,
              { concurrency: 16 }
            ),
            claimer
          ],
          {
            concurrency: 2
          }
        )
        const sql = yield* SqlClient.SqlClient
        const committed = yield* sql<{ job_id: bigint; lane_seq: bigint }>`
        SELECT job_id, lane_seq FROM awa.ready WHERE queue = ${q} ORDER BY lane_seq`
        assert.isAbove(committed.length, 0)
        // every committed job was claimed exactly once, in position order
        assert.deepStrictEqual(
          claimed.map((c) => c.jobId),
          committed.map((r) => r.job_id)
        )
        // within one producer's transaction the two jobs keep their order
        const args = claimed.map((c) => (c.args as { n: number }).n)
        for (const [i, n] of args.entries()) if (n % 2 === 1) assert.strictEqual(args[i - 1], n - 1)
      })
    )
  )

  it.live("each (job_id, run_lease) is handed out exactly once across concurrent claimers", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const q = fresh("once")
        const storage = yield* QueueStorage
        const total = 2000
        yield* storage.enqueueMany(Array.from({ length: total }, (_, n) => job(q, n, 1 + (n % 4))))
        const seen: Array<string> = []
        const claimer = Effect.gen(function* () {
          const s = yield* QueueStorage
          for (let idle = 0; idle < 20 && seen.length < total; ) {
            const batch = yield* s.claim(claimOf(q, 7))
            for (const c of batch) seen.push(`${c.jobId}:${c.runLease}`)
            idle = batch.length === 0 ? idle + 1 : 0
          }
        }).pipe(Effect.provide(eagerStorage(url, 1), { local: true }))
        yield* Effect.all(
          Array.from({ length: 6 }, () => claimer),
          { concurrency: 6 }
        )
        assert.strictEqual(seen.length, total)
        assert.strictEqual(new Set(seen).size, total)
      })
    )
  )

  it.live(
    "exactly once, in lane order, with producers, claimers and a leader rotating and pruning without pause",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const q = fresh("churn")
          const total = 3000
          const seen: Array<{ token: string; priority: number; n: number }> = []
          const batches: Array<Array<{ priority: number; n: number }>> = []
          const prunes = Effect.flatMap(
            SqlClient.SqlClient,
            (sql) => sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.ring_prunes WHERE ring = 'queue'`
          ).pipe(Effect.map((rows) => rows[0]!.n))
          let produced = false
          const producer = Effect.gen(function* () {
            const s = yield* QueueStorage
            for (let i = 0; i < total / 100; i++) {
              yield* s.enqueueMany(Array.from({ length: 100 }, (_, k) => job(q, i * 100 + k, 1 + (k % 2))))
              // every tenth batch waits for the leader's next prune, so prunes land among the
              // claims however the machine schedules them (a condition, not a time)
              if (i % 10 === 9) {
                const before = yield* prunes
                while ((yield* prunes) <= before) yield* Effect.sleep("5 millis")
              }
            }
            produced = true
          }).pipe(Effect.provide(eagerStorage(url, 1), { local: true }))
          const claimer = Effect.gen(function* () {
            const s = yield* QueueStorage
            // idle polls count only once everything is produced (the producer may wait for a prune)
            for (let idle = 0; idle < 400 && seen.length < total; ) {
              const batch = yield* s.claim(claimOf(q, 13))
              for (const c of batch)
                seen.push({
                  token: `${c.jobId}:${c.runLease}`,
                  priority: c.priority,
                  n: (c.args as { n: number }).n
                })
              if (batch.length > 0) {
                batches.push(batch.map((c) => ({ priority: c.priority, n: (c.args as { n: number }).n })))
                const results = yield* completeAll(batch)
                assert.isTrue(results.every((r) => r._tag === "Applied"))
              } else yield* Effect.sleep("5 millis")
              idle = batch.length === 0 && produced ? idle + 1 : 0
            }
          }).pipe(Effect.provide(eagerStorage(url, 1), { local: true }))
          // the leader's duties back to back: every claim races a rotation or a prune
          let running = true
          const leader = Effect.gen(function* () {
            while (running) {
              yield* tick(keepNothing)
              yield* Effect.sleep("2 millis")
            }
          }).pipe(Effect.provide(eagerStorage(url, 1), { local: true }))
          const leaderFiber = yield* Effect.forkChild(leader, { startImmediately: true })
          yield* Effect.all([producer, claimer, claimer, claimer, claimer], { concurrency: 5 })
          running = false
          yield* Fiber.join(leaderFiber)
          assert.strictEqual(seen.length, total)
          assert.strictEqual(new Set(seen.map((c) => c.token)).size, total, "a token handed out twice")
          assert.strictEqual(new Set(seen.map((c) => c.n)).size, total, "a job handed out twice")
          // FIFO per lane (one producer, so a lane's positions follow n): every claim took the
          // lane's next rows, so within a lane the batches are disjoint, increasing runs of n
          for (const priority of [1, 2]) {
            const runs = batches
              .map((b) => b.filter((c) => c.priority === priority).map((c) => c.n))
              .filter((run) => run.length > 0)
              .sort((a, b) => a[0]! - b[0]!)
            for (const run of runs)
              assert.deepStrictEqual(
                run,
                [...run].sort((a, b) => a - b)
              )
            for (let i = 1; i < runs.length; i++) assert.isBelow(runs[i - 1]!.at(-1)!, runs[i]![0]!)
          }
          assert.isAbove(yield* prunes, 2, "the ring was pruned while claims ran")
        })
      ),
    120_000
  )

  it.live("completion, rescue and cancel racing on one attempt close it exactly once", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const q = fresh("race")
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        yield* storage.enqueueMany(Array.from({ length: 40 }, (_, n) => job(q, n)))
        const claimed = yield* storage.claim({ queue: q, max: 40, deadlineMs: 1, agingIntervalMs: 0 })
        yield* Effect.sleep("20 millis")
        const completer = Effect.suspend(() => Effect.forEach(claimed, (c) => completeAll([c]))).pipe(
          Effect.provide(eagerStorage(url, 1), { local: true })
        )
        const rescuer = Effect.flatMap(QueueStorage, (s) =>
          Effect.forEach(claimed, () => s.rescueDeadlines(3))
        ).pipe(Effect.provide(eagerStorage(url, 1), { local: true }))
        const canceller = Effect.flatMap(QueueStorage, (s) =>
          Effect.forEach(claimed, (c) => s.cancelJob(c.jobId, "race").pipe(Effect.ignore))
        ).pipe(Effect.provide(eagerStorage(url, 1), { local: true }))
        const [completions] = yield* Effect.all([completer, rescuer, canceller], { concurrency: 3 })
        for (const [i, c] of claimed.entries()) {
          const closures = yield* sql<{ outcome: string }>`
          SELECT outcome FROM awa.closures WHERE job_id = ${c.jobId} AND run_lease = ${c.runLease}`
          assert.strictEqual(closures.length, 1, `attempt ${c.jobId}:${c.runLease}`)
          const completedHere = completions[i]![0]!._tag === "Applied"
          assert.strictEqual(completedHere, closures[0]!.outcome === "completed")
        }
      })
    )
  )

  it.live("prune carries unclaimed rows and open claims, and waits out in-flight enqueues", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("prune")
        // drain whatever earlier tests left so this test starts from a prunable ring
        yield* drainRing

        // 1. an unclaimed row is carried into the current slot (migration 0021), still available
        const [waiting] = yield* storage.enqueueMany([job(q, 1)])
        assert.strictEqual(yield* storage.rotate, "Rotated")
        assert.strictEqual((yield* storage.prune(keepAll))._tag, "Pruned")
        assert.strictEqual((yield* storage.getJob(waiting!.id)).state, "available")
        // 2. once claimed, the still-open attempt is carried forward too
        const [open] = yield* storage.claim(claimOf(q, 1))
        assert.strictEqual(open!.jobId, waiting!.id)
        assert.strictEqual(yield* storage.rotate, "Rotated")
        const pruned = yield* storage.prune(keepAll)
        assert.strictEqual(pruned._tag, "Pruned")
        if (pruned._tag === "Pruned") assert.strictEqual(pruned.carried, 1)
        assert.strictEqual((yield* storage.getJob(open!.jobId)).state, "running")
        assert.deepStrictEqual(
          yield* storage.claim(claimOf(q, 1)),
          [],
          "the carried attempt is not claimable again"
        )
        assert.deepStrictEqual(yield* completeAll([open!]), [{ _tag: "Applied", state: "completed" }])

        // 3. an enqueue still in flight in the slot (until released): prune cannot lock it and
        // gives up at once
        const enqueued = yield* Deferred.make<void>()
        const commit = yield* Deferred.make<void>()
        const holder = yield* Effect.gen(function* () {
          const s = yield* QueueStorage
          const c = yield* SqlClient.SqlClient
          return yield* c.withTransaction(
            Effect.andThen(
              s.enqueueMany([job(q, 3)]),
              Effect.andThen(Deferred.succeed(enqueued, undefined), Deferred.await(commit))
            )
          )
        }).pipe(
          Effect.provide(eagerStorage(url, 1), { local: true }),
          Effect.forkChild({ startImmediately: true })
        )
        yield* Deferred.await(enqueued)
        // traffic on another lane (the holder keeps its own lane locked until it commits)
        const other = fresh("prune-other")
        yield* storage.enqueueMany([job(other, 2)])
        yield* completeAll(yield* storage.claim(claimOf(other, 1)))
        assert.strictEqual(yield* storage.rotate, "Rotated")
        const blocked = yield* storage.prune(keepAll)
        assert.deepStrictEqual(blocked, { _tag: "Blocked", reason: "lock" })
        yield* Deferred.succeed(commit, undefined)
        yield* Fiber.await(holder)
        // committed now: its row is unclaimed, so it is carried (0021), and claimed afterwards
        assert.strictEqual((yield* storage.prune(keepAll))._tag, "Pruned")
        const [late] = yield* storage.claim(claimOf(q, 5))
        assert.deepStrictEqual(late!.args, { n: 3 })
        yield* completeAll([late!])

        // 4. a concurrent reader of the ring makes prune give up with Blocked(lock), not wait
        yield* storage.enqueueMany([job(q, 4)])
        yield* completeAll(yield* storage.claim(claimOf(q, 1)))
        assert.strictEqual(yield* storage.rotate, "Rotated")
        const read = yield* Deferred.make<void>()
        const done = yield* Deferred.make<void>()
        const reader = yield* Effect.gen(function* () {
          const c = yield* SqlClient.SqlClient
          return yield* c.withTransaction(
            Effect.andThen(
              c`SELECT count(*) FROM awa.ready`,
              Effect.andThen(Deferred.succeed(read, undefined), Deferred.await(done))
            )
          )
        }).pipe(
          Effect.provide(eagerStorage(url, 1), { local: true }),
          Effect.forkChild({ startImmediately: true })
        )
        yield* Deferred.await(read)
        assert.deepStrictEqual(yield* storage.prune(keepAll), { _tag: "Blocked", reason: "lock" })
        yield* Deferred.succeed(done, undefined)
        yield* Fiber.await(reader)
        assert.strictEqual((yield* storage.prune(keepAll))._tag, "Pruned")
        const rows = yield* sql<{
          n: bigint
        }>`SELECT count(*) AS n FROM awa.ring_prunes WHERE ring = 'queue'`
        assert.isAbove(Number(rows[0]!.n), 2)
      })
    )
  )

  it.live("completed history outlives the ring for its retention and holds unique keys until reclaimed", () =>
    withDatabase((_url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("history")
        yield* drainRing
        const unique = { byArgs: true }
        const [kept] = yield* storage.enqueueMany([{ ...job(q, 1), unique }])
        yield* completeAll(yield* storage.claim(claimOf(q, 1)))
        // wrap the ring: 17 rotations with traffic, pruning as we go
        for (let i = 0; i < 18; i++) {
          yield* storage.enqueueMany([job(q, 100 + i)])
          yield* completeAll(yield* storage.claim(claimOf(q, 5)))
          yield* tick(keepAll)
        }
        const view = yield* storage.getJob(kept!.id)
        assert.strictEqual(view.state, "completed")
        assert.deepStrictEqual(view.args, { n: 1 })
        // completed is in the default mask: the key is still held by the history row
        const conflict = yield* Effect.flip(storage.enqueueMany([{ ...job(q, 1), unique }]))
        assert.strictEqual(conflict._tag, "UniqueConflict")
        // reclaim the history slot: rotate the history ring and prune it with no retention
        assert.strictEqual(yield* storage.rotateHistory(0), "Rotated")
        let outcome: PruneOutcome = { _tag: "Noop" }
        for (let i = 0; i < 5 && outcome._tag !== "Pruned"; i++)
          outcome = yield* storage.pruneHistory(keepNothing)
        assert.strictEqual(outcome._tag, "Pruned")
        assert.strictEqual((yield* Effect.flip(storage.getJob(kept!.id)))._tag, "JobNotFound")
        const [again] = yield* storage.enqueueMany([{ ...job(q, 1), unique }])
        assert.isTrue(again!.id > kept!.id)
      })
    )
  )

  it.live(
    "long-running attempts are carried forward, so rotation never stalls and partitions stay bounded",
    () =>
      withDatabase((_url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("long")
          yield* drainRing
          yield* storage.enqueueMany(Array.from({ length: 3 }, (_, n) => job(q, n, 1)))
          const long = yield* storage.claim(claimOf(q, 3))
          const start = (yield* storage.status).generation
          const sizes: Array<number> = []
          let carried = 0
          for (let round = 0; round < 40; round++) {
            yield* storage.enqueueMany(Array.from({ length: 100 }, (_, n) => job(q, 1000 + n)))
            yield* completeAll(yield* storage.claim(claimOf(q, 100)))
            for (const o of yield* tick(keepNothing)) if (o._tag === "Pruned") carried += o.carried
            const [largest] = yield* sql<{ n: bigint }>`
          SELECT max(c) AS n FROM (SELECT count(*) AS c FROM awa.ready GROUP BY slot) s`
            sizes.push(Number(largest?.n ?? 0))
          }
          const end = (yield* storage.status).generation
          assert.isAtLeast(Number(end - start), 38, "rotation kept going through more than two ring wraps")
          assert.isAtLeast(carried, 3 * 2, "the long attempts were carried on every wrap")
          assert.isAtMost(Math.max(...sizes), 100 + 3, `largest partition per round: ${sizes.join(",")}`)
          const done = yield* completeAll(long)
          assert.deepStrictEqual(
            done.map((d) => d._tag),
            ["Applied", "Applied", "Applied"]
          )
        })
      )
  )

  it.live("with the MVCC horizon pinned, 50,000 jobs leave no dead tuples in the ring tables", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const q = fresh("pinned")
        const total = 50_000
        yield* drainRing
        const before = new Map((yield* ringStats).map((r) => [r.relname, r]))
        // a REPEATABLE READ transaction holding an xid and a snapshot for the whole run
        const pinned = yield* Deferred.make<void>()
        const pin = yield* Effect.gen(function* () {
          const c = yield* SqlClient.SqlClient
          return yield* c.withTransaction(
            Effect.gen(function* () {
              yield* c`SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`
              yield* c`SELECT txid_current(), count(*) FROM pg_class`
              yield* Deferred.succeed(pinned, undefined)
              yield* Effect.never
            })
          )
        }).pipe(
          Effect.provide(eagerStorage(url, 1), { local: true }),
          Effect.forkChild({ startImmediately: true })
        )
        yield* Deferred.await(pinned)
        yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          for (let done = 0; done < total; done += 1000) {
            yield* storage.enqueueMany(Array.from({ length: 1000 }, (_, n) => job(q, done + n)))
            for (let i = 0; i < 2; i++) yield* completeAll(yield* storage.claim(claimOf(q, 512)))
            yield* tick(keepNothing)
          }
          // the mutable tables take some traffic too: retries and heartbeats
          yield* storage.enqueueMany(Array.from({ length: 200 }, (_, n) => job(q, n)))
          const some = yield* storage.claim(claimOf(q, 200))
          yield* storage.heartbeatMany(some.map((c) => ({ jobId: c.jobId, runLease: c.runLease })))
          yield* storage.finalizeMany(
            some.map((c) => ({
              jobId: c.jobId,
              runLease: c.runLease,
              outcome: { _tag: "Retry", delayMs: 0, error: "x" }
            }))
          )
          while ((yield* storage.promoteDue(1000)) > 0)
            yield* completeAll(yield* storage.claim(claimOf(q, 512)))
          yield* completeAll(yield* storage.claim(claimOf(q, 512)))
        }).pipe(Effect.provide(eagerStorage(url, 2), { local: true }))
        // the workload's connections are closed: wait until the server's statistics show all of
        // its enqueues (the statistics of a closed connection reach the views a little later)
        const readyInserts = (stats: ReadonlyArray<{ relname: string; ins: bigint }>) =>
          stats
            .filter((r) => /^ready_\d+$/.test(r.relname))
            .reduce((n, r) => n + Number(r.ins - (before.get(r.relname)?.ins ?? 0n)), 0)
        let after = yield* ringStats
        for (let i = 0; i < 300 && readyInserts(after) < total; i++) {
          yield* Effect.sleep("100 millis")
          after = yield* ringStats
        }
        const ringTable =
          /^(ready|ready_tombstones|claims|claim_marks|claim_spans|closures|terminal|history)_\d+$/
        let ringRows = 0
        for (const r of after.filter((r) => ringTable.test(r.relname))) {
          const b = before.get(r.relname)
          assert.strictEqual(Number(r.upd - (b?.upd ?? 0n)), 0, `${r.relname} updates`)
          assert.strictEqual(Number(r.del - (b?.del ?? 0n)), 0, `${r.relname} deletes`)
          assert.strictEqual(Number(r.dead), 0, `${r.relname} dead tuples`)
          ringRows++
        }
        assert.isAtLeast(ringRows, 16 * 6)
        // mutable tables: bounded by the in-flight work (200 retried attempts), not by 50,000 jobs
        for (const name of ["deferred", "attempt_state", "unique_claims"]) {
          const r = after.find((x) => x.relname === name)!
          assert.isAtMost(Number(r.dead), 1000, `${name} dead tuples`)
        }
        // reader gone: the ring drains back to its current slot
        yield* Fiber.interrupt(pin)
        yield* drainRing
        const sql = yield* SqlClient.SqlClient
        const [left] = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM awa.ready WHERE slot <> (SELECT slot FROM awa.ring_current('queue'))`
        assert.strictEqual(left!.n, 0, "rows left outside the current slot")
      })
    )
  )
})

/** Completes everything claimable and prunes until the ring is fully reclaimed. */
const drainRing = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const sql = yield* SqlClient.SqlClient
  const queues = yield* sql<{ queue: string }>`SELECT DISTINCT queue FROM awa.lanes`
  for (const { queue } of queues) {
    for (
      let batch = yield* storage.claim(claimOf(queue, 1000));
      batch.length > 0;
      batch = yield* storage.claim(claimOf(queue, 1000))
    ) {
      yield* completeAll(batch)
    }
  }
  for (let i = 0; i < 20; i++) yield* tick(keepNothing)
})

describe("PgQueueStorage regressions", () => {
  it.live("multi-call batches over the same lanes in opposite orders never deadlock", () =>
    Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
      Effect.gen(function* () {
        const lanes = ["dl-a", "dl-b", "dl-c", "dl-d"]
        const batch = (order: ReadonlyArray<string>) =>
          Effect.flatMap(QueueStorage, (s) =>
            s.enqueueMany(order.flatMap((q) => [job(q, 1), job(q, 2)]))
          ).pipe(
            Effect.provide(
              (
                pgLayer({ enqueueChunkSize: 1 }) as Layer.Layer<QueueStorage, never, SqlClient.SqlClient>
              ).pipe(Layer.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 }))),
              { local: true }
            )
          )
        const results = yield* Effect.all(
          Array.from({ length: 8 }, (_, i) => batch(i % 2 === 0 ? lanes : [...lanes].reverse())),
          { concurrency: 8 }
        )
        assert.strictEqual(results.flat().length, 8 * 8)
        // ids come back in input order, and FIFO inside each lane follows the input order
        for (const r of results) assert.strictEqual(new Set(r.map((x) => x.id)).size, 8)
      })
    )
  )

  it.live("a job cancelled while available and then retried has one representation per attempt", () =>
    withDatabase(() =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("cancel-retry")
        const [enq] = yield* storage.enqueueMany([job(q, 1)])
        yield* storage.cancelJob(enq!.id, "oops")
        const retried = yield* storage.retryJob(enq!.id)
        assert.strictEqual(retried.state, "available")
        const [c] = yield* storage.claim(claimOf(q, 5))
        assert.strictEqual(c!.jobId, enq!.id)
        const running = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM awa.job_representations WHERE job_id = ${enq!.id} AND state = 'running'`
        assert.strictEqual(running[0]!.n, 1)
        yield* completeAll([c!])
        const view = yield* storage.getJob(enq!.id)
        assert.strictEqual(view.state, "completed")
        assert.deepStrictEqual(
          view.errors.map((e) => e.error),
          ["cancelled: oops"]
        )
        const terminal = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM awa.job_representations WHERE job_id = ${enq!.id} AND rank = 4 AND state = 'completed'`
        assert.strictEqual(terminal[0]!.n, 1)
      })
    )
  )
})

describe("failed-job retention floor", () => {
  it.live(
    "a failed job outlives ring prunes within the failed retention, stays retryable, and goes after it",
    () =>
      withDatabase(() =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("floor")
          const fail = (c: ClaimedJob) =>
            storage.finalizeMany([
              { jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Fail", error: "nope" } }
            ])
          const [kept, dropped] = yield* storage.enqueueMany([job(q, 1), job(`${q}-short`, 2)])
          yield* storage.configureQueue(`${q}-short`, {})
          yield* fail((yield* storage.claim(claimOf(q, 1)))[0]!)
          yield* fail((yield* storage.claim(claimOf(`${q}-short`, 1)))[0]!)
          // per-queue retention: the short queue keeps failed jobs for 0 ms
          const sql = yield* SqlClient.SqlClient
          yield* sql`UPDATE awa.queue_meta SET failed_retention = interval '0' WHERE queue = ${`${q}-short`}`
          for (let i = 0; i < 18; i++) {
            yield* storage.enqueueMany([job(q, 100 + i)])
            yield* completeAll(yield* storage.claim(claimOf(q, 5)))
            yield* tick({ completedMs: 0, failedMs: 3 * day, cancelledMs: 0 })
          }
          const status = yield* storage.status
          assert.isAtLeast(Number(status.generation), 17, "the ring wrapped")
          const view = yield* storage.getJob(kept!.id)
          assert.deepStrictEqual([view.state, view.errors.at(-1)!.error], ["failed", "nope"])
          assert.strictEqual((yield* Effect.flip(storage.getJob(dropped!.id)))._tag, "JobNotFound")
          // still retryable by an operator, straight from history
          const back = yield* storage.retryJob(kept!.id)
          assert.strictEqual(back.state, "available")
          const [again] = yield* storage.claim(claimOf(q, 10))
          assert.strictEqual(again!.jobId, kept!.id)
        })
      )
  )
})

describe("claim contention", () => {
  it.live(
    "a claim that finds its lane busy waits briefly for it instead of answering empty, and no longer than that",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("busy")
          yield* storage.enqueueMany(Array.from({ length: 10 }, (_, n) => job(q, n)))
          // another worker mid-claim: its transaction holds the lane's claim lock for a while
          let holderDone = false
          // Holds the lane's claim lock (a claim in an open transaction) for `ms`; `locked` opens
          // once the holder's claim has run, so the test claims strictly after it.
          const holdFor = (ms: number) =>
            Effect.gen(function* () {
              const locked = yield* Deferred.make<void>()
              const fiber = yield* Effect.gen(function* () {
                const s = yield* QueueStorage
                const c = yield* SqlClient.SqlClient
                holderDone = false
                const claimed = yield* c.withTransaction(
                  Effect.tap(s.claim(claimOf(q, 2)), () =>
                    Effect.andThen(Deferred.succeed(locked, undefined), Effect.sleep(ms))
                  )
                )
                holderDone = true
                return claimed
              }).pipe(
                Effect.provide(eagerStorage(url, 1), { local: true }),
                Effect.forkChild({ startImmediately: true })
              )
              yield* Deferred.await(locked)
              return fiber
            })
          const first = yield* holdFor(40)
          const waited = yield* storage.claim(claimOf(q, 5))
          const held = yield* Fiber.join(first)
          assert.strictEqual(waited.length, 5, "waited for the lane instead of reporting it empty")
          const ids = new Set([...held, ...waited].map((c) => c.jobId))
          assert.strictEqual(ids.size, 7, "no job handed out twice")
          // a lane busy for longer than the bounded wait: empty, while the holder still holds it
          const slow = yield* holdFor(1500)
          assert.deepStrictEqual(yield* storage.claim(claimOf(q, 5)), [])
          assert.isFalse(holderDone, "gave up while the holder still held the lane")
          yield* Fiber.join(slow)
        })
      )
  )
})
