/**
 * Cron against Postgres. The database clock cannot be moved, so most tests drive the leader's
 * evaluation with snapshots whose `now` walks through a past day (fires of past ticks pass the
 * `tick <= now()` guard); the handover and Promise-facade tests run real workers in real time.
 */
import { AwaConfigError, Job } from "@awa/core"
import { CronStorage, QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Redacted, Schema, Scope, SubscriptionRef } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import * as Cron from "../src/Cron.ts"
import { handler } from "../src/Handler.ts"
import { createClient } from "../src/PromiseClient.ts"
import { Worker, type WorkerOptions } from "../src/Worker.ts"
import { eventually } from "./support.ts"

const Report = Job.define({ kind: "report", args: Schema.Struct({ n: Schema.Number }), queue: "cron" })

const at = (iso: string) => Date.parse(iso)
const iso = (millis: number) => new Date(millis).toISOString()

const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer({ maxConnections: 8 })))

/** Every `stepSeconds` from `from` to `to`, inclusive. */
const everyStep = (from: string, to: string, stepSeconds: number) => {
  const out: Array<string> = []
  for (let t = at(from); t <= at(to); t += stepSeconds * 1000) out.push(iso(t))
  return out
}

/** Declares schedules as if their worker had started at `declaredAt` (a past instant). */
const declareAt = (declaredAt: string, schedules: ReadonlyArray<Cron.CronSchedule>) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* (yield* CronStorage.CronStorage).upsert(yield* Cron.check(schedules))
    yield* sql`UPDATE awa.cron_schedules SET declared_at = ${declaredAt}::timestamptz,
               schedule_changed_at = ${declaredAt}::timestamptz`
  })

/** One leader pass as if the clock read `now`. */
const evaluateAt = (evaluate: ReturnType<typeof Cron.evaluator>, now: number) =>
  Effect.flatMap(CronStorage.CronStorage, (cron) =>
    Effect.flatMap(cron.list, ({ schedules }) => evaluate({ now: new Date(now), schedules }))
  )

/** The fire times stored in the metadata of a kind's jobs, in enqueue order. */
const fireTimes = (kind = "report") =>
  Effect.gen(function* () {
    const jobs = yield* (yield* QueueStorage).listJobs({ kind, limit: 1000 })
    return [...jobs]
      .sort((a, b) => Number(a.id - b.id))
      .map((j) => {
        assert.strictEqual(j.metadata["awa:cronFireTime"], iso(j.runAt.getTime()), "runAt is the tick")
        return j.metadata["awa:cronFireTime"] as string
      })
  })

const every15s = (name: string, kind = "report", missedFire?: Cron.MissedFireInput) =>
  Cron.schedule({
    name,
    cron: "*/15 * * * * *",
    job: { ...Report, kind },
    args: { n: 1 },
    ...(missedFire ? { missedFire } : {})
  })

describe("Cron on Postgres", () => {
  it.live(
    "an hourly New York schedule across the spring-forward day (2026-03-08) fires at the right instants",
    () =>
      Effect.gen(function* () {
        yield* declareAt("2026-03-08T04:30:00Z", [
          Cron.schedule({
            name: "hourly",
            cron: "0 * * * *",
            timezone: "America/New_York",
            job: Report,
            args: { n: 1 }
          }),
          Cron.schedule({
            name: "gap",
            cron: "30 2 * * *",
            timezone: "America/New_York",
            job: { ...Report, kind: "gap" },
            args: { n: 2 }
          })
        ])
        const evaluate = Cron.evaluator()
        for (let t = at("2026-03-08T04:30:00Z"); t <= at("2026-03-09T04:45:00Z"); t += 15 * 60_000)
          yield* evaluateAt(evaluate, t)
        assert.deepStrictEqual(
          yield* fireTimes(),
          everyStep("2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 3600)
        )
        assert.deepStrictEqual(yield* fireTimes("gap"), ["2026-03-08T07:30:00.000Z"])
        const [gap] = yield* (yield* QueueStorage).listJobs({ kind: "gap" })
        assert.strictEqual(gap!.metadata["awa:cronName"], "gap")
      }).pipe(Effect.provide(AwaLive))
  )

  it.live(
    "after a 10-tick outage: coalesce fires once, catch-up each missed tick in order, bounded by max",
    () =>
      Effect.gen(function* () {
        yield* declareAt("2026-06-01T12:00:05Z", [
          every15s("c", "coalesce"),
          every15s("k", "catchup", { catchUp: { max: 100 } }),
          every15s("k3", "catchup3", { catchUp: { max: 3 } })
        ])
        const evaluate = Cron.evaluator()
        for (const t of ["12:00:05", "12:00:20", "12:00:35"])
          yield* evaluateAt(evaluate, at(`2026-06-01T${t}Z`))
        // nobody evaluates until 12:03:00
        const reports = yield* evaluateAt(evaluate, at("2026-06-01T12:03:00Z"))
        const before = everyStep("2026-06-01T12:00:00Z", "2026-06-01T12:00:30Z", 15)
        const missed = everyStep("2026-06-01T12:00:45Z", "2026-06-01T12:03:00Z", 15)
        assert.strictEqual(missed.length, 10)
        assert.deepStrictEqual(yield* fireTimes("coalesce"), [...before, "2026-06-01T12:03:00.000Z"])
        assert.deepStrictEqual(yield* fireTimes("catchup"), [...before, ...missed])
        assert.deepStrictEqual(yield* fireTimes("catchup3"), [...before, ...missed.slice(-3)])
        assert.isTrue(reports.every((r) => r.result._tag === "Fired"))
      }).pipe(Effect.provide(AwaLive))
  )

  it.live("two leaders evaluating the same snapshot at once enqueue each tick once", () =>
    Effect.gen(function* () {
      yield* declareAt("2026-06-01T12:00:05Z", [every15s("race", "report", { catchUp: { max: 100 } })])
      yield* evaluateAt(Cron.evaluator(), at("2026-06-01T12:00:05Z"))
      const { schedules } = yield* (yield* CronStorage.CronStorage).list
      const snapshot = { now: new Date(at("2026-06-01T12:02:00Z")), schedules }
      const results = yield* Effect.all(
        Array.from({ length: 4 }, () => Cron.evaluator()(snapshot)),
        { concurrency: "unbounded" }
      )
      assert.strictEqual(results.flat().filter((r) => r.result._tag === "Fired").length, 8)
      assert.deepStrictEqual(
        yield* fireTimes(),
        everyStep("2026-06-01T12:00:00Z", "2026-06-01T12:02:00Z", 15)
      )
    }).pipe(Effect.provide(AwaLive))
  )

  it.live("a pause landing between the leader's read and its fire prevents the fire", () =>
    Effect.gen(function* () {
      yield* declareAt("2026-06-01T12:00:05Z", [every15s("p")])
      const { schedules } = yield* (yield* CronStorage.CronStorage).list
      yield* Cron.pause("p", "ops")
      const reports = yield* Cron.evaluator()({ now: new Date(at("2026-06-01T12:00:20Z")), schedules })
      assert.deepStrictEqual(
        reports.map((r) => r.result),
        [{ _tag: "Skipped", reason: "paused" }]
      )
      assert.deepStrictEqual(yield* fireTimes(), [])
      yield* Cron.resume("p")
      yield* evaluateAt(Cron.evaluator(), at("2026-06-01T12:00:20Z"))
      assert.deepStrictEqual(yield* fireTimes(), ["2026-06-01T12:00:15.000Z"])
    }).pipe(Effect.provide(AwaLive))
  )

  it.live("every 15 seconds (six fields): each tick exactly once, at the exact second", () =>
    Effect.gen(function* () {
      yield* declareAt("2026-06-01T12:00:05Z", [every15s("q")])
      const evaluate = Cron.evaluator()
      for (let t = at("2026-06-01T12:00:05Z"); t <= at("2026-06-01T12:02:05Z"); t += 2_500)
        yield* evaluateAt(evaluate, t)
      assert.deepStrictEqual(
        yield* fireTimes(),
        everyStep("2026-06-01T12:00:00Z", "2026-06-01T12:02:00Z", 15)
      )
    }).pipe(Effect.provide(AwaLive))
  )

  it.live(
    "the leader killed mid-schedule: the next leader goes on with no double and no gap (real time)",
    () =>
      Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
        Effect.gen(function* () {
          const options: WorkerOptions<never> = {
            queues: { cron: { pollInterval: "100 millis" } },
            handlers: [handler(Report, () => Effect.void)],
            maintenance: {
              electionInterval: "100 millis",
              cronInterval: "100 millis",
              promoteInterval: "100 millis"
            },
            cron: [
              Cron.schedule({
                name: "every-second",
                cron: "* * * * * *",
                job: Report,
                args: { n: 1 },
                missedFire: { catchUp: { max: 100 } }
              })
            ]
          }
          const start = Effect.gen(function* () {
            const scope = yield* Scope.make()
            const context = yield* Layer.buildWithScope(
              Awa.worker(options).pipe(
                Layer.provideMerge(
                  Awa.layerPg().pipe(
                    Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 4 }))
                  )
                )
              ),
              scope
            )
            return { worker: Context.get(context, Worker), context, stop: Scope.close(scope, Exit.void) }
          })
          const a = yield* start
          const b = yield* start
          const leads = (w: typeof a) => SubscriptionRef.get(w.worker.isLeader)
          yield* eventually(
            Effect.map(Effect.all([leads(a), leads(b)]), ([x, y]) => x || y),
            10_000,
            "a leader"
          )
          yield* Effect.sleep("2500 millis")
          const [leader, follower] = (yield* leads(a)) ? [a, b] : [b, a]
          yield* leader.stop
          yield* eventually(leads(follower), 10_000, "the other worker leads")
          yield* Effect.sleep("2500 millis")
          const times = yield* fireTimes().pipe(Effect.provide(follower.context))
          yield* follower.stop
          assert.isAtLeast(times.length, 4)
          assert.deepStrictEqual(
            times,
            everyStep(times[0]!, times.at(-1)!, 1),
            "every second from the first fire to the last, each once"
          )
        })
      )
  )

  it.live(
    "Promise facade: start({ cron }) rejects invalid declarations, then runs, lists, pauses, triggers",
    () =>
      Effect.flatMap(TestDatabase.acquire({ migrated: false }), ({ url }) =>
        Effect.promise(async () => {
          const awa = await createClient({ databaseUrl: url, migrateOnStart: true })
          try {
            const Tick = awa.define({
              kind: "tick",
              args: Schema.Struct({ n: Schema.Number }),
              queue: "cron"
            })
            const seen: Array<number> = []
            const handlers = [awa.handler(Tick, async ({ n }) => void seen.push(n))]
            const queues = { cron: { pollInterval: "50 millis" } } as const
            const maintenance = { electionInterval: "100 millis", cronInterval: "100 millis" } as const
            const rejected = await awa
              .start({
                queues,
                handlers,
                maintenance,
                cron: [
                  awa.schedule({
                    name: "bad",
                    cron: "99 * * * *",
                    timezone: "Nowhere/City",
                    job: Tick,
                    args: { n: 0 }
                  })
                ]
              })
              .then(
                () => undefined,
                (e: unknown) => e
              )
            assert.instanceOf(rejected, AwaConfigError)
            assert.deepStrictEqual(
              (rejected as AwaConfigError).issues.map((i) => i.path),
              ["cron.bad.timezone", "cron.bad.cron"]
            )
            assert.deepStrictEqual(await awa.listSchedules(), [])

            const worker = await awa.start({
              queues,
              handlers,
              maintenance,
              cron: [awa.schedule({ name: "each-second", cron: "* * * * * *", job: Tick, args: { n: 1 } })]
            })
            const wait = async (check: () => Promise<boolean>) => {
              for (
                const start = Date.now();
                Date.now() - start < 15_000;
                await new Promise((r) => setTimeout(r, 25))
              )
                if (await check()) return
              throw new Error("condition did not hold")
            }
            await wait(async () => seen.length >= 2)
            const [info] = await awa.listSchedules()
            assert.strictEqual(info!.name, "each-second")
            assert.isNotNull(info!.lastFireAt)
            assert.isAbove(info!.nextFireAt!.getTime(), info!.lastFireAt!.getTime())
            await awa.pauseSchedule("each-second", "test")
            await new Promise((r) => setTimeout(r, 300)) // a fire in flight lands before the pause
            const paused = (await awa.listJobs({ kind: "tick" })).length
            await new Promise((r) => setTimeout(r, 1_500))
            assert.strictEqual((await awa.listJobs({ kind: "tick" })).length, paused, "no fire while paused")
            const manual = await awa.triggerSchedule("each-second")
            assert.strictEqual((await awa.getJob(manual.id)).metadata["awa:cronTriggered"], true)
            await awa.resumeSchedule("each-second")
            await wait(async () => (await awa.listJobs({ kind: "tick" })).length >= paused + 2)
            await worker.stop()
            assert.isTrue(await awa.removeSchedule("each-second"))
          } finally {
            await awa.close()
          }
        })
      )
  )
})
