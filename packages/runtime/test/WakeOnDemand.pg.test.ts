/**
 * Wake-ups on demand in the worker (migration 0051, docs/adr/0038-wake-ups-on-demand.md): a
 * dispatcher says its queue waits before it sleeps, stops saying so while it drains a backlog,
 * and never sleeps through a job whose insert sent no wake-up. Every worker here polls once a
 * minute, so a pickup within seconds is a wake-up's (or the protocol's own claim), never the poll.
 */
import { Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Fiber, Layer, Redacted, Schema, Scope } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { Worker, type WorkerOptions } from "../src/Worker.ts"
import { eventually } from "./support.ts"

const queue = "on-demand"
const Tick = Job.define({ kind: "tick", args: Schema.Struct({ n: Schema.Number }), queue })

/** Awa on its own pool against `url`. */
const awaOn = (url: string) =>
  Awa.layerPg().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 6 })))

/** A worker (its own pool) in a scope the test closes. */
const startWorker = <R>(url: string, options: WorkerOptions<R>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(
      Awa.worker(options).pipe(Layer.provideMerge(awaOn(url))),
      scope
    )
    return { worker: Context.get(context, Worker), stop: Scope.close(scope, Exit.void) }
  })

const slowPoll = { pollInterval: "60 seconds", idlePollMax: "60 seconds" } as const

/** Whether a worker's signals connection holds the queue's waiter bucket (it waits on the queue). */
const waiting = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const [row] = yield* sql<{ n: number }>`
    SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE a.datname = current_database() AND a.application_name LIKE '% signals'
      AND l.locktype = 'advisory' AND l.mode = 'ShareLock' AND l.granted AND l.objsubid = 2
      AND l.classid::bigint = (awa.lock_ns('waiters')::bigint + 4294967296) % 4294967296
      AND l.objid::bigint = awa.waiter_bucket(${queue})`
  return row!.n > 0
})

describe("wake-ups on demand in the worker (migration 0051)", () => {
  it.live(
    "an idle worker waits on its queue and is woken; draining a backlog it stops waiting, then waits again",
    () =>
      Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
        Effect.gen(function* () {
          const client = yield* AwaClient
          let ran = 0
          const w = yield* startWorker(url, {
            queues: { [queue]: { maxConcurrency: 4, ...slowPoll } },
            handlers: [
              handler(Tick, () =>
                Effect.andThen(
                  Effect.sleep("2 millis"),
                  Effect.sync(() => void ran++)
                )
              )
            ],
            maintenance: false
          })
          yield* eventually(waiting, 10_000, "the idle worker waits on its queue")
          yield* client.insert(Tick, { n: 0 })
          yield* eventually(
            Effect.sync(() => ran === 1),
            10_000,
            "pickup by wake-up"
          )
          // a backlog: full claims in a row, so it stops waiting while it drains
          const backlog = 3_000
          yield* client.insertMany(
            Tick,
            Array.from({ length: backlog }, (_, n) => ({ n }))
          )
          yield* eventually(
            Effect.map(waiting, (w) => !w && ran < 1 + backlog),
            30_000,
            "no longer waiting while it drains the backlog"
          )
          yield* eventually(
            Effect.sync(() => ran === 1 + backlog),
            60_000,
            "the backlog drained"
          )
          yield* eventually(waiting, 10_000, "waiting again once drained")
          yield* client.insert(Tick, { n: -1 })
          yield* eventually(
            Effect.sync(() => ran === 2 + backlog),
            10_000,
            "pickup by wake-up after the backlog"
          )
          yield* w.stop
        }).pipe(Effect.provide(awaOn(url)))
      ),
    120_000
  )

  it.live(
    "a worker that starts to wait while an insert is in flight takes its job at commit, with no wake-up sent",
    () =>
      Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const client = yield* AwaClient
          // the insert first, held open: it found no waiter, so it holds the bucket and will not notify
          const inserted = yield* Deferred.make<void>()
          const commit = yield* Deferred.make<void>()
          const producer = yield* sql
            .withTransaction(
              Effect.andThen(
                client.insert(Tick, { n: 1 }),
                Effect.andThen(Deferred.succeed(inserted, undefined), Deferred.await(commit))
              )
            )
            .pipe(Effect.forkChild({ startImmediately: true }))
          yield* Deferred.await(inserted)
          let ran = 0
          const w = yield* startWorker(url, {
            queues: { [queue]: slowPoll },
            handlers: [handler(Tick, () => Effect.sync(() => void ran++))],
            maintenance: false
          })
          // the worker claimed (nothing committed yet) and tried to wait: told the bucket is busy
          yield* eventually(
            Effect.map(
              sql<{ n: number }>`
                SELECT count(*)::int AS n FROM pg_stat_activity
                WHERE datname = current_database() AND application_name LIKE '% signals'
                  AND query LIKE '%pg_try_advisory_lock_shared%'`,
              ([row]) => row!.n > 0
            ),
            10_000,
            "the worker tried to wait"
          )
          assert.isFalse(yield* waiting, "it could not while the insert is open")
          yield* Deferred.succeed(commit, undefined)
          yield* Fiber.join(producer)
          yield* eventually(
            Effect.sync(() => ran === 1),
            10_000,
            "pickup after the commit (no wake-up was sent; the poll is a minute)"
          )
          yield* eventually(waiting, 10_000, "waiting once the insert committed")
          yield* w.stop
        }).pipe(Effect.provide(awaOn(url)))
      ),
    60_000
  )
})
