/**
 * Reclamation liveness at full size (migration 0021, docs/adr/0018-reclamation-liveness.md;
 * issue 14, property 1): one queue paused with jobs, one served by no worker, a backlog draining
 * slowly, and a busy queue running its jobs, with the leader's rotate/prune/unpark duties driven
 * by hand, one "tick" per busy batch.
 *
 *   node bench/src/liveness.ts                                    # 1,000,000 backlog, 200,000 busy
 *   node bench/src/liveness.ts --backlog 100000 --busy 20000      # smaller
 *
 * Reports: rotations and prunes, the largest ready partition seen (sampled every 10 ticks), rows
 * in `parked`, the slowest prune call, busy jobs in history, and — after the busy queue is done and
 * the paused queue resumed — whether every held-up job was claimed exactly once in lane order,
 * and how long the drain took. Postgres: `DATABASE_URL`, or a temporary embedded server.
 */
import { Migrations } from "@awa/sql"
import { PgQueueStorage, QueueStorage } from "@awa/storage"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Layer, Redacted } from "effect"
import { Reactivity } from "effect/reactivity"
import {
  acquireServer,
  createDatabase,
  databaseName,
  dropDatabase,
  loadLine,
  now,
  round,
  stringArg
} from "./lib.ts"

const backlogJobs = Number(stringArg("--backlog", "1000000"))
const busyJobs = Number(stringArg("--busy", "200000"))
const heldJobs = Number(stringArg("--held", "1000"))
const busyPerTick = Number(stringArg("--busy-per-tick", "2000"))
const slowPerTick = Number(stringArg("--slow-per-tick", "200"))
const drainBatch = Number(stringArg("--drain-batch", "1000"))
const retention = { completedMs: 86_400_000, failedMs: 259_200_000, cancelledMs: 259_200_000 }

const job = (queue: string, n: number) => ({ kind: "liveness", queue, args: { n } })

const program = Effect.gen(function* () {
  const server = yield* acquireServer
  const name = databaseName("awa_liveness")
  const url = yield* createDatabase(server.url, name)
  yield* Effect.addFinalizer(() => dropDatabase(server.url, name))
  yield* Migrations.migrate().pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })))
  yield* Console.log(
    `liveness bench: backlog ${backlogJobs}, busy ${busyJobs}, paused/unserved ${heldJobs} each; load ${loadLine()}`
  )
  yield* Effect.gen(function* () {
    const storage = yield* QueueStorage
    const sql = yield* PgClient.PgClient
    const enqueue = (queue: string, n: number) =>
      Effect.gen(function* () {
        const ids: Array<bigint> = []
        for (let done = 0; done < n; done += 5000)
          ids.push(
            ...(yield* storage.enqueueMany(
              Array.from({ length: Math.min(5000, n - done) }, (_, i) => job(queue, done + i))
            )).map((x) => x.id)
          )
        return ids
      })
    yield* storage.pauseQueue("paused")
    const t0 = now()
    const ids = {
      paused: yield* enqueue("paused", heldJobs),
      unserved: yield* enqueue("unserved", heldJobs),
      backlog: yield* enqueue("backlog", backlogJobs)
    }
    const enqueueMs = now() - t0
    const claimedOrder: Record<string, Array<bigint>> = { paused: [], unserved: [], backlog: [] }
    let rotations = 0
    let prunes = 0
    let blocked = 0
    let largest = 0
    let slowestPruneMs = 0
    let maxParked = 0
    const t1 = now()
    let ticks = 0
    for (let done = 0; done < busyJobs; done += busyPerTick, ticks++) {
      yield* storage.enqueueMany(Array.from({ length: busyPerTick }, (_, i) => job("busy", done + i)))
      for (
        let b = yield* storage.claim({ queue: "busy", max: 1000, deadlineMs: 0, agingIntervalMs: 0 });
        b.length > 0;
      ) {
        yield* storage.finalizeMany(
          b.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
        )
        b = yield* storage.claim({ queue: "busy", max: 1000, deadlineMs: 0, agingIntervalMs: 0 })
      }
      yield* storage.promoteDue(4096)
      const slow = yield* storage.claim({
        queue: "backlog",
        max: slowPerTick,
        deadlineMs: 0,
        agingIntervalMs: 0
      })
      claimedOrder.backlog!.push(...slow.map((c) => c.jobId))
      yield* storage.finalizeMany(
        slow.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
      )
      // the leader's rotate-prune tick, with the default ring policy (10,000 rows or 10 s)
      if ((yield* storage.rotateWhenDue({})) === "Rotated") rotations++
      for (let i = 0; i < 16; i++) {
        const t = now()
        const outcome = yield* storage.prune(retention)
        slowestPruneMs = Math.max(slowestPruneMs, now() - t)
        if (outcome._tag === "Pruned") prunes++
        else {
          if (outcome._tag === "Blocked") blocked++
          break
        }
      }
      yield* storage.trimLedgers(5000)
      if (ticks % 10 === 0) {
        const [row] = yield* sql<{ n: number; parked: number }>`
          SELECT (SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM awa.ready GROUP BY slot) s)::int AS n,
                 (SELECT count(*) FROM awa.parked)::int AS parked`
        largest = Math.max(largest, row!.n)
        maxParked = Math.max(maxParked, row!.parked)
        yield* Console.log(
          `tick ${ticks}: rotations ${rotations}, prunes ${prunes}, largest ready slot ${row!.n}, parked ${row!.parked}`
        )
      }
    }
    const busyMs = now() - t1
    const [hist] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.history WHERE queue = 'busy'`
    // afterwards: resume and drain every held-up queue, checking lane order
    yield* storage.resumeQueue("paused")
    const t2 = now()
    // where the drain's time goes, per call kind (ms)
    const spent = { promote: 0, claim: 0, finalize: 0, rotate: 0, prune: 0 }
    const timed = <A, E, R>(kind: keyof typeof spent, effect: Effect.Effect<A, E, R>) =>
      Effect.gen(function* () {
        const t = now()
        const out = yield* effect
        spent[kind] += now() - t
        return out
      })
    let claimCalls = 0
    for (const q of ["paused", "unserved", "backlog"] as const) {
      for (let idle = 0; idle < 3; ) {
        yield* timed("promote", storage.promoteDue(4096))
        const b = yield* timed(
          "claim",
          storage.claim({ queue: q, max: drainBatch, deadlineMs: 0, agingIntervalMs: 0 })
        )
        claimCalls++
        if (b.length === 0) {
          idle++
          continue
        }
        idle = 0
        claimedOrder[q]!.push(...b.map((c) => c.jobId))
        yield* timed(
          "finalize",
          storage.finalizeMany(
            b.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
          )
        )
        if ((yield* timed("rotate", storage.rotateWhenDue({}))) === "Rotated") rotations++
        while ((yield* timed("prune", storage.prune(retention)))._tag === "Pruned") prunes++
      }
    }
    const drainMs = now() - t2
    const inOrder = (q: "paused" | "unserved" | "backlog") =>
      claimedOrder[q]!.length === ids[q].length && claimedOrder[q]!.every((id, i) => id === ids[q][i])
    yield* Console.log(
      JSON.stringify(
        {
          backlogJobs,
          busyJobs,
          heldJobs,
          enqueueSeconds: round(enqueueMs / 1000, 1),
          ticks,
          busySeconds: round(busyMs / 1000, 1),
          rotations,
          prunes,
          blockedPrunes: blocked,
          largestReadySlot: largest,
          maxParked,
          slowestPruneMs: round(slowestPruneMs, 1),
          busyJobsInHistory: hist!.n,
          drainSeconds: round(drainMs / 1000, 1),
          drainJobsPerSecond: Math.round(((2 * heldJobs + backlogJobs) * 1000) / drainMs),
          drainClaimCalls: claimCalls,
          drainSecondsBy: Object.fromEntries(Object.entries(spent).map(([k, v]) => [k, round(v / 1000, 1)])),
          exactlyOnceInLaneOrder: {
            paused: inOrder("paused"),
            unserved: inOrder("unserved"),
            backlog: inOrder("backlog")
          }
        },
        null,
        2
      )
    )
  }).pipe(
    Effect.provide(
      PgQueueStorage.layer().pipe(
        Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 2 }))
      )
    )
  )
  yield* Console.log(`load after ${loadLine()}`)
}).pipe(Effect.scoped, Effect.provide(Reactivity.layer))

NodeRuntime.runMain(program)
