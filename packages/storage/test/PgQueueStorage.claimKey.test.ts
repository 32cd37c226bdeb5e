/**
 * A unique key taken at claim (migration 0024, ADR 0016), under the race the shared mask contract
 * can only hope to hit: two queues hold jobs with one key and a mask of `running` only, and one
 * claim takes the key while the other claim is in flight. The first claim's transaction is held
 * open from another session, and the second claim is observed waiting for it (the key's index
 * entry) before the first commits or rolls back, so the interleaving is the same on every run.
 */

import type { NewJob } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Layer, Redacted, type Scope } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh } from "./pgFixtures.ts"

type Env = QueueStorage | PgClient.PgClient | SqlClient.SqlClient

/** Storage on its own pool of `url`: one per session, so their transactions are really separate. */
const session = (url: string, maxConnections = 2) =>
  pgLayer().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections })))

const withDatabase = <A, E>(body: (url: string) => Effect.Effect<A, E, Env | Scope.Scope>) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) => body(url).pipe(Effect.provide(session(url))))

/** Waits (polling the catalog) until some backend waits for another transaction to end. */
const untilTransactionWaiter = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  for (;;) {
    const [row] = yield* sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted`
    if (row!.n > 0) return
    yield* Effect.sleep("5 millis")
  }
})

/** Until `claim` waits for another transaction; a defect if it ends first (it took no key). */
const waitsFor = <A, E>(claim: Fiber.Fiber<A, E>) =>
  Effect.raceFirst(
    untilTransactionWaiter,
    Effect.flatMap(Fiber.await(claim), () =>
      Effect.die("the second claim ended without waiting for the first's key")
    )
  )

/** `storage`'s claim of `queue` (with a session of its own provided), forked, once it waits for another transaction's key. */
const claimWaitingForKey = (storage: QueueStorage["Service"], url: string, queue: string) =>
  Effect.gen(function* () {
    const claim = yield* storage
      .claim(claimOf(queue, 1))
      .pipe(Effect.provide(session(url, 1)), Effect.forkChild)
    yield* waitsFor(claim)
    return claim
  })

class Rollback {
  readonly _tag = "Rollback"
}

/**
 * Claims `queue` in a transaction of another session that stays open while `whileOpen` runs,
 * then commits (or rolls back); returns what that claim returned and what `whileOpen` returned.
 */
const claimHeldOpen = <A, E, R>(
  url: string,
  queue: string,
  end: "commit" | "rollback",
  whileOpen: Effect.Effect<A, E, R>
) =>
  Effect.gen(function* () {
    const claimed = yield* Deferred.make<ReadonlyArray<bigint>>()
    const release = yield* Deferred.make<void>()
    const holder = yield* Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      return yield* sql
        .withTransaction(
          Effect.gen(function* () {
            const rows = yield* sql<{ job_id: string }>`SELECT job_id::text FROM awa.claim(${queue}, 1, 0, 0)`
            yield* Deferred.succeed(
              claimed,
              rows.map((r) => BigInt(r.job_id))
            )
            yield* Deferred.await(release)
            if (end === "rollback") return yield* Effect.fail(new Rollback())
          })
        )
        .pipe(Effect.exit)
    }).pipe(Effect.provide(session(url, 1)), Effect.forkChild)
    const first = yield* Deferred.await(claimed)
    const out = yield* whileOpen.pipe(Effect.ensuring(Deferred.succeed(release, undefined)))
    const exit = yield* Fiber.join(holder)
    assert.strictEqual(Exit.isSuccess(exit), end === "commit")
    return { first, out }
  })

const job = (queue: string, args: object): NewJob => ({
  kind: "claim_key",
  queue,
  args,
  unique: { byArgs: true, states: ["running"] }
})

describe("PgQueueStorage: a unique key taken at claim, racing another queue's claim (0024)", () => {
  it.live(
    "the second claimer waits for the first's key and, once it commits, supersedes its own job naming the holder",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const qa = fresh("claimkey-a")
          const qb = fresh("claimkey-b")
          const args = { pair: qa }
          const [a] = yield* storage.enqueueMany([job(qa, args)])
          const [b] = yield* storage.enqueueMany([job(qb, args)])
          const [c] = yield* storage.enqueueMany([{ kind: "claim_key", queue: qb, args: { plain: true } }])
          const { first, out } = yield* claimHeldOpen(url, qa, "commit", claimWaitingForKey(storage, url, qb))
          assert.deepStrictEqual(first, [a!.id])
          // b lost its key to a, which committed after b's claim began: superseded, and the claim
          // went on to the next job of its lane
          const second = yield* Fiber.join(out)
          assert.deepStrictEqual(
            second.map((x) => x.jobId),
            [c!.id]
          )
          const vb = yield* storage.getJob(b!.id)
          assert.strictEqual(vb.state, "cancelled")
          assert.strictEqual(vb.errors.at(-1)!.error, `cancelled: superseded by duplicate ${a!.id}`)
          assert.strictEqual((yield* storage.getJob(a!.id)).state, "running")
        })
      ).pipe(Effect.scoped),
    120_000
  )

  it.live(
    "when the first claimer rolls back, the waiting claimer takes the key and runs its job",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const qa = fresh("claimkey-a")
          const qb = fresh("claimkey-b")
          const args = { pair: qa }
          const [a] = yield* storage.enqueueMany([job(qa, args)])
          const [b] = yield* storage.enqueueMany([job(qb, args)])
          const { first, out } = yield* claimHeldOpen(
            url,
            qa,
            "rollback",
            claimWaitingForKey(storage, url, qb)
          )
          assert.deepStrictEqual(first, [a!.id])
          const second = yield* Fiber.join(out)
          assert.deepStrictEqual(
            second.map((x) => x.jobId),
            [b!.id]
          )
          // a is available again (its claim rolled back); claimed now, it meets b's key
          assert.strictEqual((yield* storage.getJob(a!.id)).state, "available")
          assert.deepStrictEqual(yield* storage.claim(claimOf(qa, 1)), [])
          const va = yield* storage.getJob(a!.id)
          assert.strictEqual(va.state, "cancelled")
          assert.strictEqual(va.errors.at(-1)!.error, `cancelled: superseded by duplicate ${b!.id}`)
        })
      ).pipe(Effect.scoped),
    120_000
  )
})
