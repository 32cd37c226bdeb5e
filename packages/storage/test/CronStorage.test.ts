/**
 * `CronStorage` on both layers: one contract, run unchanged against Postgres (real clock, a fresh
 * database per test) and the simulation (TestClock, a fresh store per test); then what only
 * Postgres can show: fires, pauses and rollbacks racing on the schedule's row lock.
 */
import { UniqueConflict, ValidationError } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import {
  type CronDeclaration,
  type CronJobTemplate,
  CronNotFound,
  CronStorage,
  layerPg,
  layerSim,
  toNewJob
} from "../src/CronStorage.ts"
import * as PgQueueStorage from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import * as SimQueueStorage from "../src/SimQueueStorage.ts"

const template = (fields: Partial<CronJobTemplate> = {}): CronJobTemplate => ({
  kind: "report",
  queue: "cron",
  args: { n: 1 },
  priority: 2,
  maxAttempts: 25,
  tags: [],
  metadata: {},
  ...fields
})

const declaration = (name: string, fields: Partial<CronDeclaration> = {}): CronDeclaration => ({
  name,
  expression: "*/15 * * * * *",
  timezone: "UTC",
  job: template(),
  missedFire: { _tag: "Coalesce" },
  ...fields
})

/** Whole seconds, `offsetSeconds` from `date`. */
const secondOf = (date: Date, offsetSeconds = 0) =>
  new Date(Math.floor(date.getTime() / 1000) * 1000 + offsetSeconds * 1000)

const PgLive = Layer.mergeAll(layerPg(), PgQueueStorage.layer()).pipe(
  Layer.provideMerge(TestDatabase.layer())
)
const SimLive = layerSim.pipe(Layer.provideMerge(SimQueueStorage.layer))

const stateOf = (name: string) =>
  Effect.gen(function* () {
    const cron = yield* CronStorage
    const found = (yield* cron.list).schedules.find((s) => s.name === name)
    assert.isDefined(found, `schedule ${name}`)
    return found!
  })

const jobsOf = (kind = "report") => Effect.flatMap(QueueStorage, (q) => q.listJobs({ kind, limit: 1000 }))

type Body = Effect.Effect<void, unknown, CronStorage | QueueStorage>

const contract = (
  label: string,
  run: (name: string, body: Body) => void,
  advance: (ms: number) => Effect.Effect<void>
) =>
  describe(`CronStorage contract: ${label}`, () => {
    run(
      "upsert inserts, then updates the definition and keeps pause state and the last fire",
      Effect.gen(function* () {
        const cron = yield* CronStorage
        assert.deepStrictEqual(yield* cron.upsert([declaration("a"), declaration("b")]), [
          { name: "a", created: true, changed: false },
          { name: "b", created: true, changed: false }
        ])
        const { now } = yield* cron.list
        const before = yield* stateOf("a")
        assert.deepStrictEqual(
          [before.paused, before.lastFireAt, before.staleSince, before.job],
          [false, null, null, template()]
        )
        yield* cron.pause("a", "ops")
        const tick = secondOf(now, -1)
        assert.deepStrictEqual((yield* cron.fire("b", null, tick, toNewJob(template(), tick)))._tag, "Fired")
        const pausedAt = (yield* stateOf("a")).updatedAt.getTime()
        yield* advance(1500)
        // same definition: not changed; new args / new expression: changed
        assert.deepStrictEqual(yield* cron.upsert([declaration("a"), declaration("b")]), [
          { name: "a", created: false, changed: false },
          { name: "b", created: false, changed: false }
        ])
        assert.strictEqual((yield* stateOf("a")).updatedAt.getTime(), pausedAt)
        assert.isAbove((yield* stateOf("a")).lastDeclaredAt.getTime(), pausedAt)
        const changed = yield* cron.upsert([
          declaration("a", { job: template({ args: { n: 2 } }) }),
          declaration("b", { expression: "0 * * * *", missedFire: { _tag: "CatchUp", max: 5 } })
        ])
        assert.deepStrictEqual(
          changed.map((r) => r.changed),
          [true, true]
        )
        const a = yield* stateOf("a")
        const b = yield* stateOf("b")
        assert.deepStrictEqual([a.paused, a.pausedBy, a.job.args], [true, "ops", { n: 2 }])
        assert.strictEqual(
          a.scheduleChangedAt.getTime(),
          a.declaredAt.getTime(),
          "args changed, schedule did not"
        )
        assert.isAbove(a.updatedAt.getTime(), a.declaredAt.getTime())
        assert.deepStrictEqual([b.lastFireAt?.getTime(), b.expression], [tick.getTime(), "0 * * * *"])
        assert.deepStrictEqual(b.missedFire, { _tag: "CatchUp", max: 5 })
        assert.isAbove(b.scheduleChangedAt.getTime(), b.declaredAt.getTime())
      })
    )

    run(
      "invalid declarations are rejected whole with the offending field; nothing is stored",
      Effect.gen(function* () {
        const cron = yield* CronStorage
        const fieldOf = (d: ReadonlyArray<CronDeclaration>) =>
          Effect.flip(cron.upsert(d)).pipe(
            Effect.map((e) => (e instanceof ValidationError ? e.field : String(e)))
          )
        assert.strictEqual(yield* fieldOf([declaration("ok"), declaration("ok")]), "cron.ok")
        assert.strictEqual(
          yield* fieldOf([declaration("ok"), declaration("bad", { job: template({ priority: 9 }) })]),
          "cron.bad.job.priority"
        )
        assert.strictEqual(
          yield* fieldOf([declaration("bad", { job: template({ metadata: { "awa:cronName": "x" } }) })]),
          "cron.bad.job.metadata.awa:cronName"
        )
        assert.strictEqual(
          yield* fieldOf([declaration("bad", { missedFire: { _tag: "CatchUp", max: 0 } })]),
          "cron.bad.missedFire.catchUp.max"
        )
        assert.strictEqual(yield* fieldOf([declaration("x".repeat(201))]), "cron.name")
        assert.strictEqual(yield* fieldOf([declaration("bad", { expression: " " })]), "cron.bad.expression")
        assert.deepStrictEqual((yield* cron.list).schedules, [])
      })
    )

    run(
      "two deployments declaring different schedules keep both; undeclared ones are marked, never deleted",
      Effect.gen(function* () {
        const cron = yield* CronStorage
        yield* cron.upsert([declaration("a1"), declaration("shared")])
        yield* cron.upsert([declaration("b1"), declaration("shared")])
        // deployment B starts: a1 is not declared by it
        const stale = yield* cron.markStale(["b1", "shared"])
        assert.deepStrictEqual(
          stale.map((s) => s.name),
          ["a1"]
        )
        assert.isNotNull((yield* stateOf("a1")).staleSince)
        assert.deepStrictEqual(
          (yield* cron.list).schedules.map((s) => s.name),
          ["a1", "b1", "shared"]
        )
        // deployment A starts again: a1 is declared, b1 is marked
        yield* cron.upsert([declaration("a1"), declaration("shared")])
        const marked = yield* cron.markStale(["a1", "shared"])
        assert.deepStrictEqual(
          marked.map((s) => s.name),
          ["b1"]
        )
        assert.isNull((yield* stateOf("a1")).staleSince)
      })
    )

    run(
      "a fire checks and advances the last fire and enqueues the job at its tick, once",
      Effect.gen(function* () {
        const cron = yield* CronStorage
        yield* cron.upsert([declaration("f")])
        const { now } = yield* cron.list
        const t1 = secondOf(now, -30)
        const t2 = secondOf(now, -15)
        const job = (tick: Date) => toNewJob(template(), tick)
        const first = yield* cron.fire("f", null, t1, job(t1))
        assert.strictEqual(first._tag, "Fired")
        const state = yield* stateOf("f")
        assert.strictEqual(state.lastFireAt?.getTime(), t1.getTime())
        assert.strictEqual(state.lastJobId, first._tag === "Fired" ? first.jobId : -1n)
        // the same expected value again (a second leader): stale, nothing enqueued
        assert.deepStrictEqual(yield* cron.fire("f", null, t1, job(t1)), { _tag: "Skipped", reason: "stale" })
        assert.deepStrictEqual(yield* cron.fire("f", null, t2, job(t2)), { _tag: "Skipped", reason: "stale" })
        // not after the last fire
        assert.deepStrictEqual(yield* cron.fire("f", t1, t1, job(t1)), { _tag: "Skipped", reason: "stale" })
        // in the future
        const later = secondOf(now, 3600)
        assert.deepStrictEqual(yield* cron.fire("f", t1, later, job(later)), {
          _tag: "Skipped",
          reason: "not_due"
        })
        assert.deepStrictEqual(yield* cron.fire("nope", null, t1, job(t1)), {
          _tag: "Skipped",
          reason: "not_found"
        })
        assert.strictEqual((yield* cron.fire("f", t1, t2, job(t2)))._tag, "Fired")
        const jobs = yield* jobsOf()
        assert.deepStrictEqual(
          jobs.map((j) => [j.runAt.getTime(), j.state, j.queue, j.args]),
          [
            [t2.getTime(), "available", "cron", { n: 1 }],
            [t1.getTime(), "available", "cron", { n: 1 }]
          ]
        )
        assert.strictEqual((yield* stateOf("f")).lastFireAt?.getTime(), t2.getTime())
        // an invalid job is rejected before anything is written
        const bad = yield* Effect.flip(cron.fire("f", t2, now, { ...job(now), priority: 0 }))
        assert.instanceOf(bad, ValidationError)
        assert.strictEqual((yield* stateOf("f")).lastFireAt?.getTime(), t2.getTime())
      })
    )

    run(
      "ten fires of the same tick from the same expected value at once enqueue one job",
      Effect.gen(function* () {
        const cron = yield* CronStorage
        yield* cron.upsert([declaration("race")])
        const tick = secondOf((yield* cron.list).now, -1)
        const results = yield* Effect.all(
          Array.from({ length: 10 }, () => cron.fire("race", null, tick, toNewJob(template(), tick))),
          { concurrency: "unbounded" }
        )
        assert.strictEqual(results.filter((r) => r._tag === "Fired").length, 1)
        assert.strictEqual(results.filter((r) => r._tag === "Skipped" && r.reason === "stale").length, 9)
        assert.strictEqual((yield* jobsOf()).length, 1)
      })
    )

    run(
      "a paused schedule does not fire; resumed, it does; trigger fires now whatever the pause",
      Effect.gen(function* () {
        const cron = yield* CronStorage
        yield* cron.upsert([declaration("p")])
        const { now } = yield* cron.list
        const tick = secondOf(now, -1)
        yield* cron.pause("p", "alice")
        yield* cron.pause("p", "bob")
        const paused = yield* stateOf("p")
        assert.deepStrictEqual([paused.paused, paused.pausedBy], [true, "alice"])
        assert.deepStrictEqual(yield* cron.fire("p", null, tick, toNewJob(template(), tick)), {
          _tag: "Skipped",
          reason: "paused"
        })
        const triggered = yield* cron.trigger("p")
        assert.deepStrictEqual([triggered.state, triggered.queue], ["available", "cron"])
        const afterTrigger = yield* stateOf("p")
        assert.isNull(afterTrigger.lastFireAt, "a trigger does not move the schedule")
        assert.isNotNull(afterTrigger.lastTriggeredAt)
        yield* cron.resume("p")
        assert.deepStrictEqual([(yield* stateOf("p")).paused, (yield* stateOf("p")).pausedBy], [false, null])
        assert.strictEqual((yield* cron.fire("p", null, tick, toNewJob(template(), tick)))._tag, "Fired")
        assert.strictEqual((yield* jobsOf()).length, 2)
        assert.instanceOf(yield* Effect.flip(cron.pause("nope")), CronNotFound)
        assert.instanceOf(yield* Effect.flip(cron.resume("nope")), CronNotFound)
        assert.instanceOf(yield* Effect.flip(cron.trigger("nope")), CronNotFound)
      })
    )

    run(
      "a fire whose unique key is held consumes the tick without a job; trigger reports the conflict",
      Effect.gen(function* () {
        const cron = yield* CronStorage
        const unique = template({ unique: { byArgs: true } })
        yield* cron.upsert([declaration("u", { job: unique })])
        const { now } = yield* cron.list
        const t1 = secondOf(now, -2)
        const t2 = secondOf(now, -1)
        const first = yield* cron.fire("u", null, t1, toNewJob(unique, t1))
        assert.strictEqual(first._tag, "Fired")
        const second = yield* cron.fire("u", t1, t2, toNewJob(unique, t2))
        assert.deepStrictEqual(second, {
          _tag: "Deduplicated",
          existingJobId: first._tag === "Fired" ? first.jobId : 0n
        })
        const state = yield* stateOf("u")
        assert.deepStrictEqual([state.lastFireAt?.getTime(), state.lastJobId], [t2.getTime(), null])
        assert.deepStrictEqual(state.job.unique, { byArgs: true })
        assert.instanceOf(yield* Effect.flip(cron.trigger("u")), UniqueConflict)
        assert.strictEqual((yield* jobsOf()).length, 1)
      })
    )

    run(
      "remove deletes one schedule",
      Effect.gen(function* () {
        const cron = yield* CronStorage
        yield* cron.upsert([declaration("r"), declaration("s")])
        assert.isTrue(yield* cron.remove("r"))
        assert.isFalse(yield* cron.remove("r"))
        assert.deepStrictEqual(
          (yield* cron.list).schedules.map((s) => s.name),
          ["s"]
        )
      })
    )
  })

contract(
  "Postgres",
  (name, body) => it.live(name, () => body.pipe(Effect.provide(PgLive))),
  (ms) => Effect.sleep(ms)
)

contract(
  "simulation",
  (name, body) =>
    it.effect(name, () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(Date.parse("2026-03-01T12:00:00.250Z"))
        yield* body
      }).pipe(Effect.provide(SimLive))
    ),
  (ms) => TestClock.adjust(ms)
)

describe("CronStorage on Postgres: the row lock", () => {
  /** Runs `inTx` in a transaction on another fiber and holds it open until `release` completes. */
  const holdTransaction = <A, E>(
    inTx: Effect.Effect<A, E, CronStorage | QueueStorage | SqlClient.SqlClient>,
    commit: boolean
  ) =>
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const ready = yield* Deferred.make<A>()
      const release = yield* Deferred.make<void>()
      const fiber = yield* sql
        .withTransaction(
          Effect.gen(function* () {
            yield* Deferred.succeed(ready, yield* inTx)
            yield* Deferred.await(release)
            if (!commit) return yield* Effect.fail("rollback" as const)
          })
        )
        .pipe(Effect.ignore, Effect.forkChild)
      const value = yield* Deferred.await(ready)
      return { value, finish: Deferred.succeed(release, undefined).pipe(Effect.andThen(Fiber.join(fiber))) }
    })

  it.live("a pause that commits while a fire waits on the schedule blocks that fire", () =>
    Effect.gen(function* () {
      const cron = yield* CronStorage
      yield* cron.upsert([declaration("w")])
      const tick = secondOf((yield* cron.list).now, -1)
      const pause = yield* holdTransaction(cron.pause("w", "ops"), true)
      const fire = yield* Effect.forkChild(cron.fire("w", null, tick, toNewJob(template(), tick)))
      yield* Effect.sleep(300)
      assert.isUndefined(fire.pollUnsafe(), "the fire waits for the pause's row lock")
      yield* pause.finish
      assert.deepStrictEqual(yield* Fiber.join(fire), { _tag: "Skipped", reason: "paused" })
      assert.strictEqual((yield* jobsOf()).length, 0)
    }).pipe(Effect.provide(PgLive))
  )

  it.live("two fires of one tick racing on the row lock: the second sees the first's commit", () =>
    Effect.gen(function* () {
      const cron = yield* CronStorage
      yield* cron.upsert([declaration("race")])
      const tick = secondOf((yield* cron.list).now, -1)
      const first = yield* holdTransaction(cron.fire("race", null, tick, toNewJob(template(), tick)), true)
      assert.strictEqual(first.value._tag, "Fired")
      const second = yield* Effect.forkChild(cron.fire("race", null, tick, toNewJob(template(), tick)))
      yield* Effect.sleep(300)
      assert.isUndefined(second.pollUnsafe(), "the second fire waits on the first's row lock")
      yield* first.finish
      assert.deepStrictEqual(yield* Fiber.join(second), { _tag: "Skipped", reason: "stale" })
      assert.strictEqual((yield* jobsOf()).length, 1)
    }).pipe(Effect.provide(PgLive))
  )

  it.live("a fire rolled back (a crash before commit) leaves neither a job nor a moved schedule", () =>
    Effect.gen(function* () {
      const cron = yield* CronStorage
      yield* cron.upsert([declaration("crash")])
      const tick = secondOf((yield* cron.list).now, -1)
      const doomed = yield* holdTransaction(cron.fire("crash", null, tick, toNewJob(template(), tick)), false)
      assert.strictEqual(doomed.value._tag, "Fired")
      const retry = yield* Effect.forkChild(cron.fire("crash", null, tick, toNewJob(template(), tick)))
      yield* doomed.finish
      // the next leader fires the same tick from the same expected value
      assert.strictEqual((yield* Fiber.join(retry))._tag, "Fired")
      assert.strictEqual((yield* jobsOf()).length, 1)
      assert.strictEqual((yield* stateOf("crash")).lastFireAt?.getTime(), tick.getTime())
    }).pipe(Effect.provide(PgLive))
  )

  it.live("fired jobs carry the schedule's name and the exact tick in metadata; triggered ones say so", () =>
    Effect.gen(function* () {
      const cron = yield* CronStorage
      yield* cron.upsert([declaration("meta", { job: template({ metadata: { team: "ops" } }) })])
      const tick = secondOf((yield* cron.list).now, -3)
      yield* cron.fire("meta", null, tick, toNewJob(template({ metadata: { team: "ops" } }), tick))
      yield* cron.trigger("meta")
      const [triggered, fired] = yield* jobsOf()
      assert.deepStrictEqual(fired!.metadata, {
        team: "ops",
        "awa:cronName": "meta",
        "awa:cronFireTime": tick.toISOString()
      })
      assert.deepStrictEqual(
        [
          triggered!.metadata["awa:cronName"],
          triggered!.metadata["awa:cronTriggered"],
          triggered!.metadata.team
        ],
        ["meta", true, "ops"]
      )
    }).pipe(Effect.provide(PgLive))
  )
})
