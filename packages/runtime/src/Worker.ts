/**
 * The worker: a scoped layer that claims and runs jobs of its queues (capability 7), heartbeats
 * its long attempts (6), interrupts attempts closed elsewhere, and takes part in leader election
 * for maintenance (8).
 *
 * **Shutdown** Closing the layer's scope (or SIGINT/SIGTERM under `NodeRuntime.runMain`) stops
 * the dispatchers, lets in-flight handlers finish for up to `shutdownTimeout`, then interrupts
 * the rest (each released: runnable again at once, the attempt not counted), flushes pending finalizations and releases the leader lock.
 * Anything that could not be finalized stays open in storage and is rescued later.
 */
import { monitorEventLoopDelay } from "node:perf_hooks"
import { AwaConfigError, checkQueueName, type ValidationError } from "@awa/core"
import {
  CallbackStorage,
  type CronStorage,
  FlowStorage,
  Heartbeats,
  KeyGrants,
  type LeaderLock,
  QueueStorage,
  StorageChecks,
  StorageSignals
} from "@awa/storage"
import {
  Clock,
  Context,
  Duration,
  Effect,
  FiberSet,
  Layer,
  Option,
  Schedule,
  Stream,
  SubscriptionRef
} from "effect"
import type { SqlError } from "effect/sql"
import * as CompletionBatcher from "./CompletionBatcher.ts"
import * as ConcurrencyPermits from "./ConcurrencyPermits.ts"
import * as Cron from "./Cron.ts"
import * as Dispatcher from "./Dispatcher.ts"
import * as Executor from "./Executor.ts"
import * as FlowMetrics from "./FlowMetrics.ts"
import type { Handler } from "./Handler.ts"
import * as KeyedDispatch from "./KeyedDispatch.ts"
import * as Leader from "./Leader.ts"
import * as Progress from "./Progress.ts"
import * as QueueOverrides from "./QueueOverrides.ts"
import * as RateLimiter from "./RateLimiter.ts"

export interface QueueOptions {
  /**
   * Handlers of this queue running at once. Default 10 (1–10,000); in weighted mode
   * (`globalMaxWorkers` set) the default is no cap of its own beyond the pool.
   */
  readonly maxConcurrency?: number | undefined
  /**
   * Most jobs of this queue that start per second in this process: a token bucket of `burst`
   * tokens (0: `max(1, ceil(maxRate))`) refilled at `maxRate` a second (> 0, ≤ 100,000), shared by
   * the queue's claims in the process. Per process: N processes start up to N × `maxRate`.
   * Default none. Hot overrides can retune it (not create one).
   */
  readonly rateLimit?: { readonly maxRate: number; readonly burst?: number | undefined } | undefined
  /**
   * Most jobs of this queue claimed per second across every process (docs/adr/0036-fleet-rate-limit.md):
   * at most `burst + maxRate × W` in any window of W seconds, exact (a token bucket kept in the
   * database, migration 0043). `maxRate` > 0 and ≤ 100,000; `burst` integer 0–1,000,000 (0:
   * `max(1, ceil(maxRate))`). Every process serving the queue should set the same values (each
   * claim applies its own). With `keyPolicy`, the keyed claim takes at most the tokens there are
   * (migration 0045; the same budget as plain rated claims of the queue). Hot overrides can retune
   * it (not create one). Default none.
   */
  readonly fleetRateLimit?: { readonly maxRate: number; readonly burst?: number | undefined } | undefined
  /** Most jobs one claim takes (1–10,000). Default: what the free capacity and prefetch allow. */
  readonly claimBatchSize?: number | undefined
  /** Weighted mode only: permits reserved for this queue (0 – `globalMaxWorkers`). Default 0. */
  readonly minWorkers?: number | undefined
  /** Weighted mode only: this queue's share of the overflow permits (1–1,000). Default 1. */
  readonly weight?: number | undefined
  /**
   * Most jobs claimed ahead of free capacity, waiting in this process (0–10,000). The dispatcher
   * sizes its buffer to about two claim round trips of the queue's measured throughput, up to
   * this; 0 claims only free capacity. Default 512.
   */
  readonly prefetch?: number | undefined
  /** Claim at least this often without a wake-up. Default 200 ms (10 ms – 1 min). */
  readonly pollInterval?: Duration.Input | undefined
  /**
   * While the worker receives wake-ups (LISTEN/NOTIFY), an idle queue's poll interval doubles
   * from `pollInterval` up to this, with ±20 % jitter: the poll only covers a lost wake-up, and a
   * thousand idle queues cost a few claims a second instead of thousands. A job whose wake-up
   * was lost is picked up within 1.2 × this. Default 30 s (`pollInterval` – 10 min).
   */
  readonly idlePollMax?: Duration.Input | undefined
  /** Hard deadline per attempt; 0 = none. Default 5 min (0, or 10 ms – 7 days). */
  readonly deadline?: Duration.Input | undefined
  /** One priority level gained per interval waited; 0 disables. Default 60 s. */
  readonly priorityAgingInterval?: Duration.Input | undefined
  /** Dead-letter this queue's failed jobs (stored in the database at start; unset keeps what is stored). */
  readonly dlq?: boolean | undefined
  /** How long this queue's DLQ entries are kept (1 h – 3,650 days; unset keeps what is stored). */
  readonly dlqRetention?: Duration.Input | undefined
  /**
   * Exact per-key execution control (capabilities.md §23 tier 2): claim through this key policy
   * (created with `KeyGrants.create`, checked at start), so at most its `maxInFlight` jobs per
   * `concurrencyKey` run at once across every process. Needs the `KeyGrants` layer. Every process
   * serving the queue must set it (a process without it claims ungated). Several queues may share
   * a policy. With it, `prefetch` defaults to 0: a buffered job holds its key's grant.
   */
  readonly keyPolicy?: string | undefined
  /**
   * Approximate per-key limit in this process (tier 1): at most `limit` (1–10,000) handlers per
   * `concurrencyKey` run here at once; across the fleet up to `limit × processes`. Jobs over it
   * wait in the process (claimed, counted in `prefetch`).
   */
  readonly localKeyConcurrency?: { readonly limit: number } | undefined
}

export interface MaintenanceOptions {
  readonly electionInterval?: Duration.Input | undefined
  readonly promoteInterval?: Duration.Input | undefined
  readonly rescueInterval?: Duration.Input | undefined
  readonly rotateInterval?: Duration.Input | undefined
  /**
   * The leader rotates the queue ring once its current slot holds this many ready rows, or is
   * `rotateMaxAge` old (checked every `rotateInterval`); each rotation costs one prune, a stall of
   * claims and completions of some milliseconds. 1–10,000,000; unset keeps the storage layer's
   * value (`PgQueueStorage` option `rotateMinRows`, default 10,000).
   */
  readonly rotateMinRows?: number | undefined
  /** See `rotateMinRows`. 0–1 h; unset keeps the storage layer's value (default 10 s). */
  readonly rotateMaxAge?: Duration.Input | undefined
  /**
   * Prune leaves a sealed slot alone while one of its open attempts was claimed less than this
   * long ago, and carries long-running attempts forward after it. 0 (carry at once) – 1 h; unset
   * keeps the storage layer's value (default 5 s).
   */
  readonly pruneCarryAfter?: Duration.Input | undefined
  readonly historyInterval?: Duration.Input | undefined
  readonly completedRetention?: Duration.Input | undefined
  readonly failedRetention?: Duration.Input | undefined
  readonly cancelledRetention?: Duration.Input | undefined
  readonly promoteBatch?: number | undefined
  readonly rescueBatch?: number | undefined
  /** How often the leader deletes expired DLQ entries (batches of 1,000). Default 60 s. */
  readonly dlqCleanupInterval?: Duration.Input | undefined
  /** DLQ retention of queues without their own. Default 30 days. */
  readonly dlqRetention?: Duration.Input | undefined
  /** How often the leader evaluates cron schedules. Default 1 s (10 ms – 1 min). */
  readonly cronInterval?: Duration.Input | undefined
  /**
   * How often the leader samples per-queue figures for the rates and last-hour series of the
   * statistics (migration 0031). Default 15 s (1 s – 10 min); samples are kept 2 hours.
   */
  readonly statsSampleInterval?: Duration.Input | undefined
}

export interface WatchdogOptions {
  /**
   * Heartbeats from a thread of their own (used when the storage layers provide `Heartbeats`, as
   * `Awa.layerPg` does), so a handler blocking the event loop longer than `heartbeatStaleness`
   * does not get this process's attempts rescued. Default true. The worker starts claiming once
   * the thread is connected (about a second of CPU to load it; ADR 0019). The thread belongs to
   * the `Heartbeats` layer: a worker started later on the same layer reuses it. `false`:
   * heartbeats on the event loop and the application's pool.
   */
  readonly thread?: boolean | undefined
  /** Event-loop delay that logs a stall warning. Default 1 s. */
  readonly stallWarning?: Duration.Input | undefined
  /**
   * After the event loop has not ticked for this long, the heartbeat thread stops vouching for
   * the process, so a process that never recovers is rescued. Default 10 min (1 s – 1 day).
   */
  readonly maxStall?: Duration.Input | undefined
}

export interface WorkerOptions<R> {
  readonly queues: Readonly<Record<string, QueueOptions>>
  /**
   * Weighted mode: one pool of this many permits (claimed attempts, 1–100,000) shared by the
   * queues, each with its `minWorkers` floor and a `weight` share of the rest. Unset: each queue
   * has its own `maxConcurrency` (hard-reserved mode). Σ `minWorkers` must not exceed it.
   */
  readonly globalMaxWorkers?: number | undefined
  /**
   * How often this worker re-reads its queues' hot overrides from the database (one query per
   * interval, never per poll). Default 10 s (50 ms – 1 h).
   */
  readonly overrideRefreshInterval?: Duration.Input | undefined
  readonly handlers: ReadonlyArray<Handler<R>>
  /** Heartbeat of attempts older than one interval. Default 30 s (100 ms – 10 min). */
  readonly heartbeatInterval?: Duration.Input | undefined
  /** Attempts silent this long are rescued by the leader. Default 90 s; must exceed the interval. */
  readonly heartbeatStaleness?: Duration.Input | undefined
  /** How long shutdown waits for in-flight handlers before interrupting them. Default 30 s. */
  readonly shutdownTimeout?: Duration.Input | undefined
  /**
   * Largest progress (percent, message and metadata) a handler may set, in UTF-8 bytes of its
   * JSON; more ⇒ `ProgressTooLarge`. Default 65,536 (1,024 – 1,048,576).
   */
  readonly maxProgressBytes?: number | undefined
  /**
   * A claimed job whose kind has no handler here: retry it with backoff (default), or fail it.
   * Claiming is by queue, not kind, so during a rolling deploy a worker of the old version claims
   * jobs of a kind only the new one knows; retrying hands them on (docs/adr/0020).
   */
  readonly onUnknownKind?: "fail" | "retry" | undefined
  /**
   * A consumer span per attempt, child of (or linked to) the producer span. Under Effect's default
   * tracer (none installed) only for a job that carries a traceparent (ADR 0043). Off: no span at
   * all. Default true.
   */
  readonly tracing?: boolean | undefined
  /**
   * Spans of the worker's background loops: each claim (`awa.claim <queue>`), the leader's
   * election and each maintenance tick (`awa.maintenance <duty>`), with their queries as
   * children. Default false: an idle worker polls several times a second, and each poll would be
   * a root span in the application's tracing backend. Job spans are not affected.
   */
  readonly backgroundSpans?: boolean | undefined
  /** Event-loop delay that logs a stall warning. Default 1 s. Same as `watchdog.stallWarning`. */
  readonly stallWarning?: Duration.Input | undefined
  /**
   * Heartbeats that survive a blocked event loop (capabilities.md §6). By default, on Postgres
   * (`Awa.layerPg`), heartbeats are written by a worker thread with its own connection, so a
   * handler doing CPU-bound work does not get this process's attempts rescued as dead.
   */
  readonly watchdog?: WatchdogOptions | undefined
  readonly completion?: CompletionBatcher.CompletionBatcherOptions | undefined
  /**
   * Dead-letter failed jobs of queues without their own `dlq` setting. Stored in the database at
   * start, for every process; unset keeps what is stored (initially false).
   */
  readonly dlqEnabledByDefault?: boolean | undefined
  /**
   * Cron schedules this deployment declares (`Cron.schedule`), checked when the layer is built and
   * upserted at start; stored schedules not in the list are logged as stale. Unset: none declared
   * and none reported (the leader still fires every stored schedule).
   */
  readonly cron?: ReadonlyArray<Cron.CronSchedule> | undefined
  /** Take part in leader election and run maintenance when elected (default), or not (`false`). */
  readonly maintenance?: MaintenanceOptions | false | undefined
}

export class Worker extends Context.Service<
  Worker,
  {
    /** True while this worker holds the maintenance leadership. */
    readonly isLeader: SubscriptionRef.SubscriptionRef<boolean>
    /** Attempts running in this process. */
    readonly running: Effect.Effect<number>
    /** Weighted mode's pool (mode, floors, weights, permits and overflow held); undefined when hard-reserved. */
    readonly permits: Effect.Effect<ConcurrencyPermits.PoolSnapshot | undefined>
  }
>()("@awa/runtime/Worker") {}

interface Issue {
  readonly path: string
  readonly reason: string
}

const day = 86_400_000

/** Reads a duration option, recording an issue when it is not in range. */
const durationMs = (
  issues: Array<Issue>,
  path: string,
  input: Duration.Input | undefined,
  fallback: number,
  min: number,
  max: number,
  zeroAllowed = false
): number => {
  if (input === undefined) return fallback
  const decoded = Duration.fromInput(input)
  const ms = decoded._tag === "Some" ? Duration.toMillis(decoded.value) : Number.NaN
  if (zeroAllowed && ms === 0) return 0
  if (!(ms >= min && ms <= max))
    issues.push({ path, reason: `must be ${zeroAllowed ? "0 or " : ""}${min} ms – ${max} ms` })
  return ms
}

const integer = (
  issues: Array<Issue>,
  path: string,
  value: number | undefined,
  fallback: number,
  min: number,
  max: number
) => {
  if (value === undefined) return fallback
  if (!(Number.isInteger(value) && value >= min && value <= max))
    issues.push({ path, reason: `must be an integer ${min}–${max}` })
  return value
}

/** An optional duration handed to storage as whole milliseconds in `range`; unset stays unset. */
const wholeMs = (
  issues: Array<Issue>,
  path: string,
  input: Duration.Input | undefined,
  range: { readonly min: number; readonly max: number }
): number | undefined => {
  if (input === undefined) return undefined
  const ms = durationMs(issues, path, input, 0, range.min, range.max)
  if (Number.isFinite(ms) && !Number.isInteger(ms))
    issues.push({ path, reason: "must be a whole number of milliseconds" })
  return ms
}

/** Checks every option; all violations are reported together. */
export const resolveConfig = <R>(options: WorkerOptions<R>) =>
  Effect.gen(function* () {
    const issues: Array<Issue> = []
    const queues: Array<Dispatcher.DispatcherConfig> = []
    const flows: Array<{
      readonly base: QueueOverrides.QueueBase
      readonly weight: ConcurrencyPermits.QueueWeight
    }> = []
    const weighted = options.globalMaxWorkers !== undefined
    const globalMaxWorkers = integer(issues, "globalMaxWorkers", options.globalMaxWorkers, 0, 1, 100_000)
    const queueSettings: Array<{
      readonly queue: string
      readonly dlq: boolean | undefined
      readonly dlqRetentionMs: number | undefined
    }> = []
    for (const [queue, q] of Object.entries(options.queues)) {
      const name = yield* Effect.result(checkQueueName(queue))
      if (name._tag === "Failure") issues.push({ path: `queues.${queue}`, reason: name.failure.reason })
      const pollIntervalMs = durationMs(
        issues,
        `queues.${queue}.pollInterval`,
        q.pollInterval,
        200,
        10,
        60_000
      )
      const maxConcurrency = integer(
        issues,
        `queues.${queue}.maxConcurrency`,
        q.maxConcurrency,
        weighted ? Math.min(10_000, globalMaxWorkers) : 10,
        1,
        10_000
      )
      const rateReason = q.rateLimit === undefined ? undefined : RateLimiter.invalidReason(q.rateLimit)
      if (rateReason !== undefined) issues.push({ path: `queues.${queue}.rateLimit`, reason: rateReason })
      const fleetReason =
        q.fleetRateLimit === undefined
          ? undefined
          : (RateLimiter.invalidReason(q.fleetRateLimit) ??
            ((q.fleetRateLimit.burst ?? 0) > FlowStorage.fleetRateLimits.maxBurst
              ? `burst must be at most ${FlowStorage.fleetRateLimits.maxBurst}`
              : undefined))
      if (fleetReason !== undefined)
        issues.push({ path: `queues.${queue}.fleetRateLimit`, reason: fleetReason })
      const claimBatchSize =
        q.claimBatchSize === undefined
          ? undefined
          : integer(issues, `queues.${queue}.claimBatchSize`, q.claimBatchSize, 0, 1, 10_000)
      if (!weighted && (q.minWorkers !== undefined || q.weight !== undefined))
        issues.push({
          path: `queues.${queue}`,
          reason: "minWorkers and weight need globalMaxWorkers (weighted mode)"
        })
      const minWorkers = integer(issues, `queues.${queue}.minWorkers`, q.minWorkers, 0, 0, 100_000)
      const weight = integer(issues, `queues.${queue}.weight`, q.weight, 1, 1, 1000)
      const deadlineMs = durationMs(
        issues,
        `queues.${queue}.deadline`,
        q.deadline,
        300_000,
        10,
        7 * day,
        true
      )
      flows.push({
        base: {
          queue,
          pollIntervalMs,
          claimBatchSize,
          deadlineMs,
          rateLimit:
            q.rateLimit === undefined
              ? undefined
              : { maxRate: q.rateLimit.maxRate, burst: q.rateLimit.burst ?? 0 },
          fleetRate:
            q.fleetRateLimit === undefined
              ? undefined
              : { maxRate: q.fleetRateLimit.maxRate, burst: q.fleetRateLimit.burst ?? 0 }
        },
        weight: { queue, minWorkers, weight }
      })
      queues.push({
        queue,
        maxConcurrency,
        prefetch: integer(
          issues,
          `queues.${queue}.prefetch`,
          q.prefetch,
          q.keyPolicy === undefined ? 512 : 0,
          0,
          10_000
        ),
        pollIntervalMs,
        idlePollMaxMs: Math.max(
          pollIntervalMs,
          durationMs(issues, `queues.${queue}.idlePollMax`, q.idlePollMax, 30_000, 10, 600_000)
        ),
        deadlineMs,
        agingIntervalMs: durationMs(
          issues,
          `queues.${queue}.priorityAgingInterval`,
          q.priorityAgingInterval,
          60_000,
          1000,
          day,
          true
        ),
        backgroundSpans: options.backgroundSpans ?? false,
        keyPolicy: q.keyPolicy,
        fleetRate:
          q.fleetRateLimit === undefined
            ? undefined
            : { maxRate: q.fleetRateLimit.maxRate, burst: q.fleetRateLimit.burst ?? 0 },
        localKeyLimit:
          q.localKeyConcurrency === undefined
            ? undefined
            : integer(
                issues,
                `queues.${queue}.localKeyConcurrency.limit`,
                q.localKeyConcurrency.limit,
                1,
                1,
                10_000
              )
      })
      if (q.keyPolicy !== undefined && (typeof q.keyPolicy !== "string" || q.keyPolicy.length === 0))
        issues.push({ path: `queues.${queue}.keyPolicy`, reason: "must be a policy id" })
      queueSettings.push({
        queue,
        dlq: q.dlq,
        dlqRetentionMs:
          q.dlqRetention === undefined
            ? undefined
            : durationMs(issues, `queues.${queue}.dlqRetention`, q.dlqRetention, 0, 3_600_000, 3650 * day)
      })
    }
    if (queues.length === 0) issues.push({ path: "queues", reason: "at least one queue is required" })
    const floors = flows.reduce((sum, f) => sum + f.weight.minWorkers, 0)
    if (weighted && floors > globalMaxWorkers)
      issues.push({ path: "globalMaxWorkers", reason: `must be at least the sum of minWorkers (${floors})` })
    const overrideRefreshMs = durationMs(
      issues,
      "overrideRefreshInterval",
      options.overrideRefreshInterval,
      10_000,
      50,
      3_600_000
    )
    const kinds = new Set<string>()
    for (const h of options.handlers) {
      if (kinds.has(h.definition.kind))
        issues.push({ path: `handlers.${h.definition.kind}`, reason: "declared twice" })
      kinds.add(h.definition.kind)
    }
    const heartbeatIntervalMs = durationMs(
      issues,
      "heartbeatInterval",
      options.heartbeatInterval,
      30_000,
      100,
      600_000
    )
    const heartbeatStalenessMs = durationMs(
      issues,
      "heartbeatStaleness",
      options.heartbeatStaleness,
      90_000,
      100,
      day
    )
    if (heartbeatStalenessMs <= heartbeatIntervalMs) {
      issues.push({ path: "heartbeatStaleness", reason: "must exceed heartbeatInterval" })
    }
    const m = options.maintenance === false ? undefined : (options.maintenance ?? {})
    const maintenance: Leader.MaintenanceConfig | undefined =
      m === undefined
        ? undefined
        : {
            electionIntervalMs: durationMs(
              issues,
              "maintenance.electionInterval",
              m.electionInterval,
              5000,
              10,
              600_000
            ),
            promoteIntervalMs: durationMs(
              issues,
              "maintenance.promoteInterval",
              m.promoteInterval,
              250,
              10,
              600_000
            ),
            promoteBatch: integer(issues, "maintenance.promoteBatch", m.promoteBatch, 4096, 1, 100_000),
            rescueIntervalMs: durationMs(
              issues,
              "maintenance.rescueInterval",
              m.rescueInterval,
              30_000,
              10,
              600_000
            ),
            rescueBatch: integer(issues, "maintenance.rescueBatch", m.rescueBatch, 500, 1, 10_000),
            heartbeatStalenessMs,
            rotateIntervalMs: durationMs(
              issues,
              "maintenance.rotateInterval",
              m.rotateInterval,
              1000,
              10,
              60_000
            ),
            rotate: {
              minRows:
                m.rotateMinRows === undefined
                  ? undefined
                  : integer(
                      issues,
                      "maintenance.rotateMinRows",
                      m.rotateMinRows,
                      0,
                      StorageChecks.rotateMinRowsRange.min,
                      StorageChecks.rotateMinRowsRange.max
                    ),
              maxAgeMs: wholeMs(
                issues,
                "maintenance.rotateMaxAge",
                m.rotateMaxAge,
                StorageChecks.rotateMaxAgeMsRange
              )
            },
            pruneCarryAfterMs: wholeMs(
              issues,
              "maintenance.pruneCarryAfter",
              m.pruneCarryAfter,
              StorageChecks.pruneCarryAfterMsRange
            ),
            historyIntervalMs: durationMs(
              issues,
              "maintenance.historyInterval",
              m.historyInterval,
              60_000,
              10,
              day
            ),
            dlqCleanupIntervalMs: durationMs(
              issues,
              "maintenance.dlqCleanupInterval",
              m.dlqCleanupInterval,
              60_000,
              10,
              day
            ),
            dlqRetentionMs: durationMs(
              issues,
              "maintenance.dlqRetention",
              m.dlqRetention,
              30 * day,
              3_600_000,
              3650 * day
            ),
            cronIntervalMs: durationMs(issues, "maintenance.cronInterval", m.cronInterval, 1000, 10, 60_000),
            statsSampleIntervalMs: durationMs(
              issues,
              "maintenance.statsSampleInterval",
              m.statsSampleInterval,
              15_000,
              1000,
              600_000
            ),
            retention: {
              completedMs: durationMs(
                issues,
                "maintenance.completedRetention",
                m.completedRetention,
                day,
                0,
                365 * day,
                true
              ),
              failedMs: durationMs(
                issues,
                "maintenance.failedRetention",
                m.failedRetention,
                3 * day,
                0,
                365 * day,
                true
              ),
              cancelledMs: durationMs(
                issues,
                "maintenance.cancelledRetention",
                m.cancelledRetention,
                3 * day,
                0,
                365 * day,
                true
              )
            }
          }
    const shutdownTimeoutMs = durationMs(
      issues,
      "shutdownTimeout",
      options.shutdownTimeout,
      30_000,
      0,
      day,
      true
    )
    const stallWarningMs = durationMs(
      issues,
      options.watchdog?.stallWarning === undefined ? "stallWarning" : "watchdog.stallWarning",
      options.watchdog?.stallWarning ?? options.stallWarning,
      1000,
      1,
      600_000
    )
    const maxStallMs = durationMs(issues, "watchdog.maxStall", options.watchdog?.maxStall, 600_000, 1000, day)
    const maxProgressBytes = integer(
      issues,
      "maxProgressBytes",
      options.maxProgressBytes,
      Progress.maxBytesRange.default,
      Progress.maxBytesRange.min,
      Progress.maxBytesRange.max
    )
    const cron = options.cron === undefined ? undefined : yield* Cron.resolve(options.cron, issues)
    if (issues.length > 0) return yield* new AwaConfigError({ issues })
    return {
      queues,
      flows,
      globalMaxWorkers: weighted ? globalMaxWorkers : undefined,
      overrideRefreshMs,
      queueSettings,
      heartbeatIntervalMs,
      maintenance,
      shutdownTimeoutMs,
      stallWarningMs,
      maxStallMs,
      heartbeatThread: options.watchdog?.thread ?? true,
      maxProgressBytes,
      cron
    }
  })

export const make = Effect.fnUntraced(function* <R>(options: WorkerOptions<R>) {
  const config = yield* resolveConfig(options)
  const storage = yield* QueueStorage
  const signals = yield* StorageSignals.StorageSignals
  const isLeader = yield* SubscriptionRef.make(false)

  // Settings every process must agree on live in the database; a worker writes only what it sets.
  if (options.dlqEnabledByDefault !== undefined) yield* storage.setDlqDefault(options.dlqEnabledByDefault)
  for (const q of config.queueSettings) {
    if (q.dlq !== undefined || q.dlqRetentionMs !== undefined) {
      yield* storage.configureQueue(q.queue, {
        ...(q.dlq === undefined ? {} : { dlq: q.dlq }),
        ...(q.dlqRetentionMs === undefined ? {} : { dlqRetentionMs: q.dlqRetentionMs })
      })
    }
  }
  if (config.cron !== undefined) yield* Cron.declare(config.cron)

  // Heartbeats first, so they stop last: an attempt is heartbeated until its outcome is durable.
  const heartbeatOptions = { intervalMs: config.heartbeatIntervalMs, maxStallMs: config.maxStallMs }
  const threads = config.heartbeatThread
    ? Option.getOrUndefined(yield* Effect.serviceOption(Heartbeats.Heartbeats))
    : undefined
  const heartbeats =
    threads === undefined
      ? yield* Heartbeats.makeLoop(heartbeatOptions)
      : yield* threads.start(heartbeatOptions)
  /** Background loops emit no spans unless `backgroundSpans` (a disabled tracer stays disabled). */
  const background = <A, E, R2>(effect: Effect.Effect<A, E, R2>) =>
    options.backgroundSpans === true ? effect : Effect.withTracerEnabled(effect, false)

  // Finalizers run in reverse: dispatchers stop first, then the drain, then the FiberSet
  // interrupts stragglers, and the batcher flushes last.
  // its flushers are forked here: one finalize query per batch, not a root span each
  const batcher = yield* background(CompletionBatcher.make(options.completion))
  const fibers = yield* FiberSet.make<unknown, unknown>()
  // After the drain, the FiberSet interrupts what still runs: those attempts are released.
  let shuttingDown = false
  yield* Effect.addFinalizer(() =>
    FiberSet.awaitEmpty(fibers).pipe(
      Effect.timeoutOption(config.shutdownTimeoutMs),
      Effect.ensuring(
        Effect.sync(() => {
          shuttingDown = true
        })
      ),
      Effect.asVoid
    )
  )
  // Closures of keyed attempts wake the gated claimers of every queue under their key policy: this
  // process's in memory, other processes' while one of them says it waits (ADR 0037; the
  // notifier runs below).
  const policyOf = new Map(
    config.queues.flatMap((q) => (q.keyPolicy === undefined ? [] : [[q.queue, q.keyPolicy]]))
  )
  const queuesUnder = new Map<string, Array<string>>() // per policy, its queues here
  for (const [queue, policy] of policyOf) {
    const queues = queuesUnder.get(policy)
    if (queues === undefined) queuesUnder.set(policy, [queue])
    else queues.push(queue)
  }
  const closures = yield* KeyedDispatch.makeClosureNotifier
  const gatedAnnouncer = yield* KeyedDispatch.makeGatedAnnouncer
  if (queuesUnder.size > 0) {
    const grants = yield* Effect.serviceOption(KeyGrants)
    if (Option.isNone(grants))
      return yield* new AwaConfigError({
        issues: [{ path: "queues", reason: "keyPolicy needs the KeyGrants layer (Awa.layerPg provides it)" }]
      })
    // fail fast on a policy nobody created
    for (const q of config.queues)
      if (q.keyPolicy !== undefined)
        yield* grants.value.show(q.keyPolicy).pipe(
          Effect.catchTag("KeyPolicyNotFound", (e) =>
            Effect.fail(
              new AwaConfigError({ issues: [{ path: `queues.${q.queue}.keyPolicy`, reason: e.message }] })
            )
          ),
          // show reads one row: it never refuses an isolation level
          Effect.catchTag("ReadCommittedRequired", Effect.die)
        )
  }
  const executor = yield* Executor.make<R>({
    onApplied: (job) => {
      const policy = policyOf.get(job.queue)
      if (policy !== undefined && KeyedDispatch.keyOf(job) !== undefined) closures.closed(policy)
    },
    handlers: new Map(options.handlers.map((h) => [h.definition.kind, h])),
    onUnknownKind: options.onUnknownKind ?? "retry",
    batcher,
    shuttingDown: () => shuttingDown,
    tracing: options.tracing ?? true,
    maxProgressBytes: config.maxProgressBytes,
    heartbeats,
    callbacks: Option.getOrUndefined(yield* Effect.serviceOption(CallbackStorage))
  })
  yield* Effect.forkScoped(executor.deadlines)
  const dispatchers = new Map<string, Dispatcher.Dispatcher<R>>()
  // Set while the listener is subscribed: dispatchers then let idle polls back off, and say which
  // queues wait for wake-ups through the subscription's waiters (migration 0051; none: the
  // wake-ups need no registration, as in the simulation).
  let listening = false
  let waiters: StorageSignals.Waiters | undefined
  const wakes: Dispatcher.WakeSource = {
    listening: () => listening,
    waitFor: (queue) =>
      waiters !== undefined ? waiters.waitFor(queue) : Effect.succeed(listening ? "Held" : "Unavailable"),
    stopWaiting: (queue) => (waiters === undefined ? Effect.void : waiters.stopWaiting(queue))
  }
  // Flow control (docs/adr/0028-flow-control.md): live settings per queue, the weighted pool.
  const flowMetrics = yield* FlowMetrics.makeRecorder
  const startedAt = yield* Clock.currentTimeMillis
  const lives = config.flows.map((f) => ({
    base: f.base,
    live: QueueOverrides.liveSettings(f.base, startedAt)
  }))
  const pool =
    config.globalMaxWorkers === undefined
      ? undefined
      : yield* ConcurrencyPermits.make(
          config.globalMaxWorkers,
          config.flows.map((f) => f.weight)
        )
  yield* startOverrideRefresh(lives, config.overrideRefreshMs)
  if (pool !== undefined)
    yield* Effect.sync(() => flowMetrics.permits(pool.snapshot())).pipe(
      Effect.repeat(Schedule.spaced(1000)),
      Effect.forkScoped
    )
  for (const [i, queue] of config.queues.entries()) {
    const dispatcher = yield* Dispatcher.make(queue, fibers, executor, wakes, {
      live: lives[i]!.live,
      permits: pool?.share(queue.queue),
      metrics: flowMetrics,
      announceGated:
        queue.keyPolicy === undefined ? undefined : gatedAnnouncer.announce(queue.keyPolicy, queue.queue)
    })
    dispatchers.set(queue.queue, dispatcher)
    // Registered before the loop is forked, so it runs after the loop is interrupted.
    yield* Effect.addFinalizer(() => dispatcher.stop)
    yield* Effect.forkScoped(dispatcher.loop)
  }

  // Closures of keyed attempts: this process's dispatchers of the policy at once, others' when one
  // waits (ADR 0037).
  const closedUnder = (policy: string) =>
    Effect.forEach(queuesUnder.get(policy) ?? [], (q) => dispatchers.get(q)?.closed ?? Effect.void, {
      discard: true
    })
  if (queuesUnder.size > 0) yield* Effect.forkScoped(background(closures.run(closedUnder)))

  // Wake-ups and cancel broadcasts; re-subscribes after a lost listener connection.
  yield* signals.signals.pipe(
    Stream.runForEach((signal) =>
      signal._tag === "Wake"
        ? (dispatchers.get(signal.queue)?.wake ?? Effect.void)
        : signal._tag === "Closed"
          ? closedUnder(signal.policy)
          : signal._tag === "Gated"
            ? closures.gatedSeen(signal.policy)
            : signal._tag === "Cancel"
              ? executor.interrupt(signal.token.jobId, signal.token.runLease)
              : signal._tag === "Resumed"
                ? Effect.andThen(
                    executor.wakeCallback(signal.token.jobId, signal.token.runLease),
                    dispatchers.get(signal.queue)?.resumed ?? Effect.void
                  )
                : // (re)subscribed: wake-ups sent while nobody listened were lost, so look now
                  Effect.suspend(() => {
                    listening = true
                    waiters = signal.waiters
                    return Effect.forEach(dispatchers.values(), (d) => d.wake, { discard: true })
                  })
    ),
    Effect.ensuring(
      Effect.sync(() => {
        listening = false
        waiters = undefined
      })
    ),
    Effect.catchCause((cause) => Effect.logWarning("notification listener lost; re-subscribing", cause)),
    Effect.andThen(Effect.sleep(1000)),
    Effect.forever,
    Effect.annotateLogs({ module: "Worker", fiber: "listener" }),
    background,
    Effect.forkScoped
  )

  // Attempts a heartbeat found closed elsewhere (cancelled, rescued) are interrupted.
  yield* heartbeats.closed.pipe(
    Stream.runForEach((token) => executor.interrupt(token.jobId, token.runLease)),
    Effect.annotateLogs({ module: "Worker", fiber: "heartbeat" }),
    Effect.forkScoped
  )

  const stallEffect =
    heartbeats.mode === "thread"
      ? "claims and completions were delayed (heartbeats continued on their thread)"
      : "heartbeats and claims were delayed"
  // Event-loop stalls starve every fiber (heartbeats too when they run on the loop): measure and warn.
  const delay = monitorEventLoopDelay({ resolution: 20 })
  delay.enable()
  yield* Effect.addFinalizer(() => Effect.sync(() => delay.disable()))
  yield* Effect.sync(() => {
    const maxMs = delay.max / 1e6
    delay.reset()
    return maxMs
  }).pipe(
    Effect.flatMap((maxMs) =>
      maxMs >= config.stallWarningMs
        ? Effect.logWarning(`event loop stalled for ${Math.round(maxMs)} ms; ${stallEffect}`)
        : Effect.void
    ),
    Effect.repeat(Schedule.spaced(Math.max(config.stallWarningMs, 1000))),
    Effect.forkScoped
  )

  if (config.maintenance !== undefined)
    // the election and the duties poll all the time: untraced unless asked for
    yield* Effect.forkScoped(background(Leader.run(config.maintenance, isLeader)))

  return Worker.of({
    isLeader,
    running: Effect.sync(() => executor.running.size),
    permits: Effect.sync(() => pool?.snapshot())
  })
})

/**
 * Re-reads the queues' hot overrides every `intervalMs`, first at once (so a worker starts with
 * the fleet's current set). Without `FlowStorage` (a hand-built storage stack) there are none to
 * read: logged once at debug level. A failed read is logged and the last set stays in force.
 */
const startOverrideRefresh = (
  lives: ReadonlyArray<{
    readonly base: QueueOverrides.QueueBase
    readonly live: QueueOverrides.LiveSettings
  }>,
  intervalMs: number
) =>
  Effect.gen(function* () {
    const flow = yield* Effect.serviceOption(FlowStorage.FlowStorage)
    if (flow._tag === "None")
      return yield* Effect.logDebug("no FlowStorage in the storage layers: hot queue overrides are not read")
    const reported = new Map<string, string>()
    const once = QueueOverrides.refresh(lives, reported).pipe(
      Effect.provideService(FlowStorage.FlowStorage, flow.value),
      Effect.catchCause((cause) =>
        Effect.logWarning("reading queue overrides failed; keeping the last set", cause)
      ),
      Effect.withTracerEnabled(false),
      Effect.annotateLogs({ module: "Worker", fiber: "overrides" })
    )
    // before the dispatchers start, so the first claim already sees the fleet's overrides
    yield* once
    yield* Effect.sleep(intervalMs).pipe(Effect.andThen(once), Effect.forever, Effect.forkScoped)
  })

/** The worker layer; `R` is what the handlers need, supplied by the application's layers. */
export const layer = <R>(
  options: WorkerOptions<R>
): Layer.Layer<
  Worker,
  AwaConfigError | ValidationError | SqlError.SqlError,
  QueueStorage | StorageSignals.StorageSignals | LeaderLock.LeaderLock | CronStorage.CronStorage | R
> => Layer.effect(Worker, make(options))
