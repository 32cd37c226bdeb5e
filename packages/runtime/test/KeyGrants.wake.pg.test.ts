/**
 * A gated claimer wakes when a grant of its queue is closed by rescue or by an operator's cancel
 * (migration 0036: rescue and cancel_job notify the queue's wake channel after closing a keyed
 * attempt) or by another worker's completion (the runtime's `notifyClosed` after finalize: a
 * `Closed` signal, which only a claimer that may wait for a grant acts on). The worker polls
 * every 60 s here:
 * without the notification the waiting job would start a minute later, past the test's wait.
 */
import { Job } from "@awa/core"
import { KeyGrants } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, layer } from "@effect/vitest"
import { Deferred, Effect, Exit, Layer, Metric, Queue, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import * as KeyGrantMetrics from "../src/KeyGrantMetrics.ts"
import { eventually } from "./support.ts"

const Task = Job.define({ kind: "kwake", args: Schema.Struct({ n: Schema.Number }), queue: "kwake" })

const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer({ maxConnections: 8 })))

const ownRegistry = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provideService(effect, Metric.MetricRegistry, new Map())

/**
 * Holds the key's only grant outside the worker (a job of `holderQueue`, by default the worker's
 * queue, under the same policy), starts a worker on the queue (poll 60 s), waits until its claim
 * has found the key gated, then runs `close` on the holder; returns the ms from `close` until the
 * waiting job started.
 */
const wokenAfter = (
  queue: string,
  policy: string,
  holderDeadlineMs: number,
  close: (holder: {
    jobId: bigint
    runLease: bigint
  }) => Effect.Effect<unknown, unknown, AwaClient | KeyGrants>,
  holderQueue = queue
) =>
  Effect.gen(function* () {
    const grants = yield* KeyGrants
    const client = yield* AwaClient
    yield* grants.create({ id: policy, maxInFlight: 1 })
    yield* client.insert(Task, { n: 0 }, { queue: holderQueue, concurrencyKey: "t" })
    yield* client.insert(Task, { n: 1 }, { queue, concurrencyKey: "t" })
    const held = yield* grants.claim({
      queue: holderQueue,
      policy,
      max: 1,
      deadlineMs: holderDeadlineMs,
      agingIntervalMs: 0
    })
    assert.strictEqual(held._tag, "Claimed")
    if (held._tag !== "Claimed") return -1
    const holder = held.jobs[0]!
    const started: Array<number> = []
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      Awa.worker({
        queues: { [queue]: { keyPolicy: policy, pollInterval: "60 seconds", idlePollMax: "10 minutes" } },
        handlers: [handler(Task, ({ n }) => Effect.sync(() => void started.push(n)))],
        maintenance: false
      }),
      scope
    )
    const gated = KeyGrantMetrics.keyClaimsBusy.pipe(
      Metric.withAttributes({ "awa.queue": queue, outcome: "gated" })
    )
    yield* eventually(
      Effect.map(Metric.value(gated), (v) => v.count >= 1),
      20_000,
      "the worker's claim found the key gated"
    )
    const t0 = performance.now()
    yield* close({ jobId: holder.jobId, runLease: holder.runLease })
    yield* eventually(
      Effect.sync(() => started.length === 1),
      20_000,
      "the waiting job started"
    )
    const ms = performance.now() - t0
    assert.deepStrictEqual(started, [1])
    yield* Scope.close(scope, Exit.void)
    return ms
  })

layer(AwaLive, { excludeTestServices: true, timeout: "90 seconds" })(
  "gated claimers woken by closures",
  (it) => {
    it.effect("an operator's cancel of the grant's attempt wakes the gated worker", () =>
      Effect.gen(function* () {
        const ms = yield* wokenAfter("kwake-cancel", "wake-cancel", 0, (holder) =>
          Effect.flatMap(AwaClient, (client) => client.storage.cancelJob(holder.jobId, "operator"))
        )
        yield* Effect.logInfo(`woken ${ms.toFixed(0)} ms after the cancel`)
        assert.isBelow(ms, 20_000)
      }).pipe(ownRegistry)
    )

    it.effect("another worker's completion of the grant's attempt wakes the gated worker", () =>
      Effect.gen(function* () {
        // what a worker's completion batcher does: finalize, then announce the closures
        // (`notifyClosed`: a `key-closed:<policy>` notification on the cancel channel)
        const ms = yield* wokenAfter("kwake-done", "wake-done", 0, (holder) =>
          Effect.gen(function* () {
            const client = yield* AwaClient
            const [result] = yield* client.storage.finalizeMany([
              { jobId: holder.jobId, runLease: holder.runLease, outcome: { _tag: "Complete" } }
            ])
            assert.strictEqual(result?._tag, "Applied")
            yield* Effect.flatMap(KeyGrants, (g) => g.notifyClosed(["wake-done"]))
          })
        )
        yield* Effect.logInfo(`woken ${ms.toFixed(0)} ms after the completion`)
        assert.isBelow(ms, 20_000)
      }).pipe(ownRegistry)
    )

    it.effect("a deadline rescue of the grant's attempt wakes the gated worker", () =>
      Effect.gen(function* () {
        const ms = yield* wokenAfter("kwake-rescue", "wake-rescue", 1, () =>
          Effect.flatMap(AwaClient, (client) =>
            eventually(
              Effect.map(client.storage.rescueDeadlines(10), (rescued) => rescued.length === 1),
              10_000,
              "the holder was rescued"
            )
          )
        )
        yield* Effect.logInfo(`woken ${ms.toFixed(0)} ms after the rescue`)
        assert.isBelow(ms, 20_000)
      }).pipe(ownRegistry)
    )
    it.effect(
      "an operator's cancel of a grant's attempt in another queue under the policy wakes the gated worker",
      () =>
        Effect.gen(function* () {
          // cancel_job announces `key-closed:<policy>` besides its queue's wake-up (migration 0050)
          const ms = yield* wokenAfter(
            "kwake-cancel-b",
            "wake-cancel-shared",
            0,
            (holder) =>
              Effect.flatMap(AwaClient, (client) => client.storage.cancelJob(holder.jobId, "operator")),
            "kwake-cancel-a"
          )
          yield* Effect.logInfo(`woken ${ms.toFixed(0)} ms after the cancel`)
          assert.isBelow(ms, 20_000)
        }).pipe(ownRegistry)
    )

    it.effect(
      "a deadline rescue of a grant's attempt in another queue under the policy wakes the gated worker",
      () =>
        Effect.gen(function* () {
          // rescue announces `key-closed:<policy>` besides the queues' wake-ups (migration 0050)
          const ms = yield* wokenAfter(
            "kwake-rescue-b",
            "wake-rescue-shared",
            1,
            () =>
              Effect.flatMap(AwaClient, (client) =>
                eventually(
                  Effect.map(client.storage.rescueDeadlines(10), (rescued) => rescued.length === 1),
                  10_000,
                  "the holder was rescued"
                )
              ),
            "kwake-rescue-a"
          )
          yield* Effect.logInfo(`woken ${ms.toFixed(0)} ms after the rescue`)
          assert.isBelow(ms, 20_000)
        }).pipe(ownRegistry)
    )
    it.effect("a worker announces its closures to other processes while a claimer there waits", () =>
      Effect.gen(function* () {
        // Two workers with their own listeners and notifiers, as two processes. A runs the key's
        // only grant; B's claims find the key at its limit, so B says it waits (`key-gated:<policy>`),
        // and A announces its closure (`key-closed:<policy>`, ADR 0037). The test listens too.
        const queue = "kwake-workers"
        const policy = "wake-workers"
        const grants = yield* KeyGrants
        const client = yield* AwaClient
        const sql = yield* PgClient.PgClient
        const heard: Array<string> = []
        const scope = yield* Scope.make()
        const notifications = yield* Scope.provide(sql.listen("awa_cancel_awa"), scope)
        yield* Queue.take(notifications).pipe(
          Effect.flatMap((n) => Effect.sync(() => void heard.push(n.payload))),
          Effect.forever,
          Effect.forkIn(scope)
        )
        yield* grants.create({ id: policy, maxInFlight: 1 })
        const release = yield* Deferred.make<void>()
        const ran: Array<number> = []
        const worker = Awa.worker({
          queues: {
            [queue]: {
              keyPolicy: policy,
              maxConcurrency: 1,
              pollInterval: "60 seconds",
              idlePollMax: "10 minutes"
            }
          },
          handlers: [
            handler(Task, ({ n }) =>
              Effect.andThen(
                Effect.sync(() => void ran.push(n)),
                n === 0 ? Deferred.await(release) : Effect.void
              )
            )
          ],
          maintenance: false
        })
        yield* Layer.buildWithScope(worker, scope)
        yield* client.insert(Task, { n: 0 }, { queue, concurrencyKey: "t" })
        yield* eventually(
          Effect.sync(() => ran.length === 1),
          20_000,
          "A runs job 0"
        )
        yield* Layer.buildWithScope(worker, scope)
        yield* client.insert(Task, { n: 1 }, { queue, concurrencyKey: "t" })
        // twice (once a second while it waits): by the second, A's listener has long taken the first
        yield* eventually(
          Effect.sync(() => heard.filter((p) => p === `key-gated:${policy}`).length >= 2),
          20_000,
          "B said it waits, twice"
        )
        assert.notInclude(heard, `key-closed:${policy}`, "no closure yet")
        yield* Deferred.succeed(release, undefined)
        yield* eventually(
          Effect.sync(() => heard.includes(`key-closed:${policy}`)),
          20_000,
          "A announced its closure"
        )
        yield* eventually(
          Effect.sync(() => ran.length === 2),
          20_000,
          "the waiting job started"
        )
        assert.deepStrictEqual(ran, [0, 1])
        yield* Scope.close(scope, Exit.void)
      }).pipe(ownRegistry)
    )
    it.effect(
      "a worker's closure in one queue wakes another process's gated claimer of another queue under the policy",
      () =>
        Effect.gen(function* () {
          // A serves queue a, B queue b, both under one policy (ADR 0037, amendment). A's job holds
          // the key's only grant; B's job of the same key, in b, waits. B says it waits under the
          // policy; A announces its closure under the policy; B's claimer wakes (its poll is 60 s).
          const policy = "wake-shared"
          const grants = yield* KeyGrants
          const client = yield* AwaClient
          const sql = yield* PgClient.PgClient
          const heard: Array<string> = []
          const scope = yield* Scope.make()
          const notifications = yield* Scope.provide(sql.listen("awa_cancel_awa"), scope)
          yield* Queue.take(notifications).pipe(
            Effect.flatMap((n) => Effect.sync(() => void heard.push(n.payload))),
            Effect.forever,
            Effect.forkIn(scope)
          )
          yield* grants.create({ id: policy, maxInFlight: 1 })
          const release = yield* Deferred.make<void>()
          const ran: Array<number> = []
          const workerOf = (queue: string) =>
            Awa.worker({
              queues: {
                [queue]: {
                  keyPolicy: policy,
                  maxConcurrency: 1,
                  pollInterval: "60 seconds",
                  idlePollMax: "10 minutes"
                }
              },
              handlers: [
                handler(Task, ({ n }) =>
                  Effect.andThen(
                    Effect.sync(() => void ran.push(n)),
                    n === 0 ? Deferred.await(release) : Effect.void
                  )
                )
              ],
              maintenance: false
            })
          yield* Layer.buildWithScope(workerOf("kwake-shared-a"), scope)
          yield* client.insert(Task, { n: 0 }, { queue: "kwake-shared-a", concurrencyKey: "t" })
          yield* eventually(
            Effect.sync(() => ran.length === 1),
            20_000,
            "A runs job 0"
          )
          yield* Layer.buildWithScope(workerOf("kwake-shared-b"), scope)
          yield* client.insert(Task, { n: 1 }, { queue: "kwake-shared-b", concurrencyKey: "t" })
          yield* eventually(
            Effect.sync(() => heard.filter((p) => p === `key-gated:${policy}`).length >= 2),
            20_000,
            "B said it waits under the policy, twice"
          )
          assert.deepStrictEqual(ran, [0], "job 1 waits for the key")
          yield* Deferred.succeed(release, undefined)
          yield* eventually(
            Effect.sync(() => ran.length === 2),
            20_000,
            "B's job started on A's closure"
          )
          assert.include(heard, `key-closed:${policy}`)
          yield* Scope.close(scope, Exit.void)
        }).pipe(ownRegistry)
    )
  }
)
