/**
 * Cron end to end on the simulation layer under `TestClock`: real workers, real leader duty,
 * virtual time. A fired job's `runAt` is its tick, so the jobs tell which ticks fired and when.
 */
import { AwaConfigError, Job } from "@awa/core"
import { CronStorage, LeaderLock, QueueStorage } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Fiber, Layer, Schema, Scope, SubscriptionRef } from "effect"
import { TestClock } from "effect/testing"
import { reported, springForwardNight } from "../../../docs/examples/cron.ts"
import * as Awa from "../src/Awa.ts"
import * as Cron from "../src/Cron.ts"
import { handler } from "../src/Handler.ts"
import { Worker, type WorkerOptions } from "../src/Worker.ts"

const Report = Job.define({ kind: "report", args: Schema.Struct({ n: Schema.Number }), queue: "cron" })
const reportHandler = handler(Report, () => Effect.void)

const at = (iso: string) => Date.parse(iso)
const iso = (millis: number) => new Date(millis).toISOString()

/** Moves virtual time forward in steps, letting every fiber run between steps. */
const advance = (ms: number, stepMs = 100) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += stepMs) {
      yield* TestClock.adjust(Math.min(stepMs, ms - t))
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
    }
  })

const fast = {
  electionInterval: "100 millis",
  promoteInterval: "1 second",
  rescueInterval: "1 minute",
  rotateInterval: "1 minute",
  historyInterval: "1 minute",
  cronInterval: "1 second"
} as const

const workerOptions = (cron: ReadonlyArray<Cron.CronSchedule>, extra: Partial<WorkerOptions<never>> = {}) =>
  ({
    queues: { cron: { pollInterval: "1 second" } },
    handlers: [reportHandler],
    maintenance: fast,
    cron,
    // kinds without a handler here fail at once and keep their runAt, the tick the tests read
    // (the default, "retry", would move it with each backoff)
    onUnknownKind: "fail",
    ...extra
  }) satisfies WorkerOptions<never>

/** Starts a worker in a scope of its own; returns its service and how to stop it. */
const startWorker = (options: WorkerOptions<never>, layer = Awa.worker(options)) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(layer, scope)
    yield* advance(0)
    return { worker: Context.get(context, Worker), stop: Scope.close(scope, Exit.void) }
  })

/** The ticks fired for a schedule's job kind so far (job `runAt`), in order, with their jobs. */
const fired = (kind = "report") =>
  Effect.gen(function* () {
    const jobs = yield* (yield* QueueStorage).listJobs({ kind, limit: 1000 })
    return [...jobs].sort((a, b) => a.runAt.getTime() - b.runAt.getTime() || Number(a.id - b.id))
  })

const ticksOf = (jobs: ReadonlyArray<{ readonly runAt: Date }>) => jobs.map((j) => iso(j.runAt.getTime()))

/** Every `stepSeconds` from `from` to `to`, inclusive. */
const everyStep = (from: string, to: string, stepSeconds: number) => {
  const out: Array<string> = []
  for (let t = at(from); t <= at(to); t += stepSeconds * 1000) out.push(iso(t))
  return out
}

const every15s = (name: string, args = { n: 1 }, missedFire?: Cron.MissedFireInput) =>
  Cron.schedule({ name, cron: "*/15 * * * * *", job: Report, args, ...(missedFire ? { missedFire } : {}) })

describe("Cron on the simulation layer", () => {
  it.effect(
    "an interrupted pass stops before its next fire, even run uninterruptibly as the leader does",
    () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(at("2026-06-01T12:00:05Z"))
        const cron = yield* CronStorage.CronStorage
        yield* cron.upsert(yield* Cron.check([every15s("k", { n: 1 }, { catchUp: { max: 100 } })]))
        yield* Cron.evaluator()() // fires 12:00:00
        yield* TestClock.adjust(150_000) // ten ticks missed: a catch-up of ten fires
        const started = yield* Deferred.make<void>()
        const gate = yield* Deferred.make<void>()
        let fires = 0
        // the first fire waits on the gate, as a statement in flight on the server would
        const gated: CronStorage.CronStorage["Service"] = {
          ...cron,
          fire: (name, expected, tick, job) => {
            const fire = cron.fire(name, expected, tick, job)
            return ++fires === 1
              ? Effect.andThen(
                  Deferred.succeed(started, undefined),
                  Effect.andThen(Deferred.await(gate), fire)
                )
              : fire
          }
        }
        const pass = yield* Effect.forkChild(
          Effect.uninterruptible(
            Cron.evaluator()().pipe(Effect.provideService(CronStorage.CronStorage, gated))
          ),
          { startImmediately: true }
        )
        yield* Deferred.await(started)
        // the term ends while the fire is in flight; the fire then completes
        const stopping = yield* Effect.forkChild(Fiber.interrupt(pass), { startImmediately: true })
        yield* Deferred.succeed(gate, undefined)
        yield* Fiber.join(stopping)
        assert.strictEqual(fires, 1)
        // the fire in flight committed: 12:00:00 and the first missed tick
        assert.deepStrictEqual(ticksOf(yield* fired()), [
          "2026-06-01T12:00:00.000Z",
          "2026-06-01T12:00:15.000Z"
        ])
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "an hourly New York schedule fires at the right instants across the spring-forward day (2026-03-08)",
    () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(at("2026-03-08T04:30:00Z")) // 23:30 EST on the 7th
        const hourly = Cron.schedule({
          name: "hourly",
          cron: "0 * * * *",
          timezone: "America/New_York",
          job: Report,
          args: { n: 1 }
        })
        const inGap = Cron.schedule({
          name: "at-2-30",
          cron: "30 2 * * *",
          timezone: "America/New_York",
          job: Job.define({ ...Report, kind: "gap" }),
          args: { n: 2 }
        })
        const { stop } = yield* startWorker(
          workerOptions([hourly, inGap], {
            heartbeatInterval: "5 minutes",
            heartbeatStaleness: "15 minutes",
            stallWarning: "10 minutes",
            queues: { cron: { pollInterval: "1 minute" } },
            maintenance: {
              electionInterval: "1 minute",
              promoteInterval: "1 minute",
              rescueInterval: "1 minute",
              rotateInterval: "1 minute",
              historyInterval: "1 minute",
              cronInterval: "1 minute"
            }
          })
        )
        yield* advance(24.25 * 3_600_000, 60_000) // until 23:45 EDT on the 8th
        const jobs = yield* fired()
        // 00:00 and 01:00 EST, then 03:00 EDT … 23:00 EDT, then 00:00 on the 9th: 24 fires, hourly in UTC
        assert.deepStrictEqual(ticksOf(jobs), everyStep("2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 3600))
        const localHours = jobs.map((j) =>
          j.runAt.toLocaleTimeString("en-GB", {
            timeZone: "America/New_York",
            hour: "2-digit",
            hourCycle: "h23"
          })
        )
        assert.deepStrictEqual(localHours.slice(0, 4), ["00", "01", "03", "04"])
        for (const job of jobs) {
          const lag = job.createdAt.getTime() - job.runAt.getTime()
          assert.isTrue(lag >= 0 && lag <= 60_000, `enqueued within one evaluation interval (${lag} ms)`)
          assert.strictEqual(job.state, "completed")
        }
        // 02:30 does not exist on the 8th: it fires once, at 03:30 EDT
        assert.deepStrictEqual(ticksOf(yield* fired("gap")), ["2026-03-08T07:30:00.000Z"])
        yield* stop
      }).pipe(Effect.provide(Awa.layerSim())),
    120_000
  )

  it.effect("a Berlin schedule across the fall-back day (2026-10-25) runs the repeated hour once", () =>
    Effect.gen(function* () {
      // the leader's evaluation, driven minute by minute over the day
      yield* TestClock.setTime(at("2026-10-24T21:59:00Z"))
      const cron = yield* CronStorage.CronStorage
      const [declaration] = yield* Cron.check([
        Cron.schedule({
          name: "quarter",
          cron: "*/15 2-3 * * *",
          timezone: "Europe/Berlin",
          job: Report,
          args: { n: 1 }
        })
      ])
      yield* cron.upsert([declaration!])
      const evaluate = Cron.evaluator()
      for (let minute = 0; minute < 24 * 60; minute++) {
        yield* evaluate()
        yield* TestClock.adjust(60_000)
      }
      // 02:00–02:45 CEST, then (02:00–02:45 CET skipped) 03:00–03:45 CET
      assert.deepStrictEqual(ticksOf(yield* fired()), [
        ...everyStep("2026-10-25T00:00:00Z", "2026-10-25T00:45:00Z", 900),
        ...everyStep("2026-10-25T02:00:00Z", "2026-10-25T02:45:00Z", 900)
      ])
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("every 15 seconds (six fields): exact ticks, each enqueued within one evaluation interval", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(at("2026-03-01T12:00:05Z"))
      const { stop } = yield* startWorker(workerOptions([every15s("quarter-minute")]))
      yield* advance(120_000)
      const jobs = yield* fired()
      // declared at 12:00:05, it looks back one minute: 12:00:00 fires at once
      assert.deepStrictEqual(ticksOf(jobs), everyStep("2026-03-01T12:00:00Z", "2026-03-01T12:02:00Z", 15))
      for (const job of jobs.slice(1)) {
        const lag = job.createdAt.getTime() - job.runAt.getTime()
        assert.isTrue(lag >= 0 && lag <= 1_000, `lag ${lag} ms`)
      }
      yield* stop
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "after a 10-tick outage: coalesce fires once, catch-up fires each missed tick, bounded by max",
    () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(at("2026-03-01T12:00:05Z"))
        const kinds = ["coalesce", "catchup", "catchup3"] as const
        const schedules = [
          Cron.schedule({
            name: "c",
            cron: "*/15 * * * * *",
            job: { ...Report, kind: kinds[0] },
            args: { n: 1 }
          }),
          Cron.schedule({
            name: "k",
            cron: "*/15 * * * * *",
            job: { ...Report, kind: kinds[1] },
            args: { n: 1 },
            missedFire: { catchUp: { max: 100 } }
          }),
          Cron.schedule({
            name: "k3",
            cron: "*/15 * * * * *",
            job: { ...Report, kind: kinds[2] },
            args: { n: 1 },
            missedFire: { catchUp: { max: 3 } }
          })
        ]
        const first = yield* startWorker(workerOptions(schedules, { handlers: [] }))
        yield* advance(35_000) // 12:00:00 (look-back), 12:00:15 and 12:00:30 fire
        yield* first.stop
        yield* TestClock.adjust(140_000) // no worker until 12:03:00: 12:00:45 … 12:03:00 missed
        const second = yield* startWorker(workerOptions(schedules, { handlers: [] }))
        yield* advance(2_000)
        const before = everyStep("2026-03-01T12:00:00Z", "2026-03-01T12:00:30Z", 15)
        const missed = everyStep("2026-03-01T12:00:45Z", "2026-03-01T12:03:00Z", 15)
        assert.strictEqual(missed.length, 10)
        assert.deepStrictEqual(ticksOf(yield* fired(kinds[0])), [...before, "2026-03-01T12:03:00.000Z"])
        assert.deepStrictEqual(ticksOf(yield* fired(kinds[1])), [...before, ...missed])
        assert.deepStrictEqual(ticksOf(yield* fired(kinds[2])), [...before, ...missed.slice(-3)])
        // and all three go on normally
        yield* advance(15_000)
        for (const kind of kinds)
          assert.strictEqual(ticksOf(yield* fired(kind)).at(-1), "2026-03-01T12:03:15.000Z")
        yield* second.stop
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("two leaders at once (split brain: each with its own lock) enqueue every tick once", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(at("2026-03-01T12:00:05Z"))
      const options = workerOptions([every15s("shared")])
      // a lock of its own per worker: both win the election
      const own = () => Awa.worker(options).pipe(Layer.provide(Layer.fresh(LeaderLock.layerMemory)))
      const a = yield* startWorker(options, own())
      const b = yield* startWorker(options, own())
      yield* advance(1_000)
      assert.isTrue(yield* SubscriptionRef.get(a.worker.isLeader))
      assert.isTrue(yield* SubscriptionRef.get(b.worker.isLeader))
      yield* advance(120_000, 250)
      assert.deepStrictEqual(
        ticksOf(yield* fired()),
        everyStep("2026-03-01T12:00:00Z", "2026-03-01T12:02:00Z", 15)
      )
      yield* a.stop
      yield* b.stop
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("two evaluations of one snapshot racing: one job per tick, the loser is told it is stale", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(at("2026-03-01T12:00:05Z"))
      const cron = yield* CronStorage.CronStorage
      yield* cron.upsert(yield* Cron.check([every15s("race", { n: 1 }, { catchUp: { max: 10 } })]))
      const evaluate = Cron.evaluator()
      yield* TestClock.adjust(11_000)
      yield* evaluate() // 12:00:15 fires: there is a last fire now
      yield* TestClock.adjust(60_000)
      const snapshot = yield* cron.list
      const [left, right] = yield* Effect.all([evaluate(snapshot), Cron.evaluator()(snapshot)], {
        concurrency: "unbounded"
      })
      const results = [...left!, ...right!].map((r) => r.result._tag)
      assert.strictEqual(results.filter((r) => r === "Fired").length, 4, "12:00:30 … 12:01:15")
      assert.deepStrictEqual(
        [...left!, ...right!].filter((r) => r.result._tag === "Skipped").map((r) => r.result),
        [{ _tag: "Skipped", reason: "stale" }]
      )
      assert.deepStrictEqual(
        ticksOf(yield* fired()),
        everyStep("2026-03-01T12:00:15Z", "2026-03-01T12:01:15Z", 15)
      )
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("the leader killed mid-schedule: the new leader goes on with no double and no gap", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(at("2026-03-01T12:00:05Z"))
      const options = workerOptions([every15s("handover")])
      const a = yield* startWorker(options)
      const b = yield* startWorker(options)
      yield* advance(39_900) // 12:00:44.9: the 12:00:45 tick is due next
      const aLeads = yield* SubscriptionRef.get(a.worker.isLeader)
      const [leader, follower] = aLeads ? [a, b] : [b, a]
      assert.isFalse(yield* SubscriptionRef.get(follower.worker.isLeader))
      yield* leader.stop
      yield* advance(500)
      assert.isTrue(yield* SubscriptionRef.get(follower.worker.isLeader), "the other worker took over")
      yield* advance(75_000)
      assert.deepStrictEqual(
        ticksOf(yield* fired()),
        everyStep("2026-03-01T12:00:00Z", "2026-03-01T12:02:00Z", 15)
      )
      yield* follower.stop
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("a pause that lands between the leader's read and its fire prevents the fire", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(at("2026-03-01T12:00:05Z"))
      const cron = yield* CronStorage.CronStorage
      yield* cron.upsert(yield* Cron.check([every15s("p")]))
      yield* TestClock.adjust(11_000)
      const snapshot = yield* cron.list // read: not paused, 12:00:15 due
      yield* Cron.pause("p", "ops") // lands before the fire
      const reports = yield* Cron.evaluator()(snapshot)
      assert.deepStrictEqual(
        reports.map((r) => [iso(r.tick.getTime()), r.result]),
        [["2026-03-01T12:00:15.000Z", { _tag: "Skipped", reason: "paused" }]]
      )
      assert.deepStrictEqual(ticksOf(yield* fired()), [])
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "paused, a schedule does not fire; resumed, its missed ticks follow its policy; trigger ignores pause",
    () =>
      Effect.gen(function* () {
        yield* TestClock.setTime(at("2026-03-01T12:00:05Z"))
        const { stop } = yield* startWorker(workerOptions([every15s("p")]))
        yield* advance(20_000) // 12:00:00 (look-back) and 12:00:15 fire
        yield* Cron.pause("p", "ops")
        yield* advance(60_000) // 12:01:25
        assert.deepStrictEqual(ticksOf(yield* fired()), [
          "2026-03-01T12:00:00.000Z",
          "2026-03-01T12:00:15.000Z"
        ])
        const [info] = yield* Cron.list
        assert.deepStrictEqual(
          [info!.paused, info!.pausedBy, info!.nextFireAt, info!.overdue],
          [true, "ops", null, false]
        )
        const triggered = yield* Cron.trigger("p")
        assert.strictEqual(
          (yield* (yield* QueueStorage).getJob(triggered.id)).runAt.getTime(),
          at("2026-03-01T12:01:25Z")
        )
        assert.strictEqual((yield* Cron.list)[0]!.lastFireAt?.getTime(), at("2026-03-01T12:00:15Z"))
        yield* Cron.resume("p")
        const [resumed] = yield* Cron.list
        assert.deepStrictEqual(
          [resumed!.overdue, resumed!.nextFireAt?.toISOString()],
          [true, "2026-03-01T12:01:30.000Z"]
        )
        yield* advance(1_500)
        // coalesce: the four ticks missed while paused fire once, as the latest (12:01:15)
        assert.deepStrictEqual(ticksOf(yield* fired()), [
          "2026-03-01T12:00:00.000Z",
          "2026-03-01T12:00:15.000Z",
          "2026-03-01T12:01:15.000Z",
          "2026-03-01T12:01:25.000Z"
        ])
        yield* stop
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("invalid declarations fail the worker layer before anything starts or is stored", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(at("2026-03-01T12:00:05Z"))
      const error = yield* Effect.flip(
        startWorker(
          workerOptions([
            every15s("dup"),
            every15s("dup"),
            Cron.schedule({ name: "bad", cron: "*/15 * * * *  * *", job: Report, args: { n: 1 } }),
            Cron.schedule({
              name: "tz",
              cron: "0 * * * *",
              timezone: "Europe/Atlantis",
              job: Report,
              args: { n: 1 }
            })
          ])
        )
      )
      assert.instanceOf(error, AwaConfigError)
      assert.deepStrictEqual(
        (error as AwaConfigError).issues.map((i) => i.path),
        ["cron.dup", "cron.bad.cron", "cron.tz.timezone"]
      )
      assert.deepStrictEqual((yield* (yield* CronStorage.CronStorage).list).schedules, [])
      yield* advance(20_000)
      assert.deepStrictEqual(yield* fired(), [])
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("a schedule another deployment no longer declares is reported stale and keeps firing", () =>
    Effect.gen(function* () {
      yield* TestClock.setTime(at("2026-03-01T12:00:05Z"))
      const old = yield* startWorker(workerOptions([every15s("legacy"), every15s("kept", { n: 2 })]))
      yield* old.stop
      const next = yield* startWorker(workerOptions([every15s("kept", { n: 2 })]))
      const schedules = yield* Cron.list
      assert.deepStrictEqual(
        schedules.map((s) => [s.name, s.staleSince === null]),
        [
          ["kept", true],
          ["legacy", false]
        ]
      )
      yield* advance(15_000)
      const args = (yield* fired()).map((j) => (j.args as { n: number }).n).sort()
      assert.deepStrictEqual(args, [1, 1, 2, 2], "both fired at 12:00:00 and at 12:00:15")
      assert.isTrue(yield* Cron.remove("legacy"))
      yield* advance(15_000)
      assert.deepStrictEqual((yield* fired()).length, 5)
      yield* next.stop
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("docs/cron.md example: the spring-forward night in Berlin", () =>
    Effect.map(springForwardNight, ({ schedule, fireTimes }) => {
      assert.deepStrictEqual(fireTimes, ["2026-03-29T01:30:00.000Z"])
      assert.deepStrictEqual(reported, ["all"])
      assert.strictEqual(schedule.nextFireAt?.toISOString(), "2026-03-30T00:30:00.000Z")
    })
  )
})
