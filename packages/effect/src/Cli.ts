/**
 * The `awa` command line (issue 18, capabilities.md §29), built with Effect's own `effect/cli`.
 * Every command is one `Admin` call (packages/runtime/src/Admin.ts) on a connection pool opened
 * for the command from `--database-url` or `DATABASE_URL`.
 *
 * Output: human tables by default, one JSON document with `--json` (bigints as strings, dates as
 * ISO text). Exit codes (`run` returns them; `bin/awa.ts` sets `process.exitCode`):
 *   0  done;
 *   1  error: bad arguments, database unreachable, job not found, …  (message on stderr);
 *   2  checked and not ready: `doctor` found a warn or fail, `migrate --dry-run` found pending
 *      migrations, `status` found the schema behind this code.
 */

import { createServer } from "node:http"
import { Admin, Callbacks, QueueOverrides } from "@awa/runtime"
import {
  CronStorage,
  FlowStorage,
  KeyGrants,
  type KeyPolicy,
  type KeyPolicyChange,
  PgCallbackStorage,
  PgKeyGrants,
  PgQueueStorage,
  policyLimits,
  StorageSignals
} from "@awa/storage"
import { NodeHttpServer } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Cause, Console, Context, Duration, Effect, Exit, Layer, Option, Redacted, Schema } from "effect"
import { Argument, Command, Flag } from "effect/cli"
import { HttpRouter } from "effect/http"
import * as AdminApi from "./AdminApi.ts"
import * as Dashboard from "./Dashboard.ts"
import * as Readiness from "./Readiness.ts"

/** Exit code of a check that ran and found something not ready (`doctor`, `migrate --dry-run`). */
export const exitNotReady = 2

/** A check that ran and found the system not ready: exit code 2, its report already printed. */
export class NotReady extends Schema.TaggedError<NotReady>()("NotReady", { reason: Schema.String }) {}

/** A command line that cannot work (no database URL): exit code 1 with this message. */
export class UsageError extends Schema.TaggedError<UsageError>()("UsageError", { message: Schema.String }) {}

// ---------------------------------------------------------------------------------------------
// Output

const jsonReplacer = (_key: string, value: unknown) => (typeof value === "bigint" ? value.toString() : value)

/** One JSON document, dates as ISO text and bigints as strings. */
export const toJson = (value: unknown): string => JSON.stringify(value, jsonReplacer, 2)

const cell = (value: unknown): string =>
  value === null || value === undefined
    ? "-"
    : value instanceof Date
      ? value.toISOString()
      : typeof value === "object"
        ? JSON.stringify(value, jsonReplacer)
        : String(value)

/** A plain table: a header row, a rule, then the rows; columns padded to their widest cell. */
export const renderTable = (
  header: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<unknown>>
): string => {
  const text = rows.map((r) => r.map(cell))
  const widths = header.map((h, i) => Math.max(h.length, ...text.map((r) => r[i]!.length)))
  const line = (cells: ReadonlyArray<string>) =>
    cells
      .map((c, i) => c.padEnd(widths[i]!))
      .join("  ")
      .trimEnd()
  return [line(header), line(widths.map((w) => "-".repeat(w))), ...text.map(line)].join("\n")
}

/** `key: value` lines for one record. */
const renderRecord = (record: Readonly<Record<string, unknown>>): string => {
  const width = Math.max(...Object.keys(record).map((k) => k.length))
  return Object.entries(record)
    .map(([k, v]) => `${k.padEnd(width)}  ${cell(v)}`)
    .join("\n")
}

const ageOf = (since: Date | null, now: Date): string => {
  if (since === null) return "-"
  const s = Math.max(0, Math.round((now.getTime() - since.getTime()) / 1000))
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.round(s / 60)}m` : `${Math.round(s / 3600)}h`
}

const bytes = (n: number) =>
  n < 1024 ? `${n} B` : n < 1024 ** 2 ? `${(n / 1024).toFixed(0)} kB` : `${(n / 1024 ** 2).toFixed(1)} MB`

// ---------------------------------------------------------------------------------------------
// Commands

const root = Command.make("awa").pipe(
  Command.withSharedFlags({
    databaseUrl: Flag.String("database-url").pipe(
      Flag.withDescription("PostgreSQL URL (default: the DATABASE_URL environment variable)"),
      Flag.optional
    ),
    schema: Flag.String("schema").pipe(
      Flag.withDescription("schema Awa is installed in"),
      Flag.withDefault("awa")
    ),
    json: Flag.Boolean("json").pipe(
      Flag.withDescription("print one JSON document instead of tables"),
      Flag.withDefault(false)
    )
  }),
  Command.withDescription(
    "Operate an Awa job queue: migrations, status, queues, jobs, dead letters, cron, doctor"
  )
)

/** The root flags and a pool to the command's database (`--database-url`, else `DATABASE_URL`). */
const commandClient = (maxConnections: number) =>
  Effect.gen(function* () {
    const flags = yield* root
    const url = Option.getOrUndefined(flags.databaseUrl) ?? process.env.DATABASE_URL
    if (url === undefined || url === "")
      return yield* new UsageError({ message: "no database: pass --database-url or set DATABASE_URL" })
    return {
      flags,
      client: PgClient.layer({ url: Redacted.make(url), maxConnections, applicationName: "awa-cli" })
    }
  })

/** The `Admin` service (and its `SqlClient`) on a pool to the command's database. */
const adminLayerWith = (maxConnections: number) =>
  Effect.gen(function* () {
    const { flags, client } = yield* commandClient(maxConnections)
    const storage = Layer.mergeAll(
      PgQueueStorage.layer({ schema: flags.schema }),
      CronStorage.layerPg({ schema: flags.schema }),
      // waiting jobs (issue 21): `awa callback …` and the admin API's waiting-job actions
      Callbacks.layer.pipe(Layer.provide(PgCallbackStorage.layer({ schema: flags.schema })))
    ).pipe(Layer.provideMerge(client))
    return {
      admin: Admin.layer({ schema: flags.schema }).pipe(Layer.provideMerge(storage)),
      json: flags.json,
      schema: flags.schema
    }
  })

/** A command's pool: two connections (one statement at a time, plus a spare). */
const adminLayer = adminLayerWith(2)

/** Runs `body` with the `Admin` service on a pool opened for this command, and closed after it. */
const withAdmin = <A, E>(body: (admin: Admin.Admin["Service"], json: boolean) => Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    const { admin, json } = yield* adminLayer
    return yield* Effect.flatMap(Admin.Admin, (a) => body(a, json)).pipe(Effect.provide(admin))
  })

/**
 * Progress of a bulk action on stderr, one line per committed batch (`[####----] 500/1000`; the
 * total is an estimate taken before the action, so the bar may stop short or run past it).
 */
const progressTo = (json: boolean, total: number | undefined) => ({
  onBatch: (done: number) => {
    if (json) return Effect.void
    if (total === undefined || total <= 0) return Console.error(`  ${done} done`)
    const filled = Math.min(20, Math.round((done / total) * 20))
    return Console.error(`  [${"#".repeat(filled)}${"-".repeat(20 - filled)}] ${done}/${total}`)
  }
})

const print = (json: boolean, value: unknown, human: () => string) =>
  Console.log(json ? toJson(value) : human())

const idArgument = Argument.String("id").pipe(Argument.withDescription("job id"))

/** A job id from the command line, or a usage error. */
const parseId = (text: string) =>
  /^[1-9][0-9]{0,18}$/.test(text)
    ? Effect.succeed(BigInt(text))
    : Effect.fail(new UsageError({ message: `not a job id: ${text}` }))

// migrate -----------------------------------------------------------------------------------

const migrate = Command.make(
  "migrate",
  {
    dryRun: Flag.Boolean("dry-run").pipe(
      Flag.withDescription("list what would run; run nothing"),
      Flag.withDefault(false)
    )
  },
  ({ dryRun }) =>
    withAdmin((admin, json) =>
      Effect.gen(function* () {
        if (dryRun) {
          const pending = yield* admin.pendingMigrations
          const list = pending.map((m) => ({ version: m.version, name: m.name, breaking: m.breaking }))
          yield* print(json, { pending: list }, () =>
            list.length === 0
              ? "schema up to date: nothing to run"
              : `${list.length} migration(s) would run:\n${renderTable(
                  ["version", "name", "breaking"],
                  list.map((m) => [m.version, m.name, m.breaking])
                )}`
          )
          if (list.length > 0) return yield* new NotReady({ reason: "pending migrations" })
          return
        }
        const result = yield* admin.migrate
        yield* print(json, result, () =>
          result.applied.length === 0
            ? `schema "${result.schema}" up to date at version ${result.to}`
            : `schema "${result.schema}": applied ${result.applied.length} migration(s), version ${result.from} -> ${result.to}`
        )
      })
    )
).pipe(Command.withDescription("apply pending schema migrations (--dry-run lists them)"))

// status ------------------------------------------------------------------------------------

/** The leader's recorded prune state: "ok for 3m", "blocked (lock) for 12m", "-" before any. */
const pruneState = (
  state: { readonly outcome: string; readonly reason: string | null; readonly since: Date } | null,
  now: Date
) =>
  state === null
    ? "-"
    : `${state.outcome}${state.reason === null ? "" : ` (${state.reason})`} for ${ageOf(state.since, now)}`

const status = Command.make("status", {}, () =>
  withAdmin((admin, json) =>
    Effect.gen(function* () {
      const report = yield* admin.status
      yield* print(json, report, () =>
        [
          renderRecord({
            schema: report.schema,
            "schema version": `${report.schemaVersion} (this code: ${report.latestVersion})`,
            leader:
              report.leader === null
                ? "none"
                : `pid ${report.leader.pid} (${report.leader.applicationName || "unnamed"}), connected ${ageOf(report.leader.since, report.now)} ago`
          }),
          "",
          renderTable(
            [
              "ring",
              "generation",
              "slot",
              "oldest unpruned",
              "unpruned for",
              "last prune",
              "prune state",
              "size"
            ],
            report.rings.map((r) => [
              r.ring,
              r.generation,
              r.slot,
              r.oldestUnpruned === null
                ? "-"
                : `${r.oldestUnpruned.generation} (slot ${r.oldestUnpruned.slot})`,
              ageOf(r.oldestUnpruned?.since ?? null, report.now),
              r.lastPrunedAt === null ? "never" : `${ageOf(r.lastPrunedAt, report.now)} ago`,
              pruneState(r.prune, report.now),
              bytes(r.bytes)
            ])
          ),
          "",
          renderTable(
            ["table", "size"],
            report.tables.map((t) => [t.table, bytes(t.bytes)])
          )
        ].join("\n")
      )
      if (report.schemaVersion < report.latestVersion)
        return yield* new NotReady({
          reason: `schema at ${report.schemaVersion}, this code needs ${report.latestVersion}`
        })
    })
  )
).pipe(Command.withDescription("schema version, leader, ring generations, reclamation and table sizes"))

// queues ------------------------------------------------------------------------------------

/** A sampled rate per minute, or "-" without samples (no leader yet). */
const perMinute = (perSecond: number | undefined) =>
  perSecond === undefined ? "-" : (Math.round(perSecond * 600) / 10).toString()

const queues = Command.make(
  "queues",
  {
    exact: Flag.Boolean("exact").pipe(
      Flag.withDescription(
        "also count stored completed/failed/cancelled jobs (scans every stored job: slow)"
      ),
      Flag.withDefault(false)
    ),
    window: Flag.Int("window").pipe(
      Flag.withDescription("seconds covered by the recent counts (1-86400)"),
      Flag.withDefault(300)
    )
  },
  ({ exact, window }) =>
    withAdmin((admin, json) =>
      Effect.gen(function* () {
        const report = yield* admin.queueStats({ exact, windowMs: window * 1000 })
        const seconds = Math.max(1, Math.round((report.asOf.getTime() - report.windowStart.getTime()) / 1000))
        yield* print(json, report, () =>
          [
            renderTable(
              [
                "queue",
                "paused",
                "available",
                "running",
                "scheduled",
                "retryable",
                "dlq",
                "oldest",
                `done/${seconds}s`,
                `failed/${seconds}s`,
                "completed total",
                "enq/min",
                "done/min",
                "fail/min",
                ...(exact ? ["stored completed", "stored failed", "stored cancelled"] : [])
              ],
              report.queues.map((q) => [
                q.queue,
                q.paused ? "yes" : "no",
                q.available,
                q.running,
                q.scheduled,
                q.retryable,
                q.deadLettered,
                ageOf(q.oldestAvailableAt, report.asOf),
                q.recent.completed,
                q.recent.failed,
                q.finalizedTotal.completed,
                perMinute(q.rates?.enqueuedPerSecond),
                perMinute(q.rates?.completedPerSecond),
                perMinute(q.rates?.failedPerSecond),
                ...(q.stored === null ? [] : [q.stored.completed, q.stored.failed, q.stored.cancelled])
              ])
            ),
            `as of ${report.asOf.toISOString()}; ${report.staleness}`
          ].join("\n")
        )
      })
    )
).pipe(
  Command.withDescription(
    "per-queue statistics: open work by state, oldest job, recent and total finalizations"
  )
)

// wake-on-demand [on|off] -----------------------------------------------------------------------

const wakeOnDemand = Command.make(
  "wake-on-demand",
  {
    state: Argument.Literals("state", ["on", "off"] as const).pipe(
      Argument.withDescription("on: inserts skip wake-ups no worker waits for; off: every insert notifies"),
      Argument.optional
    )
  },
  ({ state }) =>
    withAdmin((admin, json) =>
      Effect.gen(function* () {
        if (Option.isSome(state)) yield* admin.setWakeOnDemand(state.value === "on")
        const on = yield* admin.wakeOnDemand
        yield* print(json, { wakeOnDemand: on }, () => `wake-ups on demand: ${on ? "on" : "off"}`)
      })
    )
).pipe(
  Command.withDescription(
    "show or set whether inserts skip wake-ups no worker waits for (turn on once every worker runs this version; ADR 0038)"
  )
)

// queue pause|resume|drain ----------------------------------------------------------------------

const queueArgument = Argument.String("queue").pipe(Argument.withDescription("queue name"))

const queuePause = Command.make("pause", { queue: queueArgument }, ({ queue }) =>
  withAdmin((admin, json) =>
    Effect.andThen(
      admin.pauseQueue(queue),
      print(json, { queue, paused: true }, () => `queue ${queue} paused`)
    )
  )
).pipe(Command.withDescription("stop claims from a queue (running jobs finish)"))

const queueResume = Command.make("resume", { queue: queueArgument }, ({ queue }) =>
  withAdmin((admin, json) =>
    Effect.andThen(
      admin.resumeQueue(queue),
      print(json, { queue, paused: false }, () => `queue ${queue} resumed`)
    )
  )
).pipe(Command.withDescription("let workers claim from a paused queue again"))

const queueShards = Command.make(
  "shards",
  {
    queue: queueArgument,
    shards: Argument.Int("shards").pipe(
      Argument.withDescription("lanes per priority from the next insert on: 1–64 (1: one lane, strict FIFO)")
    )
  },
  ({ queue, shards }) =>
    withAdmin((admin, json) =>
      Effect.andThen(
        admin.setEnqueueShards(queue, shards),
        print(json, { queue, enqueueShards: shards }, () => `queue ${queue}: ${shards} shard(s) per priority`)
      )
    )
).pipe(
  Command.withDescription(
    "spread a hot queue over several lanes (FIFO per shard and per orderingKey; lowering it is safe)"
  )
)

const queueDrain = Command.make(
  "drain",
  {
    queue: queueArgument,
    reason: Flag.String("reason").pipe(
      Flag.withDescription("recorded on every cancelled job"),
      Flag.withDefault("drained by operator")
    )
  },
  ({ queue, reason }) =>
    withAdmin((admin, json) =>
      Effect.gen(function* () {
        if (!json)
          yield* Console.error(`draining ${queue} in batches of 500 (Ctrl-C keeps the batches done)…`)
        const stats = (yield* admin.queueStats()).queues.find((q) => q.queue === queue)
        const total = stats === undefined ? undefined : stats.available + stats.scheduled + stats.retryable
        const cancelled = yield* admin.drainQueue(queue, reason, progressTo(json, total))
        yield* print(json, { queue, cancelled }, () => `queue ${queue}: ${cancelled} job(s) cancelled`)
      })
    )
).pipe(Command.withDescription("cancel every job of a queue that is not running yet"))

// queue overrides set|clear|show (issue 20, capabilities.md §13) -----------------------------------

/** Runs `body` with `FlowStorage` on a pool opened for this command (not the `Admin` service's). */
const withFlow = <A, E>(body: (json: boolean) => Effect.Effect<A, E, FlowStorage.FlowStorage>) =>
  Effect.gen(function* () {
    const { flags, client } = yield* commandClient(1)
    return yield* body(flags.json).pipe(
      Effect.provide(FlowStorage.layerPg({ schema: flags.schema }).pipe(Layer.provide(client)))
    )
  })

const renderOverrides = (o: QueueOverrides.QueueOverrides) =>
  [
    o.pollIntervalMs === undefined ? undefined : `pollInterval=${o.pollIntervalMs}ms`,
    o.claimBatchSize === undefined ? undefined : `claimBatchSize=${o.claimBatchSize}`,
    o.rateLimit === undefined ? undefined : `rateLimit=${o.rateLimit.maxRate}/s burst ${o.rateLimit.burst}`,
    o.fleetRateLimit === undefined
      ? undefined
      : `fleetRateLimit=${o.fleetRateLimit.maxRate}/s burst ${o.fleetRateLimit.burst}`,
    o.deadlineMs === undefined ? undefined : `deadline=${o.deadlineMs}ms`
  ]
    .filter((x) => x !== undefined)
    .join(" ")

const overridesSet = Command.make(
  "set",
  {
    queue: queueArgument,
    pollInterval: Flag.Int("poll-interval-ms").pipe(Flag.withDescription("10–60,000"), Flag.optional),
    claimBatchSize: Flag.Int("claim-batch-size").pipe(Flag.withDescription("1–10,000"), Flag.optional),
    maxRate: Flag.Finite("max-rate").pipe(
      Flag.withDescription("jobs/s, > 0 and ≤ 100,000 (retunes a queue's rateLimit; cannot create one)"),
      Flag.optional
    ),
    burst: Flag.Int("burst").pipe(
      Flag.withDescription("with --max-rate: bucket size, 0 = ceil(max-rate)"),
      Flag.optional
    ),
    deadline: Flag.Int("deadline-ms").pipe(
      Flag.withDescription("0 (none) or 10 – 604,800,000"),
      Flag.optional
    ),
    fleetMaxRate: Flag.Finite("fleet-max-rate").pipe(
      Flag.withDescription(
        "jobs/s over every process, > 0 and ≤ 100,000 (retunes a queue's fleetRateLimit; cannot create one)"
      ),
      Flag.optional
    ),
    fleetBurst: Flag.Int("fleet-burst").pipe(
      Flag.withDescription("with --fleet-max-rate: 0–1,000,000, 0 = max(1, ceil(fleet-max-rate))"),
      Flag.optional
    )
  },
  (f) =>
    withFlow((json) =>
      Effect.gen(function* () {
        const value = <A>(o: Option.Option<A>) => Option.getOrUndefined(o)
        const maxRate = value(f.maxRate)
        if (maxRate === undefined && Option.isSome(f.burst))
          return yield* new UsageError({ message: "--burst needs --max-rate" })
        const fleetMaxRate = value(f.fleetMaxRate)
        if (fleetMaxRate === undefined && Option.isSome(f.fleetBurst))
          return yield* new UsageError({ message: "--fleet-burst needs --fleet-max-rate" })
        const stored = yield* QueueOverrides.set(f.queue, {
          pollInterval: value(f.pollInterval),
          claimBatchSize: value(f.claimBatchSize),
          rateLimit: maxRate === undefined ? undefined : { maxRate, burst: value(f.burst) },
          deadline: value(f.deadline),
          fleetRateLimit:
            fleetMaxRate === undefined ? undefined : { maxRate: fleetMaxRate, burst: value(f.fleetBurst) }
        })
        yield* print(
          json,
          { queue: f.queue, overrides: stored },
          () =>
            `queue ${f.queue} overrides: ${renderOverrides(stored) || "(none)"} (replaces the previous set; workers apply it within their refresh interval)`
        )
      })
    )
).pipe(
  Command.withDescription(
    "replace a queue's hot overrides (every worker applies them within overrideRefreshInterval)"
  )
)

const overridesClear = Command.make("clear", { queue: queueArgument }, ({ queue }) =>
  withFlow((json) =>
    Effect.flatMap(QueueOverrides.clear(queue), (had) =>
      print(json, { queue, cleared: had }, () =>
        had
          ? `queue ${queue}: overrides cleared (workers revert to their code's values)`
          : `queue ${queue} had no overrides`
      )
    )
  )
).pipe(Command.withDescription("remove a queue's hot overrides"))

const overridesShow = Command.make(
  "show",
  {
    queue: Argument.String("queue").pipe(
      Argument.withDescription("queue name (default: every queue)"),
      Argument.optional
    )
  },
  ({ queue }) =>
    withFlow((json) =>
      Effect.flatMap(QueueOverrides.get(Option.isSome(queue) ? [queue.value] : undefined), (rows) =>
        print(json, rows, () =>
          rows.length === 0
            ? "no queue overrides"
            : renderTable(
                ["queue", "overrides", "ignored (invalid)", "updated"],
                rows.map((r) => [
                  r.queue,
                  renderOverrides(r.overrides),
                  r.invalid.map((i) => `${i.field}: ${i.reason}`).join("; "),
                  r.updatedAt.toISOString()
                ])
              )
        )
      )
    )
).pipe(Command.withDescription("show stored hot overrides"))

const queueOverrides = Command.make("overrides").pipe(
  Command.withSubcommands([overridesSet, overridesClear, overridesShow]),
  Command.withDescription(
    "set, clear or show a queue's hot overrides (pollInterval, claimBatchSize, rateLimit, fleetRateLimit, deadline)"
  )
)

const queue = Command.make("queue").pipe(
  Command.withSubcommands([queuePause, queueResume, queueShards, queueDrain, queueOverrides]),
  Command.withDescription("pause, resume or drain one queue; its hot overrides")
)

// key-policy create|show|lower|resume|cancel-change|disable (issue 20, capabilities.md §23) -------

/** Runs `body` with `KeyGrants` on a pool opened for this command (not the `Admin` service's). */
const withKeyGrants = <A, E>(body: (grants: KeyGrants["Service"], json: boolean) => Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    const { flags, client } = yield* commandClient(1)
    return yield* Effect.flatMap(KeyGrants, (grants) => body(grants, flags.json)).pipe(
      Effect.provide(PgKeyGrants.layer({ schema: flags.schema }).pipe(Layer.provide(client)))
    )
  })

const policyArgument = Argument.String("policy").pipe(
  Argument.withDescription("key policy id (1–200 characters)")
)
const limitFlag = (name: string) =>
  Flag.Int(name).pipe(
    Flag.withDescription(`${policyLimits.minMaxInFlight}–${policyLimits.maxMaxInFlight.toLocaleString("en")}`)
  )
const epochFlag = Flag.String("epoch").pipe(
  Flag.withDescription("the pending change's epoch (from lower or show)")
)

/** An epoch from the command line, or a usage error. */
const parseEpoch = (text: string) =>
  /^(0|[1-9][0-9]{0,18})$/.test(text)
    ? Effect.succeed(BigInt(text))
    : Effect.fail(new UsageError({ message: `not an epoch: ${text}` }))

const policyLine = (p: KeyPolicy) =>
  `key policy ${p.id}: ${p.state}, maxInFlight ${p.maxInFlight}` +
  (p.target === null ? "" : `, target ${p.target} pending`) +
  `, epoch ${p.epoch}`

const keyPolicyCreate = Command.make(
  "create",
  { policy: policyArgument, maxInFlight: limitFlag("max-in-flight") },
  ({ policy, maxInFlight }) =>
    withKeyGrants((grants, json) =>
      Effect.flatMap(grants.create({ id: policy, maxInFlight }), (p) => print(json, p, () => policyLine(p)))
    )
).pipe(Command.withDescription("create a key policy (idempotent for the same limit)"))

const keyPolicyShow = Command.make(
  "show",
  {
    policy: Argument.String("policy").pipe(
      Argument.withDescription("key policy id (default: every policy, with its open grants)"),
      Argument.optional
    )
  },
  ({ policy }) =>
    withKeyGrants((grants, json) =>
      Option.isSome(policy)
        ? Effect.flatMap(grants.show(policy.value), (p) => print(json, p, () => policyLine(p)))
        : Effect.flatMap(grants.stats, (rows) =>
            print(json, rows, () =>
              rows.length === 0
                ? "no key policies"
                : renderTable(
                    ["policy", "state", "open grants", "keys at limit", "oldest open grant"],
                    rows.map((r) => [r.policy, r.state, r.openGrants, r.keysAtLimit, r.oldestOpenGrantAt])
                  )
            )
          )
    )
).pipe(Command.withDescription("show one key policy, or every policy with its open grants"))

const changeLine = (id: string, target: number, c: KeyPolicyChange) =>
  c.state === "active"
    ? `key policy ${id}: maxInFlight ${target} active (epoch ${c.epoch})`
    : `key policy ${id}: draining to ${target} (epoch ${c.epoch}): some key holds more; retry with \`awa key-policy resume ${id} --epoch ${c.epoch} --target ${target}\` or cancel-change`

const keyPolicyLower = Command.make(
  "lower",
  {
    policy: policyArgument,
    target: limitFlag("target"),
    verifyTimeout: Flag.Int("verify-timeout-ms").pipe(
      Flag.withDescription(
        `how long to wait for keys above the target (0–${policyLimits.maxVerifyTimeoutMs}, default ${policyLimits.defaultVerifyTimeoutMs})`
      ),
      Flag.optional
    )
  },
  ({ policy, target, verifyTimeout }) =>
    withKeyGrants((grants, json) =>
      Effect.flatMap(
        grants.lower(policy, target, { verifyTimeoutMs: Option.getOrUndefined(verifyTimeout) }),
        (c) => print(json, { policy, target, ...c }, () => changeLine(policy, target, c))
      )
    )
).pipe(
  Command.withDescription(
    "change a policy's limit by the epoch protocol (lower or raise): no keyed admissions until every key is within the target"
  )
)

const keyPolicyResume = Command.make(
  "resume",
  { policy: policyArgument, epoch: epochFlag, target: limitFlag("target") },
  ({ policy, epoch, target }) =>
    withKeyGrants((grants, json) =>
      Effect.gen(function* () {
        const c = yield* grants.resume(policy, yield* parseEpoch(epoch), target)
        yield* print(json, { policy, target, ...c }, () => changeLine(policy, target, c))
      })
    )
).pipe(Command.withDescription("activate a pending change if every key is within its target now"))

const keyPolicyCancelChange = Command.make(
  "cancel-change",
  { policy: policyArgument, epoch: epochFlag, target: limitFlag("target") },
  ({ policy, epoch, target }) =>
    withKeyGrants((grants, json) =>
      Effect.gen(function* () {
        const p = yield* grants.cancelChange(policy, yield* parseEpoch(epoch), target)
        yield* print(json, p, () => policyLine(p))
      })
    )
).pipe(Command.withDescription("abandon a pending change: the old limit applies again"))

const keyPolicyDisable = Command.make("disable", { policy: policyArgument }, ({ policy }) =>
  withKeyGrants((grants, json) =>
    Effect.flatMap(grants.forceDisable(policy), (p) =>
      print(json, p, () => `${policyLine(p)} (no limit; lower sets one again)`)
    )
  )
).pipe(Command.withDescription("lift a policy's limit (grants are still recorded); lower sets one again"))

const keyPolicy = Command.make("key-policy").pipe(
  Command.withSubcommands([
    keyPolicyCreate,
    keyPolicyShow,
    keyPolicyLower,
    keyPolicyResume,
    keyPolicyCancelChange,
    keyPolicyDisable
  ]),
  Command.withDescription(
    "per-key execution limits: create, show, lower (or raise), resume, cancel-change, disable"
  )
)

// jobs list|show|retry|cancel -------------------------------------------------------------------

const jobStates = [
  "available",
  "running",
  "scheduled",
  "retryable",
  "completed",
  "failed",
  "cancelled",
  "waiting_external",
  "waiting_on"
] as const

const jobsList = Command.make(
  "list",
  {
    queue: Flag.String("queue").pipe(Flag.optional),
    kind: Flag.String("kind").pipe(Flag.optional),
    state: Flag.Literals("state", jobStates).pipe(Flag.optional),
    tag: Flag.String("tag").pipe(Flag.optional),
    before: Flag.String("before").pipe(
      Flag.withDescription("only ids below this (next page)"),
      Flag.optional
    ),
    limit: Flag.Int("limit").pipe(Flag.withDescription("1-1000"), Flag.withDefault(50))
  },
  (f) =>
    withAdmin((admin, json) =>
      Effect.gen(function* () {
        const jobs = yield* admin.listJobs({
          queue: Option.getOrUndefined(f.queue),
          kind: Option.getOrUndefined(f.kind),
          state: Option.getOrUndefined(f.state),
          tag: Option.getOrUndefined(f.tag),
          before: Option.isSome(f.before) ? yield* parseId(f.before.value) : undefined,
          limit: f.limit
        })
        yield* print(json, { jobs }, () =>
          renderTable(
            ["id", "state", "queue", "kind", "priority", "attempt", "run at", "finalized at"],
            jobs.map((j) => [
              j.id,
              j.state,
              j.queue,
              j.kind,
              j.priority,
              `${j.attempt}/${j.maxAttempts}`,
              j.runAt,
              j.finalizedAt
            ])
          )
        )
      })
    )
).pipe(Command.withDescription("list jobs, newest first, by queue, kind, state or tag"))

const jobsShow = Command.make("show", { id: idArgument }, ({ id }) =>
  withAdmin((admin, json) =>
    Effect.gen(function* () {
      const job = yield* admin.getJob(yield* parseId(id))
      yield* print(json, job, () => renderRecord({ ...job }))
    })
  )
).pipe(Command.withDescription("one job with its args, errors and progress"))

const jobsRetry = Command.make("retry", { id: idArgument }, ({ id }) =>
  withAdmin((admin, json) =>
    Effect.gen(function* () {
      const job = yield* admin.retryJob(yield* parseId(id))
      yield* print(json, job, () => `job ${job.id} is ${job.state} again`)
    })
  )
).pipe(Command.withDescription("make a failed or cancelled job available again"))

const jobsCancel = Command.make(
  "cancel",
  { id: idArgument, reason: Flag.String("reason").pipe(Flag.withDefault("cancelled by operator")) },
  ({ id, reason }) =>
    withAdmin((admin, json) =>
      Effect.gen(function* () {
        const job = yield* admin.cancelJob(yield* parseId(id), reason)
        yield* print(json, job, () => `job ${job.id} is ${job.state}`)
      })
    )
).pipe(Command.withDescription("cancel a job that has not finished"))

const jobs = Command.make("jobs").pipe(
  Command.withSubcommands([jobsList, jobsShow, jobsRetry, jobsCancel]),
  Command.withDescription("list, show, retry or cancel jobs")
)

// dlq list|show|retry|purge -----------------------------------------------------------------------

const dlqFilterFlags = {
  queue: Flag.String("queue").pipe(Flag.optional),
  kind: Flag.String("kind").pipe(Flag.optional),
  tag: Flag.String("tag").pipe(Flag.optional)
}

const dlqFilter = (f: {
  readonly queue: Option.Option<string>
  readonly kind: Option.Option<string>
  readonly tag: Option.Option<string>
}) => ({
  queue: Option.getOrUndefined(f.queue),
  kind: Option.getOrUndefined(f.kind),
  tag: Option.getOrUndefined(f.tag)
})

const dlqList = Command.make(
  "list",
  { ...dlqFilterFlags, limit: Flag.Int("limit").pipe(Flag.withDescription("1-1000"), Flag.withDefault(50)) },
  (f) =>
    withAdmin((admin, json) =>
      Effect.gen(function* () {
        const entries = yield* admin.listDlq({ ...dlqFilter(f), limit: f.limit })
        yield* print(json, { entries }, () =>
          renderTable(
            ["id", "queue", "kind", "reason", "attempt", "dead-lettered at", "last error"],
            entries.map((e) => [
              e.id,
              e.queue,
              e.kind,
              e.reason,
              `${e.attempt}/${e.maxAttempts}`,
              e.dlqAt,
              e.errors.at(-1)?.error ?? "-"
            ])
          )
        )
      })
    )
).pipe(Command.withDescription("list dead-lettered jobs, newest first"))

const dlqShow = Command.make("show", { id: idArgument }, ({ id }) =>
  withAdmin((admin, json) =>
    Effect.gen(function* () {
      const entry = yield* admin.getDlq(yield* parseId(id))
      yield* print(json, entry, () => renderRecord({ ...entry }))
    })
  )
).pipe(Command.withDescription("one dead-lettered job with its errors"))

const optionalId = Argument.String("id").pipe(
  Argument.withDescription("one job id; without it, every entry the filter matches"),
  Argument.optional
)

const bulkOrOne = (
  verb: "retry" | "purge",
  f: {
    readonly id: Option.Option<string>
    readonly queue: Option.Option<string>
    readonly kind: Option.Option<string>
    readonly tag: Option.Option<string>
    readonly all: boolean
  }
) =>
  withAdmin((admin, json) =>
    Effect.gen(function* () {
      if (Option.isSome(f.id)) {
        const id = yield* parseId(f.id.value)
        if (verb === "retry") {
          const job = yield* admin.retryDlq(id)
          return yield* print(json, { retried: 1, job }, () => `job ${id} retried: ${job.state}`)
        }
        yield* admin.purgeDlq(id)
        return yield* print(json, { purged: 1 }, () => `job ${id} purged`)
      }
      if (!json)
        yield* Console.error(
          `${verb === "retry" ? "retrying" : "purging"} in batches of 500 (Ctrl-C keeps the batches done)…`
        )
      // the total is known from the statistics when the filter is at most a queue
      const filter = dlqFilter(f)
      const queues =
        Option.isNone(f.kind) && Option.isNone(f.tag) ? (yield* admin.queueStats()).queues : undefined
      const total = queues
        ?.filter((q) => filter.queue === undefined || q.queue === filter.queue)
        .reduce((n, q) => n + q.deadLettered, 0)
      const progress = progressTo(json, total)
      const n =
        verb === "retry"
          ? yield* admin.retryDlqBulk(filter, f.all, progress)
          : yield* admin.purgeDlqBulk(filter, f.all, progress)
      yield* print(
        json,
        verb === "retry" ? { retried: n } : { purged: n },
        () => `${n} entr${n === 1 ? "y" : "ies"} ${verb === "retry" ? "retried" : "purged"}`
      )
    })
  )

const allFlag = Flag.Boolean("all").pipe(
  Flag.withDescription("needed when no filter is given"),
  Flag.withDefault(false)
)

const dlqRetry = Command.make("retry", { id: optionalId, ...dlqFilterFlags, all: allFlag }, (f) =>
  bulkOrOne("retry", f)
).pipe(Command.withDescription("move one entry, or every entry matching the filter, back to work"))

const dlqPurge = Command.make("purge", { id: optionalId, ...dlqFilterFlags, all: allFlag }, (f) =>
  bulkOrOne("purge", f)
).pipe(Command.withDescription("delete one entry, or every entry matching the filter"))

const dlq = Command.make("dlq").pipe(
  Command.withSubcommands([dlqList, dlqShow, dlqRetry, dlqPurge]),
  Command.withDescription("the dead letter queue")
)

// callback complete|fail|retry|resume (issue 21) ------------------------------------------------
// A job waiting for its callback, by job id: the operator answers in the external system's place.
// Cancel is `jobs cancel`.

const withCallbacks = <A, E>(
  body: (callbacks: Callbacks.Callbacks["Service"], json: boolean) => Effect.Effect<A, E>
) =>
  Effect.gen(function* () {
    const { admin, json } = yield* adminLayer
    return yield* Effect.flatMap(Effect.service(Callbacks.Callbacks), (c) => body(c, json)).pipe(
      Effect.provide(admin)
    )
  })

const callbackCommand = (
  name: "complete" | "fail" | "retry" | "resume",
  description: string,
  action: (flags: {
    readonly error: string
    readonly payload: Option.Option<string>
  }) => Effect.Effect<Parameters<Callbacks.Callbacks["Service"]["resolveWaiting"]>[1], UsageError>
) =>
  Command.make(
    name,
    {
      id: idArgument,
      error: Flag.String("error").pipe(Flag.withDefault("failed by operator")),
      payload: Flag.String("payload").pipe(Flag.optional)
    },
    (f) =>
      withCallbacks((callbacks, json) =>
        Effect.gen(function* () {
          const jobId = yield* parseId(f.id)
          const r = yield* callbacks.resolveWaiting(jobId, yield* action(f))
          yield* print(json, r, () => `job ${r.jobId} is ${r.state}`)
        })
      )
  ).pipe(Command.withDescription(description))

const payloadOf = (text: Option.Option<string>) =>
  Option.match(text, {
    onNone: () => Effect.succeed(null as unknown),
    onSome: (t) =>
      Effect.try({
        try: () => JSON.parse(t) as unknown,
        catch: () => new UsageError({ message: "--payload must be JSON" })
      })
  })

const callback = Command.make("callback").pipe(
  Command.withSubcommands([
    callbackCommand("complete", "complete a job that waits for its callback", () =>
      Effect.succeed({ _tag: "Complete" })
    ),
    callbackCommand("fail", "fail a waiting job (--error)", (f) =>
      Effect.succeed({ _tag: "Fail", error: f.error })
    ),
    callbackCommand("retry", "run a parked job again from attempt 0", () =>
      Effect.succeed({ _tag: "Retry" })
    ),
    callbackCommand("resume", "resume a waiting job with --payload (JSON)", (f) =>
      Effect.map(payloadOf(f.payload), (payload) => ({ _tag: "Resume", payload }))
    )
  ]),
  Command.withDescription("answer a job that waits for an external callback")
)

// cron list|pause|resume|trigger --------------------------------------------------------------------

const cronName = Argument.String("name").pipe(Argument.withDescription("schedule name"))

const cronList = Command.make("list", {}, () =>
  withAdmin((admin, json) =>
    Effect.gen(function* () {
      const snapshot = yield* admin.listCron
      yield* print(json, snapshot, () =>
        renderTable(
          ["name", "expression", "timezone", "queue", "kind", "paused", "last fire", "stale"],
          snapshot.schedules.map((s) => [
            s.name,
            s.expression,
            s.timezone,
            s.job.queue,
            s.job.kind,
            s.paused ? "yes" : "no",
            s.lastFireAt,
            s.staleSince === null ? "no" : "yes"
          ])
        )
      )
    })
  )
).pipe(Command.withDescription("every cron schedule"))

const cronPause = Command.make("pause", { name: cronName }, ({ name }) =>
  withAdmin((admin, json) =>
    Effect.andThen(
      admin.pauseCron(name),
      print(json, { name, paused: true }, () => `schedule ${name} paused`)
    )
  )
).pipe(Command.withDescription("stop a schedule from firing"))

const cronResume = Command.make("resume", { name: cronName }, ({ name }) =>
  withAdmin((admin, json) =>
    Effect.andThen(
      admin.resumeCron(name),
      print(json, { name, paused: false }, () => `schedule ${name} resumed`)
    )
  )
).pipe(Command.withDescription("let a paused schedule fire again"))

const cronTrigger = Command.make("trigger", { name: cronName }, ({ name }) =>
  withAdmin((admin, json) =>
    Effect.gen(function* () {
      const job = yield* admin.triggerCron(name)
      yield* print(json, job, () => `schedule ${name} enqueued job ${job.id} (${job.state})`)
    })
  )
).pipe(Command.withDescription("enqueue a schedule's job now (pause and timing untouched)"))

const cron = Command.make("cron").pipe(
  Command.withSubcommands([cronList, cronPause, cronResume, cronTrigger]),
  Command.withDescription("cron schedules")
)

// doctor ------------------------------------------------------------------------------------

const doctor = Command.make("doctor", {}, () =>
  withAdmin((admin, json) =>
    Effect.gen(function* () {
      const checks = yield* admin.doctor
      yield* print(json, { checks }, () =>
        checks
          .map(
            (c) =>
              `${c.status.toUpperCase().padEnd(4)}  ${c.name}: ${c.detail}${c.fix === "" ? "" : `\n      fix: ${c.fix}`}`
          )
          .join("\n")
      )
      const bad = checks.filter((c) => c.status !== "pass")
      if (bad.length > 0) return yield* new NotReady({ reason: bad.map((c) => c.name).join(", ") })
    })
  )
).pipe(Command.withDescription("check the server and schema; exit 2 when something needs attention"))

// serve -------------------------------------------------------------------------------------

const loopback = (host: string) => host === "127.0.0.1" || host === "::1" || host === "localhost"

const serve = Command.make(
  "serve",
  {
    host: Flag.String("host").pipe(Flag.withDescription("address to bind"), Flag.withDefault("127.0.0.1")),
    port: Flag.Int("port").pipe(Flag.withDefault(3000)),
    token: Flag.String("token").pipe(
      Flag.withDescription("bearer token for actions (default: the AWA_ADMIN_TOKEN environment variable)"),
      Flag.optional
    ),
    authReads: Flag.Boolean("auth-reads").pipe(
      Flag.withDescription("reads need the token too"),
      Flag.withDefault(false)
    ),
    readOnly: Flag.Boolean("read-only").pipe(
      Flag.withDescription("refuse every action (503)"),
      Flag.withDefault(false)
    ),
    insecureNoAuth: Flag.Boolean("insecure-no-auth").pipe(
      Flag.withDescription("allow actions without a token (and a non-loopback bind without one)"),
      Flag.withDefault(false)
    ),
    traceLink: Flag.String("trace-link").pipe(
      Flag.withDescription(
        "the dashboard's link for a trace id, {traceId} replaced (e.g. https://tempo/trace/{traceId})"
      ),
      Flag.optional
    ),
    shutdownGrace: Flag.Int("shutdown-grace").pipe(
      Flag.withDescription(
        "seconds /readyz answers 503 (shutting down) before the server stops, on SIGTERM/SIGINT"
      ),
      Flag.withDefault(5)
    )
  },
  (f) =>
    Effect.gen(function* () {
      const token = Option.getOrUndefined(f.token) ?? process.env.AWA_ADMIN_TOKEN
      if (!loopback(f.host) && (token === undefined || token === "") && !f.insecureNoAuth)
        return yield* new UsageError({
          message: `binding ${f.host} needs an admin token (--token or AWA_ADMIN_TOKEN) or --insecure-no-auth`
        })
      // the pool: the readiness listener holds one connection, requests share the others
      const { admin, schema } = yield* adminLayerWith(5)
      const readiness = Readiness.layer.pipe(Layer.provide(StorageSignals.layerPg({ schema })))
      const secret = token === undefined || token === "" ? undefined : Redacted.make(token)
      const server = HttpRouter.serve(
        Layer.mergeAll(
          AdminApi.layer({
            token: secret,
            authReads: f.authReads,
            readOnly: f.readOnly,
            insecureNoAuth: f.insecureNoAuth
          }),
          Dashboard.layer({
            token: secret,
            authReads: f.authReads,
            traceLinkTemplate: Option.getOrUndefined(f.traceLink)
          })
        ),
        { disableLogger: true }
      ).pipe(
        Layer.provide(NodeHttpServer.layer(createServer, { port: f.port, host: f.host })),
        Layer.provideMerge(Layer.provideMerge(readiness, admin))
      )
      yield* Console.error(
        `awa admin API on http://${f.host}:${f.port} (dashboard: /dashboard, OpenAPI: /openapi.json)`
      )
      // Until interrupted (SIGTERM/SIGINT). Closing the scope runs its finalizers last-added
      // first: /readyz says "shutting down" for the grace period while the server still answers
      // everything else, and only then the server and its pool close.
      return yield* Effect.scoped(
        Effect.gen(function* () {
          const context = yield* Layer.build(server)
          const ready = Context.get(context, Readiness.Readiness)
          yield* Effect.addFinalizer(() =>
            ready.beginShutdown.pipe(
              Effect.andThen(Console.error(`shutting down: /readyz answers 503 for ${f.shutdownGrace} s`)),
              Effect.andThen(Effect.sleep(Duration.seconds(f.shutdownGrace)))
            )
          )
          return yield* Effect.never
        })
      )
    })
).pipe(
  Command.withDescription(
    "serve the admin HTTP API (/api, /healthz, /readyz, /openapi.json) and the dashboard (/dashboard) until stopped"
  )
)

/** The whole command tree. */
export const command = root.pipe(
  Command.withSubcommands([
    migrate,
    status,
    queues,
    queue,
    keyPolicy,
    jobs,
    dlq,
    cron,
    doctor,
    wakeOnDemand,
    serve,
    callback
  ])
)

export const version = "0.1.0"

/** A failure's message for stderr; `undefined` for the ones already reported (help, not-ready). */
const messageOf = (error: unknown): string | undefined => {
  if (typeof error !== "object" || error === null) return String(error)
  const tagged = error as { readonly _tag?: string; readonly message?: string }
  switch (tagged._tag) {
    case "NotReady":
    case "ShowHelp":
      return undefined
    case "UsageError":
      return tagged.message
    case "SqlError":
      return `database error: ${tagged.message ?? ""}`
    default:
      return `${tagged._tag ?? "error"}: ${tagged.message ?? toJson(error)}`
  }
}

/**
 * Runs the command line `args` (without `node` and the script) and returns its exit code; never
 * fails. Usage and errors go to `Console.error`, results to `Console.log`.
 */
export const run = (args: ReadonlyArray<string>) =>
  Command.runWith(command, { version })(args).pipe(
    Effect.exit,
    Effect.flatMap((exit) => {
      if (Exit.isSuccess(exit)) return Effect.succeed(0)
      const error = Cause.findErrorOption(exit.cause)
      if (Option.isNone(error)) return Effect.as(Console.error(Cause.pretty(exit.cause)), 1)
      const e = error.value as { readonly _tag?: string; readonly errors?: ReadonlyArray<unknown> }
      if (e._tag === "NotReady") return Effect.succeed(exitNotReady)
      // help asked for (no errors) is a success; a parse error was printed with the help
      if (e._tag === "ShowHelp") return Effect.succeed(e.errors !== undefined && e.errors.length > 0 ? 1 : 0)
      const message = messageOf(e)
      return Effect.as(message === undefined ? Effect.void : Console.error(message), 1)
    })
  )
