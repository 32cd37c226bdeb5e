/**
 * A worker as a real, separate Node process, for the fault suite:
 * `DATABASE_URL=… AWA_FAULT_WORKER='{"name":"w1","options":{…}}' node test/faults/worker-process.ts`.
 *
 * Runs `Awa.worker` under `NodeRuntime.runMain` (SIGTERM drains and exits), or with
 * `facade: "promise"` the Promise facade's `createClient().start()`. Every handler first records
 * its execution in `fault_log` (see `jobs.ts`). Lines for the suite go to stdout as
 * `@@fault {json}`: `ready`, `leader` (each change of maintenance leadership) and `stale` (a
 * finalization storage rejected because the attempt had been closed elsewhere).
 */
import { Job } from "@awa/core"
import { Awa, Handler, PromiseClient, Worker } from "@awa/runtime"
import { QueueStorage } from "@awa/storage"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import {
  type Duration,
  Effect,
  Layer,
  ManagedRuntime,
  Redacted,
  Schedule,
  Stream,
  SubscriptionRef
} from "effect"
import { SqlClient } from "effect/sql"
import * as Jobs from "./jobs.ts"

const config = JSON.parse(process.env.AWA_FAULT_WORKER ?? "{}") as Jobs.WorkerConfig
const url = process.env.DATABASE_URL ?? ""

const emit = (event: Record<string, unknown>) =>
  process.stdout.write(
    `${Jobs.eventPrefix}${JSON.stringify({ ...event, worker: config.name, pid: process.pid, t: Date.now() })}\n`
  )

const PgLive = PgClient.layer({
  url: Redacted.make(url),
  maxConnections: config.maxConnections ?? 10,
  applicationName: `awa-fault-${config.name}`
})

/** Records one execution event; retried so that a lost connection does not fail the handler. */
const record = (job: { id: bigint; runLease: bigint; attempt: number; kind: string }, event: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql`
      INSERT INTO fault_log (job_id, run_lease, attempt, kind, worker, pid, event)
      VALUES (${job.id}, ${job.runLease}, ${job.attempt}, ${job.kind}, ${config.name}, ${process.pid}, ${event})`
  ).pipe(Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 600 }), Effect.asVoid)

/** Records one key-grant event in `key_log` (retried like `record`). */
const recordKey = (job: { id: bigint; runLease: bigint }, key: string, event: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql`
      INSERT INTO key_log (job_id, run_lease, key, worker, event)
      VALUES (${job.id}, ${job.runLease}, ${key}, ${config.name}, ${event})`
  ).pipe(Effect.retry({ schedule: Schedule.spaced("100 millis"), times: 600 }), Effect.asVoid)

/** Waits until the suite released the job (a `release` row in `fault_log`), or `maxMs`. */
const untilReleased = (jobId: bigint, maxMs: number) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{
      n: number
    }>`SELECT count(*)::int AS n FROM fault_log WHERE job_id = ${jobId} AND event = 'release'`.pipe(
      Effect.map((rows) => rows[0]!.n > 0),
      Effect.catchCause(() => Effect.succeed(false)),
      Effect.repeat({ until: (released) => released, schedule: Schedule.spaced("100 millis") }),
      Effect.timeoutOption(maxMs),
      Effect.asVoid
    )
  )

const busyWait = (ms: number) =>
  Effect.sync(() => {
    const until = Date.now() + ms
    while (Date.now() < until) {
      // the event loop is blocked: no timers, no I/O, no heartbeats
    }
  })

/** Every handler records its execution first. */
const logged = <A, I>(
  definition: Job.JobDefinition<A, I>,
  run: (args: A, ctx: Handler.JobContext) => Effect.Effect<Job.JobResult | void, unknown, SqlClient.SqlClient>
) => Handler.handler(definition, (args, ctx) => Effect.andThen(record(ctx.job, "start"), run(args, ctx)))

const effectHandlers = [
  logged(Jobs.Work, ({ ms }) => Effect.sleep(ms)),
  logged(Jobs.Held, ({ maxMs }, ctx) => untilReleased(ctx.job.id, maxMs)),
  logged(Jobs.Throws, () =>
    Effect.sync(() => {
      throw new Error("handler threw")
    })
  ),
  // not `logged`: it throws before any Effect of its own could run, so it records nothing
  Handler.handler(Jobs.ThrowsOutside, () => {
    throw new Error("threw before returning an Effect")
  }),
  logged(Jobs.Fails, () => Effect.fail(new Job.JobRetryableError({ message: "handler failed" }))),
  logged(Jobs.Dies, () => Effect.die(new Error("handler returned a defect"))),
  logged(Jobs.Terminal, () => Effect.fail(new Job.JobTerminalError({ message: "handler gave up" }))),
  logged(Jobs.HangOnce, (_, ctx) => (ctx.job.attempt === 1 ? Effect.never : Effect.void)),
  logged(Jobs.HangAlways, () => Effect.never),
  logged(Jobs.Uninterruptible, ({ ms }, ctx) =>
    ctx.job.attempt === 1 ? Effect.uninterruptible(Effect.sleep(ms)) : Effect.void
  ),
  logged(Jobs.BlockLoop, ({ ms }) => busyWait(ms)),
  logged(Jobs.BadBackoff, (_, ctx) =>
    ctx.job.attempt === 1
      ? Effect.fail(new Job.JobRetryableError({ message: "first attempt fails" }))
      : Effect.void
  ),
  logged(Jobs.BadResult, ({ variant }, ctx) =>
    Effect.succeed(
      ctx.job.attempt > 1 || ctx.job.runLease > 1n
        ? Job.JobResult.completed
        : variant === "negative_retry"
          ? Job.JobResult.retryAfter(-1, "negative delay")
          : variant === "huge_snooze"
            ? Job.JobResult.snooze("40 days")
            : variant === "unparseable"
              ? Job.JobResult.snooze("whenever" as Duration.Input)
              : (null as unknown as Job.JobResult)
    )
  ),
  logged(Jobs.ThrowingBackoff, (_, ctx) =>
    ctx.job.attempt === 1
      ? Effect.fail(new Job.JobRetryableError({ message: "first attempt fails" }))
      : Effect.void
  ),
  logged(Jobs.Injected, () => Effect.void),
  Handler.handler(Jobs.Keyed, ({ key, ms }, ctx) =>
    recordKey(ctx.job, key, "start").pipe(
      Effect.andThen(Effect.sleep(ms)),
      Effect.andThen(recordKey(ctx.job, key, "end"))
    )
  ),
  logged(Jobs.StaleWriter, ({ firstMs, maxMs }, ctx) =>
    (ctx.job.attempt === 1 ? Effect.sleep(firstMs) : untilReleased(ctx.job.id, maxMs)).pipe(
      Effect.andThen(record(ctx.job, "end"))
    )
  )
]

/** Reports every finalization storage refused as stale (the attempt was closed elsewhere). */
const ReportStale = Layer.effect(
  QueueStorage,
  Effect.map(QueueStorage, (storage) =>
    QueueStorage.of({
      ...storage,
      finalizeMany: (items) =>
        storage.finalizeMany(items).pipe(
          Effect.tap((results) =>
            Effect.sync(() => {
              for (const [i, result] of results.entries()) {
                const item = items[i]!
                if (result._tag === "Stale")
                  emit({
                    event: "stale",
                    jobId: String(item.jobId),
                    runLease: String(item.runLease),
                    outcome: item.outcome._tag
                  })
              }
            })
          )
        )
    })
  )
)

/** Announces readiness and every change of leadership. */
const Announce = Layer.effectDiscard(
  Effect.gen(function* () {
    const worker = yield* Worker.Worker
    yield* SubscriptionRef.changes(worker.isLeader).pipe(
      Stream.runForEach((value) => Effect.sync(() => emit({ event: "leader", value }))),
      Effect.forkScoped
    )
    emit({ event: "ready" })
  })
)

const runEffectWorker = () => {
  const http = (config.http ?? []).map((h) => Awa.httpWorker(h.kind, h.options as never))
  const options = {
    ...config.options,
    handlers: [...effectHandlers, ...http]
  } as unknown as Worker.WorkerOptions<SqlClient.SqlClient>
  const app = Announce.pipe(
    Layer.provideMerge(Awa.worker(options)),
    Layer.provide(ReportStale),
    Layer.provideMerge(Awa.layerPg()),
    Layer.provideMerge(PgLive)
  )
  NodeRuntime.runMain(Layer.launch(app))
}

const runPromiseWorker = async () => {
  const log = ManagedRuntime.make(PgLive)
  const awa = await PromiseClient.createClient({
    databaseUrl: url,
    maxConnections: config.maxConnections ?? 10
  })
  const recordP = (ctx: Pick<Handler.JobContext, "job">) => log.runPromise(record(ctx.job, "start"))
  const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
  const handlers = [
    awa.handler(Jobs.PromiseRejects, async (_, ctx) => {
      await recordP(ctx)
      throw new Error("promise rejected")
    }),
    awa.handler(Jobs.PromiseThrowsSync, (_, ctx) => {
      void recordP(ctx)
      throw new Error("threw before returning a promise")
    }),
    awa.handler(Jobs.PromiseTerminal, async (_, ctx) => {
      await recordP(ctx)
      throw new Job.JobTerminalError({ message: "promise gave up" })
    }),
    awa.handler(Jobs.PromiseIgnoresAbort, async ({ ms }, ctx) => {
      await recordP(ctx)
      // the AbortSignal is ignored on purpose
      if (ctx.job.attempt === 1) await sleep(ms)
    }),
    awa.handler(Jobs.PromiseOk, async (_, ctx) => {
      await recordP(ctx)
    })
  ]
  const worker = await awa.start({ ...(config.options as any), handlers })
  emit({ event: "ready" })
  const stop = async () => {
    await worker.stop()
    await awa.close()
    await log.dispose()
    process.exit(0)
  }
  process.once("SIGTERM", () => void stop())
  process.once("SIGINT", () => void stop())
}

if (config.facade === "promise") void runPromiseWorker()
else runEffectWorker()
