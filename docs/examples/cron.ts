/**
 * Periodic jobs: a schedule declared next to its job, fired by the maintenance leader. Used by
 * docs/cron.md and run by packages/runtime/test/Cron.sim.test.ts (inside `it.effect`, which
 * provides `TestClock`).
 */
import { Awa, AwaClient, Cron, Handler, Job } from "@awa/effect"
import { Effect, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"

export const DailyReport = Job.define({
  kind: "daily_report",
  args: Schema.Struct({ scope: Schema.String }),
  queue: "reports"
})

/** 02:30 Berlin time every night; after an outage, up to 7 missed nights are caught up. */
export const nightly = Cron.schedule({
  name: "nightly-report",
  cron: "30 2 * * *",
  timezone: "Europe/Berlin",
  job: DailyReport,
  args: { scope: "all" },
  missedFire: { catchUp: { max: 7 } }
})

export const reported: Array<string> = []
const report = Handler.handler(DailyReport, ({ scope }) => Effect.sync(() => void reported.push(scope)))

export const WorkerLive = Awa.worker({
  queues: { reports: {} },
  handlers: [report],
  cron: [nightly]
})

/**
 * The spring-forward night of 2026-03-29 in the simulation (Berlin clocks jump from 02:00 to
 * 03:00, so 02:30 does not exist): the report runs once, at 03:30 CEST (01:30 UTC), and the next
 * one is due at 02:30 CEST the night after.
 */
export const springForwardNight = Effect.gen(function* () {
  yield* TestClock.setTime(Date.parse("2026-03-29T00:45:00Z")) // before the worker starts
  return yield* Effect.gen(function* () {
    for (let minute = 0; minute < 60; minute++) {
      yield* TestClock.adjust("1 minute")
      yield* Effect.yieldNow
    }
    const [schedule] = yield* Cron.list
    const awa = yield* AwaClient.AwaClient
    const jobs = yield* awa.storage.listJobs({ kind: "daily_report" })
    return { schedule: schedule!, fireTimes: jobs.map((j) => j.runAt.toISOString()) }
  }).pipe(Effect.provide(WorkerLive.pipe(Layer.provideMerge(Awa.layerSim()))))
})
