/**
 * Leader election and maintenance duties (capability 8).
 *
 * Every worker runs the election loop; the one holding the `LeaderLock` runs the duties, each on
 * its own fiber and schedule, in a scope closed the moment leadership is lost (lock connection
 * gone) or the worker stops. A slow duty never blocks another. Leadership is exposed as a
 * `SubscriptionRef<boolean>`.
 *
 * Duties are safe even if two processes briefly both believe they lead (split brain while a
 * lost connection is noticed): rotate/prune take the ring serializer, promotion skips locked
 * rows, rescue takes per-attempt locks, a cron fire compares-and-swaps its schedule's last fire.
 */
import {
  CallbackStorage,
  CronStorage,
  LeaderLock,
  type PruneOutcome,
  type PruneState,
  QueueStorage,
  type RescuedAttempt,
  type RetentionParams,
  type RotatePolicy
} from "@awa/storage"
import { Clock, Effect, Option, Schedule, SubscriptionRef } from "effect"
import * as Cron from "./Cron.ts"
import * as RuntimeMetrics from "./RuntimeMetrics.ts"

export interface MaintenanceConfig {
  readonly electionIntervalMs: number
  readonly promoteIntervalMs: number
  readonly promoteBatch: number
  readonly rescueIntervalMs: number
  readonly rescueBatch: number
  readonly heartbeatStalenessMs: number
  readonly rotateIntervalMs: number
  /** When the queue ring moves on; unset fields keep the storage layer's policy. */
  readonly rotate: RotatePolicy
  /** Prune's carry threshold; unset keeps the storage layer's `pruneCarryAfterMs`. */
  readonly pruneCarryAfterMs: number | undefined
  readonly historyIntervalMs: number
  readonly retention: RetentionParams
  readonly dlqCleanupIntervalMs: number
  readonly dlqRetentionMs: number
  readonly cronIntervalMs: number
  /** How often per-queue figures are sampled for rates and series (migration 0031). */
  readonly statsSampleIntervalMs: number
}

/** Samples are kept this long (the dashboard shows the last hour). */
const statsKeepMs = 2 * 3_600_000

/**
 * Where a duty's tick may stop when its term ends (worker shutdown, lost leadership): between two
 * of its statements. A tick is otherwise uninterruptible (see `every`); ticks that loop over
 * batches pass here between batches, so a shutdown waits for one statement, not for the loop.
 */
const betweenStatements = Effect.interruptible(Effect.void)

/**
 * Runs `task` every `intervalMs` for as long as the enclosing scope lives; failures are logged.
 * A duty whose first tick is `deferred` waits one interval first (see `duties`).
 *
 * A tick is not interrupted inside a statement: interrupting it cancels the statement on the
 * server, which rolls back whatever it had written so far, and those rows stay behind as dead
 * tuples on ring children (a prune's history copy of a whole slot, a promotion's ready rows, a
 * rescue's closures) for work that is then done again. An ending term lets the statement in flight
 * finish and stops the tick at its next `betweenStatements` (or its end), as the dispatcher's
 * claims and the batcher's flushes do.
 */
const every = (
  name: string,
  intervalMs: number,
  task: Effect.Effect<unknown, unknown>,
  first: "at once" | "deferred" = "at once"
) =>
  task.pipe(
    // one span per tick (its queries as children); emitted only with `backgroundSpans`
    Effect.withSpan(`awa.maintenance ${name}`),
    Effect.catchCause((cause) => Effect.logWarning(`maintenance duty ${name} failed`, cause)),
    Effect.uninterruptible,
    Effect.repeat(Schedule.spaced(intervalMs)),
    (ticks) => (first === "deferred" ? Effect.andThen(Effect.sleep(intervalMs), ticks) : ticks),
    Effect.annotateLogs({ module: "Leader", duty: name }),
    Effect.forkScoped
  )

export const duties = Effect.fnUntraced(function* (config: MaintenanceConfig) {
  const storage = yield* QueueStorage
  const metrics = yield* RuntimeMetrics.makeRecorder
  const historyRotateAgeMs = Math.max(
    60_000,
    Math.ceil(
      Math.max(config.retention.completedMs, config.retention.failedMs, config.retention.cancelledMs) / 30
    )
  )
  // Promotion drains in batches until a batch comes back short.
  const promote = Effect.gen(function* () {
    for (let i = 0; i < 32; i++) {
      if (i > 0) yield* betweenStatements
      if ((yield* storage.promoteDue(config.promoteBatch)) < config.promoteBatch) return
    }
  })
  const pruneParams =
    config.pruneCarryAfterMs === undefined
      ? config.retention
      : { ...config.retention, carryAfterMs: config.pruneCarryAfterMs }
  // Ledger retention (migration 0017): only after a prune, since only rotations and prunes add
  // ledger rows; the SQL side acts once a whole ring wrap has piled up, in batches of 5,000.
  const trimLedgers = Effect.gen(function* () {
    for (let i = 0; i < 10; i++) {
      yield* betweenStatements
      if (!(yield* storage.trimLedgers(5000)).more) return
    }
  })
  // Prune cannot starve (ADR 0018): its NOWAIT lock fails under readers that never all let go at
  // once, so after 3 ticks blocked on the lock it queues for it (`forceLockTimeoutMs`): 200 ms,
  // doubling with each forced attempt that fails, up to 2 s (readers of the slot stall that long
  // at most), the k-th failed forced attempt followed by 2^k ticks (≤ 32) of NOWAIT attempts only.
  // Any other answer ends the tick; the next tick tries again.
  const forceAfter = 3
  let tick = 0
  let lockFailures = 0
  let forcedFailures = 0
  let nextForcedTick = 0
  const pruneOnce = Effect.gen(function* () {
    const force = lockFailures >= forceAfter && tick >= nextForcedTick
    const outcome = yield* storage.prune(
      force ? { ...pruneParams, forceLockTimeoutMs: Math.min(2000, 200 * 2 ** forcedFailures) } : pruneParams
    )
    metrics.pruned(outcome._tag.toLowerCase(), "reason" in outcome ? outcome.reason : undefined)
    lastOutcome = outcome
    if (outcome._tag === "Pruned") {
      lockFailures = 0
      forcedFailures = 0
      nextForcedTick = 0
    } else if (outcome._tag === "Blocked" && outcome.reason === "lock") {
      lockFailures++
      if (force) {
        forcedFailures++
        nextForcedTick = tick + 2 ** Math.min(forcedFailures, 5)
      }
    }
    return outcome._tag === "Pruned"
  })
  // The last prune outcome per ring, written for `awa status` only when it changes (migration
  // 0031): a tick ends `blocked` (with the reason) when its last attempt was refused, else `ok`.
  // A new term writes its first state once (the memory starts empty).
  const recorded = new Map<string, string>()
  const recordPrune = (ring: "queue" | "history", outcome: PruneOutcome) => {
    const state: PruneState =
      outcome._tag === "Blocked"
        ? { outcome: "blocked", reason: outcome.reason }
        : { outcome: "ok", reason: null }
    const key = `${state.outcome}:${state.reason ?? ""}`
    if (recorded.get(ring) === key) return Effect.void
    return Effect.map(storage.recordPruneState(ring, state), () => {
      recorded.set(ring, key)
    })
  }
  let lastOutcome: PruneOutcome = { _tag: "Noop" }
  const rotateAndPrune = Effect.gen(function* () {
    tick++
    yield* storage.rotateWhenDue(config.rotate)
    let pruned = 0
    for (; pruned < 16; pruned++) {
      yield* betweenStatements
      if (!(yield* pruneOnce)) break
    }
    yield* recordPrune("queue", lastOutcome)
    if (pruned > 0) yield* trimLedgers
  })
  const history = Effect.gen(function* () {
    yield* storage.rotateHistory(historyRotateAgeMs)
    yield* betweenStatements
    yield* recordPrune("history", yield* storage.pruneHistory(config.retention))
  })
  // Rates and series for the statistics (migration 0031): off the hot path, by the leader only.
  const sample = storage.sampleQueueStats({
    minIntervalMs: config.statsSampleIntervalMs / 2,
    keepMs: statsKeepMs
  })
  yield* every("promote", config.promoteIntervalMs, promote)
  // A new term sweeps for stale attempts only once it has lasted one staleness period.
  // Leadership is lost whenever the database goes away, and while it is away no worker can
  // heartbeat: sweeping at once on reconnect would rescue every in-flight attempt of the live
  // workers (fault suite, scenario 3). After the grace their heartbeats have landed again.
  const termStart = yield* Clock.currentTimeMillis
  const rescueStale = Effect.flatMap(Clock.currentTimeMillis, (now) =>
    now - termStart < config.heartbeatStalenessMs
      ? Effect.void
      : storage.rescueStale({ stalenessMs: config.heartbeatStalenessMs, limit: config.rescueBatch })
  )
  const counted = (rescued: ReadonlyArray<RescuedAttempt>) => {
    for (const r of rescued) metrics.rescued(r.reason, r.queue, r.kind)
  }
  yield* every(
    "rescue-stale",
    config.rescueIntervalMs,
    Effect.map(rescueStale, (r) => {
      if (r !== undefined) counted(r)
    })
  )
  yield* every(
    "rescue-deadline",
    config.rescueIntervalMs,
    Effect.map(storage.rescueDeadlines(config.rescueBatch), counted)
  )
  // Callback timeouts (capabilities.md §6, §17): where the storage layer has callbacks.
  const callbacks = yield* Effect.serviceOption(CallbackStorage)
  if (callbacks._tag === "Some")
    yield* every(
      "rescue-callback",
      config.rescueIntervalMs,
      Effect.map(callbacks.value.rescueTimedOut(config.rescueBatch), counted)
    )
  yield* every("rotate-prune", config.rotateIntervalMs, rotateAndPrune)
  // A new term starts with what jobs wait for (promotion, rescue, the queue ring, cron) and leaves
  // the bookkeeping nothing waits for to its first interval: the history ring's retention, the
  // statistics samples and DLQ retention. At a deploy the new leader's first moments are the
  // backlog's, and these first ticks cost the most (every statement planned on a new connection;
  // a stats sample counts what was born since the last one): ~250 ms of server time at once in a
  // 20,000-job drain (docs/benchmarks.md, "Maintenance inside the drain"). Samples are rates between
  // stored samples, so a new leader's first one a little later loses nothing.
  yield* every("history", config.historyIntervalMs, history, "deferred")
  yield* every("stats-sample", config.statsSampleIntervalMs, sample, "deferred")
  // DLQ retention: batches of 1,000 until a batch comes back short (at most 10 per tick).
  const dlqCleanup = Effect.gen(function* () {
    for (let i = 0; i < 10; i++) {
      if (i > 0) yield* betweenStatements
      if ((yield* storage.cleanupDlq(config.dlqRetentionMs, 1000)) < 1000) return
    }
  })
  yield* every("dlq-retention", config.dlqCleanupIntervalMs, dlqCleanup, "deferred")
  // Cron: every stored schedule, whoever declared it (capability 9).
  const cron = yield* CronStorage.CronStorage
  const evaluate = Cron.evaluator()
  yield* every(
    "cron",
    config.cronIntervalMs,
    evaluate().pipe(Effect.provideService(CronStorage.CronStorage, cron))
  )
})

/**
 * The election loop: try to take the lock every election interval; while held, check it every
 * interval and run the duties; on loss, stop them and try again.
 */
export const run = Effect.fnUntraced(function* (
  config: MaintenanceConfig,
  isLeader: SubscriptionRef.SubscriptionRef<boolean>
) {
  const lock = yield* LeaderLock.LeaderLock
  // One term of office: its scope holds the lock's connection and the duty fibers; closing it
  // (loss, interruption) stops the duties and releases the lock.
  const term = Effect.scoped(
    Effect.gen(function* () {
      const acquired = yield* lock.tryAcquire.pipe(Effect.catchCause(() => Effect.succeed(Option.none())))
      if (Option.isNone(acquired)) return
      const metrics = yield* RuntimeMetrics.makeRecorder
      yield* Effect.addFinalizer(() =>
        Effect.andThen(
          Effect.sync(() => metrics.leading(false)),
          SubscriptionRef.set(isLeader, false)
        )
      )
      yield* SubscriptionRef.set(isLeader, true)
      metrics.leading(true)
      yield* Effect.logInfo("became maintenance leader")
      yield* duties(config)
      yield* acquired.value.check.pipe(
        Effect.andThen(Effect.sleep(config.electionIntervalMs)),
        Effect.forever,
        Effect.catchCause((cause) => Effect.logWarning("lost maintenance leadership", cause))
      )
    })
  )
  return yield* term.pipe(
    // A term that fails in any other way (a duty that cannot start) must not end the election
    // loop: this fiber dies silently, and with it promotion and rescue for this process for good.
    Effect.catchCause((cause) =>
      Effect.logError("maintenance term failed; standing for election again", cause)
    ),
    Effect.andThen(Effect.sleep(config.electionIntervalMs)),
    Effect.forever,
    Effect.annotateLogs({ module: "Leader" })
  )
})
