/**
 * `FlowStorage`: what flow control reads and writes in the database (issue 20; capabilities.md
 * §13, §25; docs/adr/0028-flow-control.md): a queue's capped depth and its hot overrides.
 *
 * - `depth(queue, cap)` is the capped count of storage-engine.md §9: `min(depth, cap)` at a cost
 *   bounded by `cap` (SQL `queue_depth`, migration 0032), never an exact count of the backlog.
 * - Overrides are one jsonb value per queue in `queue_meta.overrides`. This service stores and
 *   returns them as given: their meaning, ranges and validation belong to the runtime
 *   (`@awa/runtime` `QueueOverrides`), which validates what it writes and ignores (with a log
 *   line) what someone wrote around it in SQL.
 *
 * - `claimRated` is the claim of a queue under a fleet-wide rate limit (migration 0043,
 *   docs/adr/0036-fleet-rate-limit.md): at most `burst + maxRate × W` jobs of the queue in any
 *   window of W seconds, over every claimer that shares this storage (the database, or the
 *   simulation's process). With no token left it claims nothing and says when the next is due.
 *   A keyed queue under the same limit claims through `KeyGrants.claim` with `rate` (migration
 *   0045), from the same budget.
 *
 * Two layers with the same semantics: `layerPg` and `layerSim` (in memory; its depth is the
 * simulation's available count, capped).
 */
import { checkQueueName, type ReadCommittedRequired, ValidationError } from "@awa/core"
import { Migrations } from "@awa/sql"
import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient, type SqlError } from "effect/sql"
import { type ClaimRow, claimedJobsOf } from "./PgQueueStorage.ts"
import { type ClaimedJob, type ClaimParams, QueueStorage } from "./QueueStorage.ts"
import * as ReadCommitted from "./ReadCommitted.ts"
import * as SimRate from "./SimRate.ts"
import { checkInteger, maxClaimBatch } from "./StorageChecks.ts"

/** A capped count: `count` = min(depth, cap); `capped` = the depth is at least `cap`. */
export interface CappedDepth {
  readonly count: number
  readonly capped: boolean
}

/** A fleet-wide rate limit: `maxRate` jobs a second, after a `burst` (0 = max(1, ceil(maxRate))). */
export interface FleetRate {
  readonly maxRate: number
  readonly burst: number
}

/** Limits of `FleetRate` (as the per-process limiter's, capabilities.md §12). */
export const fleetRateLimits = { maxRate: 100_000, maxBurst: 1_000_000 } as const

/**
 * What a rated claim took, and when the next token is due if the rate cut it short of `max`
 * (no token at all: no jobs). Undefined: the tokens did not limit it.
 */
export interface RatedClaim {
  readonly jobs: ReadonlyArray<ClaimedJob>
  readonly nextTokenAt: Date | undefined
}

/** One queue's stored overrides, as stored (not validated). */
export interface StoredOverrides {
  readonly queue: string
  readonly overrides: Readonly<Record<string, unknown>>
  readonly updatedAt: Date
}

/** Largest cap a depth count accepts (the backpressure limit's range, plus one). */
export const maxDepthCap = 1_000_001

export class FlowStorage extends Context.Service<
  FlowStorage,
  {
    /** The queue's claimable jobs, counted up to `cap` (1 – 1,000,001). */
    readonly depth: (
      queue: string,
      cap: number
    ) => Effect.Effect<CappedDepth, ValidationError | SqlError.SqlError>
    /** Replaces the queue's overrides with `overrides` (a JSON object). */
    readonly setOverrides: (
      queue: string,
      overrides: Readonly<Record<string, unknown>>
    ) => Effect.Effect<void, ValidationError | SqlError.SqlError>
    /** Removes the queue's overrides; true when it had some. */
    readonly clearOverrides: (queue: string) => Effect.Effect<boolean, ValidationError | SqlError.SqlError>
    /** Stored overrides of the given queues (every queue that has some when unset), by queue name. */
    readonly getOverrides: (
      queues?: ReadonlyArray<string>
    ) => Effect.Effect<ReadonlyArray<StoredOverrides>, SqlError.SqlError>
    /** Claims up to `max` jobs of the queue within its fleet-wide rate (`rate`). */
    readonly claimRated: (
      params: ClaimParams & { readonly rate: FleetRate }
    ) => Effect.Effect<RatedClaim, ValidationError | ReadCommittedRequired | SqlError.SqlError>
  }
>()("@awa/storage/FlowStorage") {}

const checkCap = (cap: number) =>
  Number.isInteger(cap) && cap >= 1 && cap <= maxDepthCap
    ? Effect.void
    : Effect.fail(new ValidationError({ field: "cap", reason: `must be an integer 1–${maxDepthCap}` }))

const checkObject = (overrides: unknown) =>
  typeof overrides === "object" && overrides !== null && !Array.isArray(overrides)
    ? Effect.void
    : Effect.fail(new ValidationError({ field: "overrides", reason: "must be an object" }))

/** A `FleetRate` in range, or a `ValidationError` naming the field. */
export const checkFleetRate = (rate: FleetRate) =>
  Number.isFinite(rate.maxRate) && rate.maxRate > 0 && rate.maxRate <= fleetRateLimits.maxRate
    ? checkInteger("fleetRateLimit.burst", rate.burst, 0, fleetRateLimits.maxBurst)
    : Effect.fail(
        new ValidationError({
          field: "fleetRateLimit.maxRate",
          reason: `must be > 0 and ≤ ${fleetRateLimits.maxRate} (got ${rate.maxRate})`
        })
      )

const checkRatedClaim = (params: ClaimParams & { readonly rate: FleetRate }) =>
  Effect.andThen(
    Effect.andThen(checkQueueName(params.queue), checkInteger("max", params.max, 0, maxClaimBatch)),
    checkFleetRate(params.rate)
  )

const byName = (a: StoredOverrides, b: StoredOverrides) =>
  a.queue < b.queue ? -1 : a.queue > b.queue ? 1 : 0

export const makePg = Effect.fnUntraced(function* (options: { readonly schema?: string | undefined } = {}) {
  const sql = yield* SqlClient.SqlClient
  const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
  const s = sql(schema)

  const depth = (queue: string, cap: number) =>
    Effect.gen(function* () {
      yield* checkQueueName(queue)
      yield* checkCap(cap)
      const rows = yield* sql<{ n: bigint }>`SELECT ${s}.queue_depth(${queue}, ${cap}) AS n`
      const count = Number(rows[0]!.n)
      return { count, capped: count >= cap }
    })

  // One row per operator call; the whole set is replaced (§13: set replaces, it does not merge).
  const setOverrides = (queue: string, overrides: Readonly<Record<string, unknown>>) =>
    Effect.gen(function* () {
      yield* checkQueueName(queue)
      yield* checkObject(overrides)
      yield* sql`
        INSERT INTO ${s}.queue_meta (queue, overrides) VALUES (${queue}, ${JSON.stringify(overrides)}::jsonb)
        ON CONFLICT (queue) DO UPDATE SET overrides = excluded.overrides, updated_at = now()`
    })

  const clearOverrides = (queue: string) =>
    Effect.gen(function* () {
      yield* checkQueueName(queue)
      const rows = yield* sql<{ queue: string }>`
        UPDATE ${s}.queue_meta SET overrides = NULL, updated_at = now()
        WHERE queue = ${queue} AND overrides IS NOT NULL RETURNING queue`
      return rows.length > 0
    })

  const getOverrides = (queues?: ReadonlyArray<string>) =>
    Effect.map(
      queues === undefined
        ? sql<{ queue: string; overrides: unknown; updated_at: Date }>`
            SELECT queue, overrides, updated_at FROM ${s}.queue_meta WHERE overrides IS NOT NULL ORDER BY queue`
        : sql<{ queue: string; overrides: unknown; updated_at: Date }>`
            SELECT queue, overrides, updated_at FROM ${s}.queue_meta
            WHERE overrides IS NOT NULL AND queue = ANY(${[...queues]}::text[]) ORDER BY queue`,
      (rows) =>
        rows.map((r) => ({
          queue: r.queue,
          // a non-object written in SQL is handed on as an empty set's stand-in for the runtime to report
          overrides: (typeof r.overrides === "object" && r.overrides !== null && !Array.isArray(r.overrides)
            ? r.overrides
            : { invalid: r.overrides }) as Readonly<Record<string, unknown>>,
          updatedAt: r.updated_at
        }))
    )

  const rc = ReadCommitted.make(sql)
  const claimRated = (params: ClaimParams & { readonly rate: FleetRate }) =>
    Effect.gen(function* () {
      yield* checkRatedClaim(params)
      const rows = yield* rc(
        "claimRated",
        sql<ClaimRow & { next_token_at: Date | null }>`
          SELECT * FROM ${s}.claim_rated(${params.queue}, ${params.max}, ${params.deadlineMs}::bigint,
            ${params.agingIntervalMs}::bigint, ${params.rate.maxRate}::float8, ${params.rate.burst})`
      )
      if (rows.length === 1 && rows[0]!.job_id === null)
        return { jobs: [], nextTokenAt: rows[0]!.next_token_at ?? undefined }
      return { jobs: claimedJobsOf(rows), nextTokenAt: rows[0]?.next_token_at ?? undefined }
    })

  return FlowStorage.of({ depth, setOverrides, clearOverrides, getOverrides, claimRated })
})

export const layerPg = (options: { readonly schema?: string | undefined } = {}) =>
  Layer.effect(FlowStorage, makePg(options))

export const makeSim = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const stored = new Map<string, StoredOverrides>()
  const rate = SimRate.stateOf(storage)
  let calls = 0
  const service = FlowStorage.of({
    depth: (queue, cap) =>
      Effect.gen(function* () {
        yield* checkQueueName(queue)
        yield* checkCap(cap)
        calls++
        const report = yield* Effect.orDie(storage.queueStats())
        const available = report.queues.find((q) => q.queue === queue)?.available ?? 0
        return { count: Math.min(available, cap), capped: available >= cap }
      }),
    setOverrides: (queue, overrides) =>
      Effect.gen(function* () {
        yield* checkQueueName(queue)
        yield* checkObject(overrides)
        stored.set(queue, { queue, overrides: structuredClone(overrides), updatedAt: new Date() })
      }),
    clearOverrides: (queue) => Effect.map(checkQueueName(queue), () => stored.delete(queue)),
    getOverrides: (queues) =>
      Effect.sync(() =>
        [...stored.values()].filter((o) => queues === undefined || queues.includes(o.queue)).sort(byName)
      ),
    // GCRA as claim_rated (migration 0043), on the simulation's clock, under the simulation's
    // one rate lock (SimRate: the claim between the read of tat and its write can yield)
    claimRated: (params) =>
      Effect.gen(function* () {
        yield* checkRatedClaim(params)
        const t = (yield* Clock.currentTimeMillis) / 1000
        const a = SimRate.allowance(params.rate, rate.tats.get(params.queue), t)
        if (a.tokens <= 0) return { jobs: [], nextTokenAt: new Date(a.nextAt * 1000) }
        const jobs = yield* storage.claim({ ...params, max: Math.min(params.max, a.tokens) })
        if (jobs.length > 0) rate.tats.set(params.queue, a.base + jobs.length * a.period)
        return {
          jobs,
          nextTokenAt:
            a.tokens < params.max ? new Date(SimRate.nextTokenAfter(a, a.tokens) * 1000) : undefined
        }
      }).pipe(rate.lock.withPermits(1))
  })
  return { service, depthCalls: () => calls }
})

/** In memory, over the simulation's `QueueStorage`. */
export const layerSim: Layer.Layer<FlowStorage, never, QueueStorage> = Layer.effect(
  FlowStorage,
  Effect.map(makeSim, (m) => m.service)
)

/**
 * The simulation layer plus a probe that counts `depth` calls (for "off adds no query" tests).
 */
export class SimDepthProbe extends Context.Service<SimDepthProbe, { readonly depthCalls: () => number }>()(
  "@awa/storage/FlowStorage/SimDepthProbe"
) {}

export const layerSimProbed: Layer.Layer<FlowStorage | SimDepthProbe, never, QueueStorage> =
  Layer.effectContext(
    Effect.map(makeSim, (m) =>
      Context.make(FlowStorage, m.service).pipe(Context.add(SimDepthProbe, { depthCalls: m.depthCalls }))
    )
  )
