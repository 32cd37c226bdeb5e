/**
 * Closure wake-ups of a keyed queue (StorageSignals `Closed`, docs/adr/0029-key-execution-grants.md):
 * a dispatcher whose last claim found its queue idle, or took all it found, ignores them (one
 * process would otherwise claim once per job, and a fleet's idle processes once per burst of
 * closures), while one waiting for a key at its limit takes the waiting job on one at once, long
 * before its poll. Simulation layer, virtual time,
 * signals driven by the test, keyed claims counted.
 */
import { Job } from "@awa/core"
import { KeyGrants, QueueStorage, type StorageSignals } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Exit, Layer, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import * as AwaClient from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { advance, keyedSimulation } from "./support.ts"

const Task = Job.define({
  kind: "closed_task",
  args: Schema.Struct({ n: Schema.Number }),
  queue: "kq",
  concurrencyKey: () => "k"
})

/** The same key in a second queue, which shares policy `p` with `kq` where a test says so. */
const OtherTask = Job.define({
  kind: "closed_other_task",
  args: Schema.Struct({ n: Schema.Number }),
  queue: "kq2",
  concurrencyKey: () => "k"
})

/** A claim held after it has read storage: `entered` when its answer is ready, returns on `until`. */
interface HeldClaim {
  readonly entered: Deferred.Deferred<void>
  readonly until: Deferred.Deferred<void>
}

/**
 * The simulation with keyed claims counted and signals the test sends. `holdNextClaim` holds the
 * next claim after it has read storage, as a claim in flight whose snapshot predates what the test
 * does meanwhile.
 */
const harness = Effect.gen(function* () {
  let claims = 0
  const announced = { closed: 0, gated: 0 }
  let hold: HeldClaim | undefined
  const sim = yield* keyedSimulation((g) => ({
    ...g,
    notifyClosed: (policies) =>
      Effect.andThen(
        Effect.sync(() => {
          announced.closed += policies.length
        }),
        g.notifyClosed(policies)
      ),
    notifyGated: (policy) =>
      Effect.andThen(
        Effect.sync(() => void announced.gated++),
        g.notifyGated(policy)
      ),
    claim: (params) =>
      Effect.suspend(() => {
        claims++
        const held = hold
        hold = undefined
        if (held === undefined) return g.claim(params)
        return Effect.tap(g.claim(params), () =>
          Effect.andThen(Deferred.succeed(held.entered, undefined), Deferred.await(held.until))
        )
      })
  }))
  const holdNextClaim = Effect.gen(function* () {
    const held: HeldClaim = { entered: yield* Deferred.make<void>(), until: yield* Deferred.make<void>() }
    hold = held
    return held
  })
  return { ...sim, claims: () => claims, announced: () => ({ ...announced }), holdNextClaim }
})

/** A worker of queue `kq` under policy `p` whose polls are far apart: only signals make it claim. */
const keyedWorker = (scope: Scope.Scope, run: (n: number) => Effect.Effect<void>) =>
  Effect.asVoid(
    Layer.buildWithScope(
      Awa.worker({
        queues: {
          kq: { keyPolicy: "p", maxConcurrency: 5, pollInterval: "60 seconds", idlePollMax: "10 minutes" }
        },
        handlers: [handler(Task, ({ n }) => run(n))],
        maintenance: false
      }),
      scope
    )
  )

/** A worker of `kq2` alone, or of `kq` and `kq2`, both under policy `p`, polls far apart. */
const sharedPolicyWorker = (
  scope: Scope.Scope,
  queues: ReadonlyArray<"kq" | "kq2">,
  run: (queue: string, n: number) => Effect.Effect<void>
) => {
  const config = {
    keyPolicy: "p",
    maxConcurrency: 5,
    pollInterval: "60 seconds",
    idlePollMax: "10 minutes"
  } as const
  return Effect.asVoid(
    Layer.buildWithScope(
      Awa.worker({
        queues: Object.fromEntries(queues.map((q) => [q, config])),
        handlers: [handler(Task, ({ n }) => run("kq", n)), handler(OtherTask, ({ n }) => run("kq2", n))],
        maintenance: false
      }),
      scope
    )
  )
}

/**
 * Policy `p` at limit 1 and a keyed worker whose job 1 runs until `release`; jobs 1 and 2 of
 * the key are inserted and woken for: job 1 runs, job 2 waits behind it.
 */
const heldKey = (h: { readonly send: (signal: StorageSignals.Signal) => Effect.Effect<boolean> }) =>
  Effect.gen(function* () {
    yield* (yield* KeyGrants).create({ id: "p", maxInFlight: 1 })
    const release = yield* Deferred.make<void>()
    const started: Array<{ n: number; at: number }> = []
    const scope = yield* Scope.make()
    yield* keyedWorker(scope, (n) =>
      Effect.flatMap(Clock.currentTimeMillis, (at) =>
        Effect.andThen(
          Effect.sync(() => void started.push({ n, at })),
          n === 1 ? Deferred.await(release) : Effect.void
        )
      )
    )
    yield* advance(1_000, 10)
    yield* (yield* AwaClient.AwaClient).insertMany(Task, [{ n: 1 }, { n: 2 }])
    yield* h.send({ _tag: "Wake", queue: "kq" })
    yield* advance(200, 10)
    assert.deepStrictEqual(
      started.map((s) => s.n),
      [1]
    )
    return { release, started, scope }
  })

/** Within 200 ms of virtual time, job 2 has started, 50 ms after `t0` at most. */
const jobTwoStartedWithin50ms = (
  started: ReadonlyArray<{ n: number; at: number }>,
  t0: number,
  why: string
) =>
  Effect.andThen(
    advance(200, 10),
    Effect.sync(() => {
      assert.deepStrictEqual(
        started.map((s) => s.n),
        [1, 2],
        why
      )
      assert.isAtMost(started[1]!.at - t0, 50)
    })
  )

describe("closure wake-ups of a keyed queue", () => {
  it.effect(
    "ignored after a claim that found nothing more; a claimer waiting for the key takes its job on one at once",
    () =>
      Effect.gen(function* () {
        const h = yield* harness
        yield* Effect.gen(function* () {
          const grants = yield* KeyGrants
          yield* grants.create({ id: "p", maxInFlight: 1 })
          const started: Array<{ n: number; at: number }> = []
          const scope = yield* Scope.make()
          // polls far apart: only signals make it claim within the test
          yield* keyedWorker(scope, (n) =>
            Effect.flatMap(Clock.currentTimeMillis, (at) => Effect.sync(() => void started.push({ n, at })))
          )
          // subscribed: one claim, which finds the queue idle
          yield* advance(1_000, 10)
          const afterIdle = h.claims()
          assert.isAtLeast(afterIdle, 1)
          for (let i = 0; i < 5; i++) {
            yield* h.send({ _tag: "Closed", policy: "p" })
            yield* advance(200, 10)
          }
          assert.strictEqual(h.claims(), afterIdle, "closures while the queue is idle cost no claim")

          // two jobs of one key (limit 1); the first is held by another process (claimed here,
          // outside the worker), so its closure reaches the worker only as a signal
          const client = yield* AwaClient.AwaClient
          yield* client.insertMany(Task, [{ n: 1 }, { n: 2 }])
          const held = yield* grants.claim({
            queue: "kq",
            policy: "p",
            max: 1,
            deadlineMs: 0,
            agingIntervalMs: 0
          })
          assert.strictEqual(held._tag, "Claimed")
          if (held._tag !== "Claimed") return
          // a wake-up: the claim finds the key at its limit (gated)
          yield* h.send({ _tag: "Wake", queue: "kq" })
          yield* advance(200, 10)
          assert.deepStrictEqual(started, [])
          // the holder's attempt closes elsewhere; nothing claims again until a closure is announced
          const storage = yield* QueueStorage
          yield* storage.finalizeMany([
            { jobId: held.jobs[0]!.jobId, runLease: held.jobs[0]!.runLease, outcome: { _tag: "Complete" } }
          ])
          yield* advance(1_000, 10)
          assert.deepStrictEqual(
            started,
            [],
            "only the closure wake-up (or the 60-second poll) claims the waiting job"
          )
          const t0 = yield* Clock.currentTimeMillis
          yield* h.send({ _tag: "Closed", policy: "p" })
          yield* advance(200, 10)
          assert.deepStrictEqual(
            started.map((s) => s.n),
            [2]
          )
          assert.isAtMost(started[0]!.at - t0, 50)
          // that claim took all it found (not stopped at a key): its job's own closure, and any
          // other, costs no claim either
          yield* advance(200, 10)
          const afterAll = h.claims()
          for (let i = 0; i < 3; i++) {
            yield* h.send({ _tag: "Closed", policy: "p" })
            yield* advance(200, 10)
          }
          assert.strictEqual(h.claims(), afterAll, "a claim that took all it found ignores closures")
          yield* Scope.close(scope, Exit.void)
        }).pipe(Effect.provide(h.layer))
      })
  )

  it.effect("a closure during a claim that took all it found costs no claim", () =>
    Effect.gen(function* () {
      const h = yield* harness
      yield* Effect.gen(function* () {
        yield* (yield* KeyGrants).create({ id: "p", maxInFlight: 5 })
        const started: Array<number> = []
        const scope = yield* Scope.make()
        yield* keyedWorker(scope, (n) => Effect.sync(() => void started.push(n)))
        yield* advance(1_000, 10)
        const held = yield* h.holdNextClaim
        yield* (yield* AwaClient.AwaClient).insert(Task, { n: 1 })
        yield* h.send({ _tag: "Wake", queue: "kq" })
        yield* advance(10, 10)
        yield* Deferred.await(held.entered)
        const claims = h.claims()
        // closures announced while the claim is in flight; it has read storage already
        yield* h.send({ _tag: "Closed", policy: "p" })
        yield* h.send({ _tag: "Closed", policy: "p" })
        yield* advance(10, 10)
        yield* Deferred.succeed(held.until, undefined)
        yield* advance(1_000, 10)
        assert.deepStrictEqual(started, [1])
        assert.strictEqual(h.claims(), claims, "the claim took all it found: the closures needed no claim")
        yield* Scope.close(scope, Exit.void)
      }).pipe(Effect.provide(h.layer))
    })
  )

  it.effect("a claim gated at a key while a closure was announced claims again at once", () =>
    Effect.gen(function* () {
      const h = yield* harness
      yield* Effect.gen(function* () {
        // job 1 takes the key (limit 1); job 2 waits behind it
        const { release, started, scope } = yield* heldKey(h)
        // a claim in flight finds the key at its limit; meanwhile job 1 ends and its closure is
        // announced, after the claim read storage
        const held = yield* h.holdNextClaim
        yield* h.send({ _tag: "Wake", queue: "kq" })
        yield* advance(10, 10)
        yield* Deferred.await(held.entered)
        yield* Deferred.succeed(release, undefined)
        yield* advance(50, 10)
        yield* h.send({ _tag: "Closed", policy: "p" })
        yield* advance(10, 10)
        const t0 = yield* Clock.currentTimeMillis
        yield* Deferred.succeed(held.until, undefined)
        yield* jobTwoStartedWithin50ms(
          started,
          t0,
          "the gated claim's result and the closure during it: claimed again (the poll is 60 s)"
        )
        yield* Scope.close(scope, Exit.void)
      }).pipe(Effect.provide(h.layer))
    })
  )
  it.effect("a closure in this process reaches its gated claimer at once, with no signal", () =>
    Effect.gen(function* () {
      const h = yield* harness
      yield* Effect.gen(function* () {
        // job 1 holds the key (limit 1); job 2's claim was gated
        const { release, started, scope } = yield* heldKey(h)
        const t0 = yield* Clock.currentTimeMillis
        yield* Deferred.succeed(release, undefined)
        yield* jobTwoStartedWithin50ms(
          started,
          t0,
          "job 1's closure woke this process's claimer without a signal (the poll is 60 s)"
        )
        yield* Scope.close(scope, Exit.void)
      }).pipe(Effect.provide(h.layer))
    })
  )

  it.effect("closures are announced to other processes only while a claimer says it waits", () =>
    Effect.gen(function* () {
      const h = yield* harness
      yield* Effect.gen(function* () {
        yield* (yield* KeyGrants).create({ id: "p", maxInFlight: 10 })
        const scope = yield* Scope.make()
        yield* keyedWorker(scope, () => Effect.void)
        yield* advance(1_000, 10)
        const client = yield* AwaClient.AwaClient
        // nobody waits: closures stay in this process
        yield* client.insertMany(Task, [{ n: 1 }, { n: 2 }])
        yield* h.send({ _tag: "Wake", queue: "kq" })
        yield* advance(500, 10)
        assert.deepStrictEqual(h.announced(), { closed: 0, gated: 0 })
        // a claimer elsewhere says it waits: this process's closures of the queue are announced…
        yield* h.send({ _tag: "Gated", policy: "p" })
        yield* advance(10, 10)
        yield* client.insertMany(Task, [{ n: 3 }])
        yield* h.send({ _tag: "Wake", queue: "kq" })
        yield* advance(500, 10)
        assert.strictEqual(h.announced().closed, 1)
        // …for a few seconds after it said so
        yield* advance(3_000, 10)
        yield* client.insertMany(Task, [{ n: 4 }])
        yield* h.send({ _tag: "Wake", queue: "kq" })
        yield* advance(500, 10)
        assert.strictEqual(h.announced().closed, 1)
        yield* Scope.close(scope, Exit.void)
      }).pipe(Effect.provide(h.layer))
    })
  )

  it.effect(
    "a gated claimer says it waits, claims once more, and says it again every second while it waits",
    () =>
      Effect.gen(function* () {
        const h = yield* harness
        yield* Effect.gen(function* () {
          const grants = yield* KeyGrants
          yield* grants.create({ id: "p", maxInFlight: 1 })
          const client = yield* AwaClient.AwaClient
          yield* client.insertMany(Task, [{ n: 1 }, { n: 2 }])
          // another process holds the key
          const held = yield* grants.claim({
            queue: "kq",
            policy: "p",
            max: 1,
            deadlineMs: 0,
            agingIntervalMs: 0
          })
          assert.strictEqual(held._tag, "Claimed")
          const scope = yield* Scope.make()
          yield* keyedWorker(scope, () => Effect.void)
          yield* advance(100, 10)
          // the first claim (on subscribing) is gated: it announces and claims once more, gated again
          // (on subscribing the worker claims once more, gated too: within the second, no announcement)
          assert.strictEqual(h.announced().gated, 1)
          const claims = h.claims()
          assert.isAtLeast(claims, 3, "the holder's claim, the gated claim, and one more after announcing")
          yield* advance(3_050, 10)
          assert.strictEqual(h.announced().gated, 4, "once a second while it waits")
          assert.strictEqual(h.claims(), claims, "waiting costs no claim")
          yield* Scope.close(scope, Exit.void)
        }).pipe(Effect.provide(h.layer))
      })
  )
  it.effect(
    "a closure no one announced, between a gated claim and its announcement, is found by the claim after it",
    () =>
      Effect.gen(function* () {
        const h = yield* harness
        yield* Effect.gen(function* () {
          const grants = yield* KeyGrants
          yield* grants.create({ id: "p", maxInFlight: 1 })
          const started: Array<number> = []
          const scope = yield* Scope.make()
          yield* keyedWorker(scope, (n) => Effect.sync(() => void started.push(n)))
          yield* advance(1_000, 10)
          yield* (yield* AwaClient.AwaClient).insertMany(Task, [{ n: 1 }, { n: 2 }])
          // another process holds the key, and closes its attempt while the worker's claim, which
          // has found the key at its limit, is still in flight: that process had heard of no waiting
          // claimer, so it announced nothing
          const held = yield* grants.claim({
            queue: "kq",
            policy: "p",
            max: 1,
            deadlineMs: 0,
            agingIntervalMs: 0
          })
          assert.strictEqual(held._tag, "Claimed")
          if (held._tag !== "Claimed") return
          const inFlight = yield* h.holdNextClaim
          yield* h.send({ _tag: "Wake", queue: "kq" })
          yield* advance(10, 10)
          yield* Deferred.await(inFlight.entered)
          yield* (yield* QueueStorage).finalizeMany([
            { jobId: held.jobs[0]!.jobId, runLease: held.jobs[0]!.runLease, outcome: { _tag: "Complete" } }
          ])
          yield* Deferred.succeed(inFlight.until, undefined)
          yield* advance(200, 10)
          assert.deepStrictEqual(
            started,
            [2],
            "the claim after the announcement took the job (the poll is 60 s)"
          )
          yield* Scope.close(scope, Exit.void)
        }).pipe(Effect.provide(h.layer))
      })
  )

  it.effect(
    "a closure in one queue reaches, in this process, the gated claimer of another queue under its policy",
    () =>
      Effect.gen(function* () {
        const h = yield* harness
        yield* Effect.gen(function* () {
          yield* (yield* KeyGrants).create({ id: "p", maxInFlight: 1 })
          const release = yield* Deferred.make<void>()
          const started: Array<{ queue: string; at: number }> = []
          const scope = yield* Scope.make()
          yield* sharedPolicyWorker(scope, ["kq", "kq2"], (queue) =>
            Effect.flatMap(Clock.currentTimeMillis, (at) =>
              Effect.andThen(
                Effect.sync(() => void started.push({ queue, at })),
                queue === "kq" ? Deferred.await(release) : Effect.void
              )
            )
          )
          yield* advance(1_000, 10)
          // kq's job takes the key (limit 1); kq2's job of the same key is gated behind it
          const client = yield* AwaClient.AwaClient
          yield* client.insert(Task, { n: 1 })
          yield* h.send({ _tag: "Wake", queue: "kq" })
          yield* advance(200, 10)
          yield* client.insert(OtherTask, { n: 2 })
          yield* h.send({ _tag: "Wake", queue: "kq2" })
          yield* advance(200, 10)
          assert.deepStrictEqual(
            started.map((s) => s.queue),
            ["kq"]
          )
          const t0 = yield* Clock.currentTimeMillis
          yield* Deferred.succeed(release, undefined)
          yield* advance(200, 10)
          assert.deepStrictEqual(
            started.map((s) => s.queue),
            ["kq", "kq2"],
            "kq's closure woke kq2's claimer (the poll is 60 s)"
          )
          assert.isAtMost(started[1]!.at - t0, 50)
          yield* Scope.close(scope, Exit.void)
        }).pipe(Effect.provide(h.layer))
      })
  )

  it.effect("another process's closure under the policy wakes a gated claimer of every queue under it", () =>
    Effect.gen(function* () {
      const h = yield* harness
      yield* Effect.gen(function* () {
        const grants = yield* KeyGrants
        yield* grants.create({ id: "p", maxInFlight: 1 })
        const started: Array<{ queue: string; at: number }> = []
        const scope = yield* Scope.make()
        // this process serves kq2 only; another one holds the key with a job of kq
        yield* sharedPolicyWorker(scope, ["kq2"], (queue) =>
          Effect.flatMap(Clock.currentTimeMillis, (at) => Effect.sync(() => void started.push({ queue, at })))
        )
        yield* advance(1_000, 10)
        const client = yield* AwaClient.AwaClient
        yield* client.insert(Task, { n: 1 })
        const held = yield* grants.claim({
          queue: "kq",
          policy: "p",
          max: 1,
          deadlineMs: 0,
          agingIntervalMs: 0
        })
        assert.strictEqual(held._tag, "Claimed")
        if (held._tag !== "Claimed") return
        yield* client.insert(OtherTask, { n: 2 })
        yield* h.send({ _tag: "Wake", queue: "kq2" })
        yield* advance(1_000, 10)
        assert.deepStrictEqual(started, [], "gated behind kq's grant")
        assert.isAtLeast(h.announced().gated, 1, "the gated claimer said it waits, under its policy")
        yield* (yield* QueueStorage).finalizeMany([
          { jobId: held.jobs[0]!.jobId, runLease: held.jobs[0]!.runLease, outcome: { _tag: "Complete" } }
        ])
        yield* advance(200, 10)
        assert.deepStrictEqual(started, [], "nothing claims before the closure is announced")
        // the closer (of kq) announces its closure under the policy
        const t0 = yield* Clock.currentTimeMillis
        yield* h.send({ _tag: "Closed", policy: "p" })
        yield* advance(200, 10)
        assert.deepStrictEqual(
          started.map((s) => s.queue),
          ["kq2"],
          "a closure of kq, announced under p, woke kq2's claimer (the poll is 60 s)"
        )
        assert.isAtMost(started[0]!.at - t0, 50)
        yield* Scope.close(scope, Exit.void)
      }).pipe(Effect.provide(h.layer))
    })
  )

  it.effect(
    "two gated queues under one policy in one process each say they wait, and each claims once more",
    () =>
      Effect.gen(function* () {
        const h = yield* harness
        yield* Effect.gen(function* () {
          const grants = yield* KeyGrants
          yield* grants.create({ id: "p", maxInFlight: 1 })
          const client = yield* AwaClient.AwaClient
          // another process holds the key with a job of kq; one job of the key waits in each queue
          yield* client.insert(Task, { n: 0 })
          const held = yield* grants.claim({
            queue: "kq",
            policy: "p",
            max: 1,
            deadlineMs: 0,
            agingIntervalMs: 0
          })
          assert.strictEqual(held._tag, "Claimed")
          yield* client.insert(Task, { n: 1 })
          yield* client.insert(OtherTask, { n: 2 })
          const before = h.claims()
          const scope = yield* Scope.make()
          yield* sharedPolicyWorker(scope, ["kq", "kq2"], () => Effect.void)
          yield* advance(100, 10)
          assert.strictEqual(h.announced().gated, 2, "one announcement per gated queue, not per policy")
          // per queue: the gated claim, and one more after its announcement (a first claim on
          // subscribing may add one more, gated too, within the second)
          assert.isAtLeast(h.claims() - before, 4)
          yield* Scope.close(scope, Exit.void)
        }).pipe(Effect.provide(h.layer))
      })
  )
})
