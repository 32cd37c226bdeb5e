/**
 * The Promise facade (capability 11): the same engine for code that does not use Effect.
 *
 * ```ts
 * const awa = await createClient({ databaseUrl: process.env.DATABASE_URL!, migrateOnStart: true })
 * const SendEmail = awa.define({ kind: "send_email", args: EmailSchema })   // Effect Schema or Standard Schema
 * await awa.insert(SendEmail, { to: "a@example.com" })
 * const worker = await awa.start({
 *   queues: { default: { maxConcurrency: 20 } },
 *   handlers: [awa.handler(SendEmail, async (args, { signal }) => { await send(args, { signal }) })]
 * })
 * await worker.stop(); await awa.close()
 * ```
 *
 * Handlers are async functions; their `AbortSignal` fires when the attempt is interrupted
 * (cancel, rescue, deadline, shutdown). A thrown error is retryable unless it is a
 * `JobTerminalError`; a returned `JobResult` chooses retry, snooze or cancel.
 *
 * **Standard Schema** (zod, valibot, ArkType…) args are validated at insert (the validator's
 * issues become the `ValidationError`'s reason, message and path kept), stored as JSON as given,
 * and validated again by the worker, whose handler receives the validator's *output*
 * (`z.coerce.date()` arrives as a `Date`). Since insert validates the value it is given, a
 * schema that changes the type (`z.string().transform(Number)`) must also accept its own output.
 * Validators must be synchronous: an async one is rejected by `define` with an `AwaConfigError`
 * when a probe shows it (a Promise from `validate`), and otherwise by the first insert with a
 * `ValidationError`.
 *
 * **Gotchas**
 * `insert` here runs in its own transaction; to enqueue inside an application transaction use
 * the Effect API (`AwaClient.insert` inside `sql.withTransaction`).
 */
import { AwaConfigError, Job } from "@awa/core"
import type {
  CronStorage,
  Diagnostics,
  DlqFilter,
  DlqRetryOverrides,
  EnqueuedJob,
  JobView,
  KeyGrantStats,
  KeyPolicy,
  KeyPolicyChange,
  ListFilter,
  QueueHistoryOptions,
  QueueHistoryReport,
  QueueStatsOptions,
  QueueStatsReport
} from "@awa/storage"
import { KeyGrants } from "@awa/storage"
import type { PgClient } from "@effect/sql-pg"
import {
  Cause,
  Effect,
  Exit,
  Layer,
  ManagedRuntime,
  Redacted,
  Schema,
  SchemaIssue,
  SchemaTransformation,
  Scope
} from "effect"
import * as Admin from "./Admin.ts"
import * as Awa from "./Awa.ts"
import { AwaClient, type InsertResult } from "./AwaClient.ts"
import * as Cron from "./Cron.ts"
import {
  handler as effectHandler,
  type Handler,
  type JobContext,
  type RegisterCallbackOptions
} from "./Handler.ts"
import type * as QueueOverrides from "./QueueOverrides.ts"
import type { WorkerOptions } from "./Worker.ts"

/** One issue of a Standard Schema result (https://standardschema.dev). */
export interface StandardIssue {
  readonly message: string
  readonly path?: ReadonlyArray<PropertyKey | { readonly key: PropertyKey }> | undefined
}

export interface StandardSchemaLike<A> {
  readonly "~standard": {
    readonly validate: (
      value: unknown
    ) =>
      | { readonly value: A; readonly issues?: undefined }
      | { readonly issues: ReadonlyArray<StandardIssue> }
      | PromiseLike<unknown>
    readonly types?: { readonly output: A } | undefined
  }
}

export interface ClientOptions extends Awa.AwaPgOptions {
  readonly databaseUrl: string
  /** Connections in the pool. Default 10. */
  readonly maxConnections?: number | undefined
}

export interface PromiseHandlerContext
  extends Omit<
    JobContext,
    "setProgress" | "updateMetadata" | "flushProgress" | "registerCallback" | "waitForCallback"
  > {
  /** As `JobContext.registerCallback`; rejects with its typed error (`InvalidCelExpression`, …). */
  readonly registerCallback: (options: RegisterCallbackOptions) => Promise<Job.CallbackToken>
  /** As `JobContext.waitForCallback`: resolves with the resume payload; rejects with `CallbackStale`. */
  readonly waitForCallback: (token: Job.CallbackToken) => Promise<unknown>
  /** As `JobContext.setProgress`; throws its `ValidationError` or `ProgressTooLarge`. */
  readonly setProgress: (percent: number, message?: string) => void
  /** As `JobContext.updateMetadata`; throws its `ValidationError` or `ProgressTooLarge`. */
  readonly updateMetadata: (patch: Readonly<Record<string, unknown>>) => void
  /** As `JobContext.flushProgress`; rejects with its `SqlError`. */
  readonly flushProgress: () => Promise<void>
}

/** Runs a synchronous progress update, throwing its typed error itself (not wrapped). */
const orThrow = <E>(effect: Effect.Effect<void, E>): void => {
  const exit = Effect.runSyncExit(effect)
  if (Exit.isFailure(exit)) throw Cause.squash(exit.cause)
}

export type PromiseHandler<A> = (args: A, ctx: PromiseHandlerContext) => Promise<Job.JobResult | void>

export interface StartOptions extends Omit<WorkerOptions<never>, "handlers"> {
  readonly handlers: ReadonlyArray<Handler<never>>
}

const isStandard = (schema: unknown): schema is StandardSchemaLike<unknown> =>
  typeof schema === "object" && schema !== null && "~standard" in schema

const asyncReason = "async Standard Schema validators are not supported (validate returned a Promise)"

const isThenable = (u: unknown): u is PromiseLike<unknown> =>
  typeof u === "object" && u !== null && typeof (u as { then?: unknown }).then === "function"

/** The validator's issues as one Schema issue: each message at its path. */
const issueOf = (issues: ReadonlyArray<StandardIssue>, input: unknown): SchemaIssue.Issue => {
  const each = issues.map((i): SchemaIssue.Issue => {
    const leaf = new SchemaIssue.InvalidValue({ message: i.message }, input)
    const path = (i.path ?? []).map((p) => (typeof p === "object" && p !== null ? p.key : p))
    return path.length === 0 ? leaf : new SchemaIssue.Pointer(path, leaf)
  })
  const [first, ...rest] = each
  if (first === undefined) return new SchemaIssue.InvalidValue({ message: "invalid" }, input)
  return rest.length === 0 ? first : new SchemaIssue.Composite(Schema.Unknown.ast, [first, ...rest], input)
}

/**
 * A synchronous Standard Schema as an Effect Schema from the stored JSON to the validator's
 * output. Decoding (the worker) validates and yields the output; encoding (insert) validates the
 * given value, keeping the validator's issues, and stores it as JSON.
 */
const fromStandard = <A>(schema: StandardSchemaLike<A>): Schema.Codec<A, unknown> => {
  const validate = (u: unknown): Effect.Effect<A, SchemaIssue.Issue> =>
    Effect.suspend(() => {
      const result = schema["~standard"].validate(u)
      if (isThenable(result)) return Effect.fail(new SchemaIssue.Forbidden({ message: asyncReason }, u))
      return result.issues !== undefined
        ? Effect.fail(issueOf(result.issues, u))
        : // a result without `value` (not to the letter of the spec) keeps the input
          Effect.succeed("value" in result ? result.value : (u as A))
    })
  const toJson = (a: unknown): Effect.Effect<unknown, SchemaIssue.Issue> =>
    Effect.try({
      try: () => JSON.parse(JSON.stringify(a)) as unknown,
      catch: (e) => new SchemaIssue.InvalidValue({ message: `is not JSON: ${String(e)}` }, a)
    })
  return Schema.Unknown.pipe(
    Schema.decodeTo(
      // the validator's output, opaque to Effect; already in the form it is stored in
      Schema.declare((_: unknown): _ is A => true, { toCodecJson: () => undefined }),
      SchemaTransformation.transformEffect({
        decode: validate,
        encode: (a: A) => Effect.flatMap(validate(a), () => toJson(a))
      })
    )
  ) as unknown as Schema.Codec<A, unknown>
}

/** Values a probe at `define` feeds a Standard Schema to find an async validator. */
const probes: ReadonlyArray<unknown> = [undefined, null, "", "2000-01-01T00:00:00.000Z", 0, 1, true, {}, []]

/**
 * Rejects an async validator at `define`. Which paths reach an async refinement depends on the
 * input, so a probe can miss one; insert then fails with a `ValidationError` instead.
 */
const checkSynchronous = (kind: string, schema: StandardSchemaLike<unknown>) => {
  for (const probe of probes) {
    let result: unknown
    try {
      result = schema["~standard"].validate(probe)
    } catch {
      continue
    }
    if (isThenable(result)) {
      // the probe's own promise must not surface as an unhandled rejection
      Promise.resolve(result).catch(() => undefined)
      throw new AwaConfigError({ issues: [{ path: `jobs.${kind}.args`, reason: asyncReason }] })
    }
  }
}

export const createClient = async (options: ClientOptions) => {
  // connection errors name their cause (ECONNREFUSED, unknown database) on the first line
  const pg = Awa.pgClient({
    url: Redacted.make(options.databaseUrl),
    maxConnections: options.maxConnections ?? 10
  })
  // Admin (operator reads: statistics, status, doctor) over the same storage and pool (issue 18)
  const runtime = ManagedRuntime.make(
    Admin.layer({ schema: options.schema }).pipe(
      Layer.provideMerge(Awa.layerPg(options).pipe(Layer.provideMerge(pg)))
    )
  )
  // resolved once: an insert is then one runPromise of the client's own effect
  const client = await runtime.runPromise(Effect.service(AwaClient))
  const run = <A, E>(
    effect: Effect.Effect<A, E, AwaClient | PgClient.PgClient | CronStorage.CronStorage | Admin.Admin>
  ) => runtime.runPromise(effect)
  const admin = await runtime.runPromise(Effect.service(Admin.Admin))

  const define = <A, I = A>(spec: {
    readonly kind: string
    readonly args: Schema.Codec<A, I> | StandardSchemaLike<A>
    readonly queue?: string
    readonly defaults?: Job.InsertOptions
    readonly backoff?: (attempt: number) => number
    readonly concurrencyKey?: (args: A) => string | undefined
    readonly orderingKey?: (args: A) => string | undefined
  }): Job.JobDefinition<A, I> => {
    if (!isStandard(spec.args)) return Job.define({ ...spec, args: spec.args })
    checkSynchronous(spec.kind, spec.args)
    return Job.define({ ...spec, args: fromStandard(spec.args) as unknown as Schema.Codec<A, I> })
  }

  const handler = <A, I>(definition: Job.JobDefinition<A, I>, fn: PromiseHandler<A>): Handler<never> =>
    effectHandler(definition, (args, ctx) =>
      Effect.tryPromise({
        // tryPromise's signal aborts when the attempt's fiber is interrupted
        try: (signal) =>
          fn(args, {
            job: ctx.job,
            signal,
            setProgress: (percent, message) => orThrow(ctx.setProgress(percent, message)),
            updateMetadata: (patch) => orThrow(ctx.updateMetadata(patch)),
            flushProgress: () => Effect.runPromise(ctx.flushProgress),
            registerCallback: (options) => Effect.runPromise(ctx.registerCallback(options)),
            // the attempt's signal also ends the wait (cancel, rescue, deadline, shutdown)
            waitForCallback: (token) => Effect.runPromise(ctx.waitForCallback(token), { signal }),
            callbackResult: ctx.callbackResult
          }),
        catch: (error) =>
          error instanceof Job.JobTerminalError
            ? error
            : new Job.JobRetryableError({ message: messageOf(error), cause: error })
      })
    )

  const start = async (startOptions: StartOptions) => {
    const scope = await runtime.runPromise(Scope.make())
    await runtime.runPromise(Layer.buildWithScope(Awa.worker(startOptions), scope))
    return {
      /** Stops claiming, drains in-flight handlers (up to `shutdownTimeout`) and flushes. */
      stop: () => runtime.runPromise(Scope.close(scope, Exit.void))
    }
  }

  return {
    define,
    handler,
    start,
    insert: <A, I>(job: Job.JobDefinition<A, I>, args: A, opts?: Job.InsertOptions): Promise<InsertResult> =>
      runtime.runPromise(client.insert(job, args, opts)),
    insertMany: <A, I>(job: Job.JobDefinition<A, I>, args: ReadonlyArray<A>, opts?: Job.InsertOptions) =>
      runtime.runPromise(client.insertMany(job, args, opts)),
    /**
     * Per-queue statistics (open work by state, paused, oldest available job, finalizations in
     * total and recently) from the live work and ring ledgers; `exact` adds stored terminal
     * counts (slow on a large history). See `QueueStatsReport.staleness`.
     */
    queueStats: (statsOptions?: QueueStatsOptions): Promise<QueueStatsReport> =>
      run(admin.queueStats(statsOptions)),
    /** Per-queue counts per bucket over the last hour (default) from the leader's samples. */
    queueHistory: (historyOptions?: QueueHistoryOptions): Promise<QueueHistoryReport> =>
      run(admin.queueHistory(historyOptions)),
    /** Schema version, leader, both rings (generation, oldest unpruned slot, last prune, size), table sizes. */
    status: (): Promise<Diagnostics.StorageReport> => run(admin.status),
    /** Server and schema checks, each pass/warn/fail with its fix (what `awa doctor` prints). */
    doctor: (): Promise<ReadonlyArray<Diagnostics.DoctorCheck>> => run(admin.doctor),
    getJob: (id: bigint): Promise<JobView> => run(Effect.flatMap(AwaClient, (c) => c.storage.getJob(id))),
    listJobs: (filter: ListFilter = {}) => run(Effect.flatMap(AwaClient, (c) => c.storage.listJobs(filter))),
    cancel: (id: bigint, reason = "cancelled by operator") =>
      run(Effect.flatMap(AwaClient, (c) => c.storage.cancelJob(id, reason))),
    retry: (id: bigint) => run(Effect.flatMap(AwaClient, (c) => c.storage.retryJob(id))),
    pauseQueue: (queue: string) => run(Effect.flatMap(AwaClient, (c) => c.storage.pauseQueue(queue))),
    resumeQueue: (queue: string) => run(Effect.flatMap(AwaClient, (c) => c.storage.resumeQueue(queue))),
    /**
     * Spreads each priority of the queue over `shards` lanes (1–64) from the next insert on: FIFO
     * per shard and per `orderingKey` instead of per queue (capabilities.md §22).
     */
    setEnqueueShards: (queue: string, shards: number) =>
      run(Effect.flatMap(AwaClient, (c) => c.setEnqueueShards(queue, shards))),
    drainQueue: (queue: string, reason = "queue drained") =>
      run(Effect.flatMap(AwaClient, (c) => c.storage.drainQueue(queue, reason))),
    listDlq: (filter: DlqFilter = {}) => run(Effect.flatMap(AwaClient, (c) => c.storage.listDlq(filter))),
    getDlq: (id: bigint) => run(Effect.flatMap(AwaClient, (c) => c.storage.getDlq(id))),
    retryFromDlq: (id: bigint, overrides?: DlqRetryOverrides) =>
      run(Effect.flatMap(AwaClient, (c) => c.storage.retryFromDlq(id, overrides))),
    purgeDlq: (id: bigint) => run(Effect.flatMap(AwaClient, (c) => c.storage.purgeDlq(id))),
    retryDlqBulk: (filter: DlqFilter, options?: { readonly all?: boolean }) =>
      run(Effect.flatMap(AwaClient, (c) => c.storage.retryDlqBulk(filter, options))),
    purgeDlqBulk: (filter: DlqFilter, options?: { readonly all?: boolean }) =>
      run(Effect.flatMap(AwaClient, (c) => c.storage.purgeDlqBulk(filter, options))),
    /**
     * Replaces a queue's hot overrides (pollInterval, claimBatchSize, rateLimit, fleetRateLimit, deadline); every
     * worker applies them within its `overrideRefreshInterval`. Rejects out-of-range values.
     */
    setQueueOverrides: (queue: string, overrides: QueueOverrides.QueueOverridesInput) =>
      runtime.runPromise(client.setQueueOverrides(queue, overrides)),
    /** Removes a queue's overrides; workers revert to their code's values. True when it had some. */
    clearQueueOverrides: (queue: string) => runtime.runPromise(client.clearQueueOverrides(queue)),
    /** Stored overrides of one queue, or of every queue with some. */
    getQueueOverrides: (queue?: string) => runtime.runPromise(client.getQueueOverrides(queue)),
    /**
     * Key policies (capabilities.md §23, docs/adr/0029-key-execution-grants.md): at most
     * `maxInFlight` running jobs per `concurrencyKey` across the fleet. Bad input rejects with a
     * `ValidationError` (id 1–200 characters; limits 1–1,000,000), a missing policy with
     * `KeyPolicyNotFound`, an `(epoch, target)` that is not the pending change with
     * `StaleKeyPolicyEpoch`.
     */
    keyPolicies: {
      /** Creates a policy (idempotent for the same limit). */
      create: (policy: { readonly id: string; readonly maxInFlight: number }): Promise<KeyPolicy> =>
        runtime.runPromise(Effect.flatMap(KeyGrants, (g) => g.create(policy))),
      show: (id: string): Promise<KeyPolicy> =>
        runtime.runPromise(Effect.flatMap(KeyGrants, (g) => g.show(id))),
      /** Per policy: open grants, keys at their limit, the oldest open grant. */
      stats: (): Promise<ReadonlyArray<KeyGrantStats>> =>
        runtime.runPromise(Effect.flatMap(KeyGrants, (g) => g.stats)),
      /**
       * Changes the limit by the epoch protocol (lowering or raising): `active` when every key is
       * within `target` before `verifyTimeoutMs` (default 5,000), else `draining` (then `resume`
       * or `cancelChange` with the returned epoch).
       */
      lower: (
        id: string,
        target: number,
        opts?: { readonly verifyTimeoutMs?: number }
      ): Promise<KeyPolicyChange> =>
        runtime.runPromise(Effect.flatMap(KeyGrants, (g) => g.lower(id, target, opts))),
      resume: (id: string, epoch: bigint, target: number): Promise<KeyPolicyChange> =>
        runtime.runPromise(Effect.flatMap(KeyGrants, (g) => g.resume(id, epoch, target))),
      cancelChange: (id: string, epoch: bigint, target: number): Promise<KeyPolicy> =>
        runtime.runPromise(Effect.flatMap(KeyGrants, (g) => g.cancelChange(id, epoch, target))),
      /** Lifts the limit (grants still recorded); `lower` sets one again. */
      forceDisable: (id: string): Promise<KeyPolicy> =>
        runtime.runPromise(Effect.flatMap(KeyGrants, (g) => g.forceDisable(id)))
    },
    /** Declares a cron schedule for `start({ cron: [...] })` (checked when the worker starts). */
    schedule: Cron.schedule,
    /** Every stored cron schedule with its next fire time. */
    listSchedules: (): Promise<ReadonlyArray<Cron.ScheduleInfo>> => run(Cron.list),
    pauseSchedule: (name: string, by?: string) => run(Cron.pause(name, by)),
    resumeSchedule: (name: string) => run(Cron.resume(name)),
    /** Enqueues the schedule's job now, paused or not, without moving the schedule. */
    triggerSchedule: (name: string): Promise<EnqueuedJob> => run(Cron.trigger(name)),
    removeSchedule: (name: string) => run(Cron.remove(name)),
    close: () => runtime.dispose()
  }
}

const messageOf = (error: unknown) => (error instanceof Error ? error.message : String(error))

export type PromiseClient = Awaited<ReturnType<typeof createClient>>
