/**
 * The hot statements' own connections (ADR 0033). Read from `pg_stat_activity`, which shows
 * each backend's last statement and `application_name`:
 * - sequential claims, keyed claims and finalizations on a worker whose pool has ten open
 *   connections all run on the set's first connection, not in turn on all ten pooled ones (the
 *   pool hands out idle connections first-in first-out, so each of them planned every hot
 *   statement, again after every prune);
 * - a terminated backend of the set costs no call: the call goes through the pool and the next
 *   one opens a new connection;
 * - a claim inside the caller's transaction joins it (rolled back with it);
 * - calls overlapping a busy connection take the next one, and with all busy the pool;
 * - a process that only enqueues opens none, and closing the layer closes them.
 */
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Layer, Redacted, Schedule } from "effect"
import { SqlClient } from "effect/sql"
import * as HotConnections from "../src/HotConnections.ts"
import { KeyGrants } from "../src/KeyGrants.ts"
import { layer as pgGrants } from "../src/PgKeyGrants.ts"
import { type PgQueueStorageOptions, layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, holdOpenUntil } from "./pgFixtures.ts"

const appName = "hot-test"

const clientOn = (url: string) =>
  PgClient.layer({ url: Redacted.make(url), maxConnections: 10, applicationName: appName })

/** Storage and key grants sharing one set, as `Awa.layerPg` builds them. */
const storageOn = (url: string, options: PgQueueStorageOptions = {}) =>
  Layer.mergeAll(pgLayer(options), pgGrants(options)).pipe(
    Layer.provide(HotConnections.layer(options)),
    Layer.provideMerge(clientOn(url))
  )

const hot1 = `${appName} hot 1`

interface Backend {
  readonly pid: number
  readonly application_name: string
  readonly query: string
}

/** This database's client backends other than the caller's. */
const backends = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql<Backend>`
    SELECT pid, application_name, query FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`
)

/** Backends whose last statement called `fn`. */
const ranLast = (all: ReadonlyArray<Backend>, fn: string) => all.filter((b) => b.query.includes(`.${fn}(`))

/** Opens all ten pooled connections: ten transactions held open at once. */
const openWholePool = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const release = yield* Deferred.make<void>()
  const started = yield* Effect.forEach(Array.from({ length: 10 }), () => Deferred.make<void>())
  const fibers = yield* Effect.forEach(started, (s) =>
    sql
      .withTransaction(
        Effect.andThen(sql`SELECT 1`, Effect.andThen(Deferred.succeed(s, undefined), Deferred.await(release)))
      )
      .pipe(Effect.forkChild({ startImmediately: true }))
  )
  yield* Effect.forEach(started, (s) => Deferred.await(s))
  yield* Deferred.succeed(release, undefined)
  yield* Effect.forEach(fibers, (f) => Fiber.join(f))
})

/** Retries `check` every 10 ms until it holds, for up to 10 s. */
const eventually = <A, E, R>(check: Effect.Effect<A, E, R>, holds: (a: A) => boolean) =>
  check.pipe(
    Effect.filterOrFail(holds, () => new Error("condition not reached")),
    Effect.retry({ schedule: Schedule.spaced("10 millis"), times: 1000 })
  )

const claimAndComplete = (queue: string, rounds: number) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    for (let i = 0; i < rounds; i++) {
      const claimed = yield* storage.claim(claimOf(queue, 1))
      assert.strictEqual(claimed.length, 1)
      yield* completeAll(claimed)
    }
  })

describe("hot connections (ADR 0033)", () => {
  it.live(
    "claims, keyed claims and finalizations run on the set's first backend, not on every pooled one",
    () =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const grants = yield* KeyGrants
          const q = fresh("hot")
          const keyed = fresh("hot-keyed")
          const policy = fresh("policy")
          yield* grants.create({ id: policy, maxInFlight: 1 })
          yield* storage.enqueueMany(
            Array.from({ length: 20 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
          )
          yield* storage.enqueueMany(
            Array.from({ length: 10 }, (_, n) => ({
              kind: "k",
              queue: keyed,
              args: { n },
              concurrencyKey: `key-${n}`
            }))
          )
          yield* openWholePool
          yield* claimAndComplete(q, 20)
          const first = yield* backends
          for (let i = 0; i < 10; i++) {
            const claimed = yield* grants.claim({ ...claimOf(keyed, 1), policy })
            assert.strictEqual(claimed._tag, "Claimed")
            if (claimed._tag === "Claimed") yield* completeAll(claimed.jobs)
          }
          const second = yield* backends
          assert.deepStrictEqual(
            [
              ranLast(first, "claim").map((b) => b.application_name),
              ranLast(second, "claim_keyed").map((b) => b.application_name),
              // completions only: finalize_completions (migration 0049)
              ranLast(second, "finalize_completions").map((b) => b.application_name)
            ],
            [[], [], [hot1]],
            `backends whose last call was claim or finalize: ${JSON.stringify([first, second])}`
          )
          // the claim ran on the set's first connection too: finalize was its last call there
          assert.deepStrictEqual(
            first.filter((b) => b.application_name.includes(" hot ")).map((b) => b.application_name),
            [hot1]
          )
          // the pool's other nine connections stayed open beside it (the tenth asked)
          assert.isAtLeast(first.filter((b) => b.application_name === appName).length, 9)
        }).pipe(Effect.provide(storageOn(url)))
      })
  )

  it.live("a terminated claim backend fails no call and is replaced", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      yield* Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("hot-kill")
        yield* storage.enqueueMany(
          Array.from({ length: 10 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
        )
        yield* claimAndComplete(q, 2)
        const [first] = (yield* backends).filter((b) => b.application_name === hot1)
        assert.isDefined(first)
        yield* sql`SELECT pg_terminate_backend(${first!.pid})`
        yield* eventually(backends, (all) => all.every((b) => b.pid !== first!.pid))
        // the next claims succeed (the first may go through the pool), then run on a new backend
        yield* claimAndComplete(q, 3)
        const now = (yield* backends).filter((b) => b.application_name === hot1)
        assert.strictEqual(now.length, 1)
        assert.notStrictEqual(now[0]!.pid, first!.pid)
      }).pipe(Effect.provide(storageOn(url)))
    })
  )

  it.live("a claim inside the caller's transaction is rolled back with it", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      yield* Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("hot-tx")
        yield* storage.enqueueMany([{ kind: "k", queue: q, args: {} }])
        const exit = yield* sql
          .withTransaction(
            Effect.andThen(storage.claim(claimOf(q, 1)), (claimed) =>
              Effect.fail(`rolled back after claiming ${claimed.length}`)
            )
          )
          .pipe(Effect.exit)
        assert.deepStrictEqual(exit, Exit.fail("rolled back after claiming 1"))
        assert.strictEqual((yield* storage.claim(claimOf(q, 1))).length, 1)
      }).pipe(Effect.provide(storageOn(url)))
    })
  )

  it.live("calls overlapping a busy connection take the next one, and with all busy the pool", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      yield* Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const client = yield* PgClient.PgClient
        const hot = yield* HotConnections.make({ client, sql, size: 2 })
        const where = sql<{ via: string }>`SELECT current_setting('application_name') AS via`
        const pool = Effect.succeed([{ via: "pool" }])
        // another session holds the advisory lock the first two calls wait for
        const release = yield* Deferred.make<void>()
        const holder = yield* holdOpenUntil(url, "SELECT pg_advisory_xact_lock(4242)", release)
        const waitingOn = (name: string) =>
          eventually(backends, (all) =>
            all.some((b) => b.application_name === name && b.query.includes("pg_advisory_xact_lock"))
          )
        const blocked = sql<{ via: string }>`
          SELECT current_setting('application_name') AS via, pg_advisory_xact_lock(4242)::text`
        const a = yield* hot.run(blocked, pool).pipe(Effect.forkChild({ startImmediately: true }))
        yield* waitingOn(hot1)
        const b = yield* hot.run(blocked, pool).pipe(Effect.forkChild({ startImmediately: true }))
        yield* waitingOn(`${appName} hot 2`)
        assert.deepStrictEqual(yield* hot.run(where, pool), [{ via: "pool" }])
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        assert.deepStrictEqual(
          [(yield* Fiber.join(a))[0]!.via, (yield* Fiber.join(b))[0]!.via],
          [hot1, `${appName} hot 2`]
        )
        // free again: the next call takes the first
        assert.deepStrictEqual(yield* hot.run(where, pool), [{ via: hot1 }])
      }).pipe(Effect.scoped, Effect.provide(clientOn(url)))
    })
  )

  it.live("a producer opens none, and closing the layer closes them", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      const named = (all: ReadonlyArray<Backend>) =>
        all.filter((b) => b.application_name.startsWith(`${appName} `)).map((b) => b.application_name)
      const observer = storageOn(url)
      yield* Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("hot-close")
        yield* storage.enqueueMany([{ kind: "k", queue: q, args: {} }])
        assert.deepStrictEqual(named(yield* backends), [])
        yield* claimAndComplete(q, 1)
        assert.deepStrictEqual(named(yield* backends), [hot1])
      }).pipe(Effect.provide(storageOn(url)))
      yield* eventually(Effect.provide(backends, observer), (all) => named(all).length === 0)
    })
  )
})
