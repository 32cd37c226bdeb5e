/**
 * `KeyGrants` on Postgres (migration 0033, docs/adr/0029-key-execution-grants.md). The claim is
 * one call of `claim_keyed`; policy changes are `key_policy_lower` (its own transaction: the
 * drain must be committed before the open grants are verified) and `key_policy_activate`, retried
 * every `verifyPollMs` until the keys are within the target or the timeout passes.
 */

import { checkQueueName, ValidationError } from "@awa/core"
import { Migrations } from "@awa/sql"
import { Clock, Effect, Layer } from "effect"
import { SqlClient, SqlError } from "effect/sql"
import { checkFleetRate } from "./FlowStorage.ts"
import * as HotConnections from "./HotConnections.ts"
import {
  type KeyedClaim,
  type KeyedClaimParams,
  type KeyGrantStats,
  KeyGrants,
  type KeyPolicy,
  type KeyPolicyChange,
  KeyPolicyNotFound,
  type KeyPolicyState,
  policyLimits,
  StaleKeyPolicyEpoch
} from "./KeyGrants.ts"
import { type ClaimRow, claimedJobsOf } from "./PgQueueStorage.ts"
import * as ReadCommitted from "./ReadCommitted.ts"
import { checkInteger, maxClaimBatch } from "./StorageChecks.ts"
import { cancelChannel, closedPayload, gatedPayload } from "./StorageSignals.ts"

/** SQLSTATE of claim_keyed for a policy that does not exist. */
const missingPolicyCode = "AWK01"
/** Pause between two verifications of a pending change. */
const verifyPollMs = 50

interface PolicyRow {
  readonly id: string
  readonly max_in_flight: number
  readonly state: KeyPolicyState
  readonly target: number | null
  readonly epoch: bigint | string
}

const toPolicy = (r: PolicyRow): KeyPolicy => ({
  id: r.id,
  maxInFlight: r.max_in_flight,
  state: r.state,
  target: r.target,
  epoch: BigInt(r.epoch)
})

/** Checks a policy id: 1–200 characters, no NUL, no leading or trailing whitespace. */
export const checkPolicyId = (id: unknown): Effect.Effect<string, ValidationError> =>
  typeof id === "string" &&
  id.length >= 1 &&
  id.length <= policyLimits.idMaxLength &&
  !id.includes("\u0000") &&
  id.trim() === id
    ? Effect.succeed(id)
    : Effect.fail(
        new ValidationError({
          field: "id",
          reason: `must be 1–${policyLimits.idMaxLength} characters, no NUL, no surrounding whitespace`
        })
      )

export const checkLimit = (field: string, value: number) =>
  checkInteger(field, value, policyLimits.minMaxInFlight, policyLimits.maxMaxInFlight)

const isMissingPolicy = (error: unknown): boolean =>
  SqlError.isSqlError(error) &&
  (error.reason as { cause?: { code?: unknown } }).cause?.code === missingPolicyCode

/** Options of the Postgres key-grants layer. */
export interface PgKeyGrantsOptions {
  /** Schema Awa is installed in. Default `"awa"`. */
  readonly schema?: string | undefined
  /**
   * Run `claim_keyed` on the storage's own connections (`HotConnections`, ADR 0033, as
   * `PgQueueStorageOptions.hotConnections`): the set in context, else one of this layer's.
   * Default `true`.
   */
  readonly hotConnections?: boolean | undefined
}

export const make = Effect.fnUntraced(function* (options: PgKeyGrantsOptions = {}) {
  const sql = yield* SqlClient.SqlClient
  const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
  const s = sql(schema)
  const rc = ReadCommitted.make(sql)
  const hot = yield* HotConnections.forLayer(options.hotConnections)

  const show = (id: string) =>
    Effect.gen(function* () {
      yield* checkPolicyId(id)
      const rows = yield* sql<PolicyRow>`
        SELECT id, max_in_flight, state, target, epoch::text AS epoch FROM ${s}.key_policies WHERE id = ${id}`
      if (rows.length === 0) return yield* new KeyPolicyNotFound({ id })
      return toPolicy(rows[0]!)
    })

  const create = (policy: { readonly id: string; readonly maxInFlight: number }) =>
    Effect.gen(function* () {
      yield* checkPolicyId(policy.id)
      yield* checkLimit("maxInFlight", policy.maxInFlight)
      yield* sql`INSERT INTO ${s}.key_policies (id, max_in_flight) VALUES (${policy.id}, ${policy.maxInFlight})
                 ON CONFLICT (id) DO NOTHING`
      const existing = yield* show(policy.id).pipe(Effect.orDie)
      if (existing.maxInFlight !== policy.maxInFlight && existing.state !== "draining") {
        return yield* new ValidationError({
          field: "maxInFlight",
          reason: `policy "${policy.id}" exists with maxInFlight ${existing.maxInFlight}: change it with lower`
        })
      }
      return existing
    })

  // 'activated' | 'over' | 'stale' | 'missing' (key_policy_activate)
  const activate = (id: string, epoch: bigint, target: number) =>
    Effect.map(
      rc(
        "keyPolicies.activate",
        sql<{
          r: string
        }>`SELECT ${s}.key_policy_activate(${id}, ${epoch.toString()}::bigint, ${target}) AS r`
      ),
      (rows) => rows[0]!.r
    )

  const settle = (id: string, epoch: bigint, target: number, outcome: string) =>
    outcome === "activated"
      ? Effect.succeed<KeyPolicyChange>({ epoch, state: "active" })
      : outcome === "over"
        ? Effect.succeed<KeyPolicyChange>({ epoch, state: "draining" })
        : outcome === "missing"
          ? Effect.fail(new KeyPolicyNotFound({ id }))
          : Effect.fail(new StaleKeyPolicyEpoch({ id, epoch, target }))

  const lower = (id: string, target: number, opts?: { readonly verifyTimeoutMs?: number | undefined }) =>
    Effect.gen(function* () {
      yield* checkPolicyId(id)
      yield* checkLimit("target", target)
      const timeoutMs = opts?.verifyTimeoutMs ?? policyLimits.defaultVerifyTimeoutMs
      yield* checkInteger("verifyTimeoutMs", timeoutMs, 0, policyLimits.maxVerifyTimeoutMs)
      // Its own transaction: the drain is committed (and every claim that read the old state has
      // finished) before the grants are verified.
      const rows = yield* rc(
        "keyPolicies.lower",
        sql<{ epoch: string | null }>`SELECT ${s}.key_policy_lower(${id}, ${target})::text AS epoch`
      )
      const raw = rows[0]?.epoch
      if (raw === null || raw === undefined) return yield* new KeyPolicyNotFound({ id })
      const epoch = BigInt(raw)
      const deadline = (yield* Clock.currentTimeMillis) + timeoutMs
      for (;;) {
        const outcome = yield* activate(id, epoch, target)
        if (outcome !== "over" || (yield* Clock.currentTimeMillis) >= deadline)
          return yield* settle(id, epoch, target, outcome)
        yield* Effect.sleep(verifyPollMs)
      }
    })

  const resume = (id: string, epoch: bigint, target: number) =>
    Effect.gen(function* () {
      yield* checkPolicyId(id)
      yield* checkLimit("target", target)
      return yield* settle(id, epoch, target, yield* activate(id, epoch, target))
    })

  const cancelChange = (id: string, epoch: bigint, target: number) =>
    Effect.gen(function* () {
      yield* checkPolicyId(id)
      yield* checkLimit("target", target)
      const rows = yield* sql<PolicyRow>`
        UPDATE ${s}.key_policies kp SET state = 'active', target = NULL, epoch = kp.epoch + 1, updated_at = now()
        WHERE kp.id = ${id} AND kp.epoch = ${epoch.toString()}::bigint AND kp.state = 'draining' AND kp.target = ${target}
        RETURNING kp.id, kp.max_in_flight, kp.state, kp.target, kp.epoch::text AS epoch`
      if (rows.length > 0) return toPolicy(rows[0]!)
      yield* show(id)
      return yield* new StaleKeyPolicyEpoch({ id, epoch, target })
    })

  const forceDisable = (id: string) =>
    Effect.gen(function* () {
      yield* checkPolicyId(id)
      const rows = yield* sql<PolicyRow>`
        UPDATE ${s}.key_policies kp SET state = 'disabled', target = NULL, epoch = kp.epoch + 1, updated_at = now()
        WHERE kp.id = ${id}
        RETURNING kp.id, kp.max_in_flight, kp.state, kp.target, kp.epoch::text AS epoch`
      if (rows.length === 0) return yield* new KeyPolicyNotFound({ id })
      return toPolicy(rows[0]!)
    })

  const claim = (params: KeyedClaimParams) =>
    Effect.gen(function* () {
      yield* checkQueueName(params.queue)
      yield* checkPolicyId(params.policy)
      yield* checkInteger("max", params.max, 0, maxClaimBatch)
      if (params.rate !== undefined) yield* checkFleetRate(params.rate)
      type Row = Omit<ClaimRow, "job_id"> & {
        readonly job_id: bigint | null
        readonly gate: string | null
        readonly next_token_at?: Date | null
      }
      // under a fleet rate, claim_keyed within the queue's tokens (migration 0045)
      const statement =
        params.rate === undefined
          ? sql<Row>`SELECT * FROM ${s}.claim_keyed(${params.queue}, ${params.policy}, ${params.max}, ${params.deadlineMs}::bigint, ${params.agingIntervalMs}::bigint)`
          : sql<Row>`SELECT * FROM ${s}.claim_keyed_rated(${params.queue}, ${params.policy}, ${params.max}, ${params.deadlineMs}::bigint, ${params.agingIntervalMs}::bigint, ${params.rate.maxRate}::float8, ${params.rate.burst})`
      const rows = yield* hot.run(statement, rc("claim", statement)).pipe(
        ReadCommitted.mapRefusal("claim"),
        Effect.catchIf(isMissingPolicy, () => Effect.fail(new KeyPolicyNotFound({ id: params.policy })))
      )
      if (rows.length === 0) return { _tag: "Idle" } as KeyedClaim
      const gate = rows[0]!.gate
      const nextTokenAt = rows[0]!.next_token_at ?? undefined
      if (rows[0]!.job_id === null) {
        // 0045: a row without a job or a gate is the rate's: no token left
        if (gate === null && nextTokenAt !== undefined)
          return { _tag: "Throttled", nextTokenAt } as KeyedClaim
        return (
          gate === "keyLockContended" ? { _tag: "KeyLockContended" } : { _tag: "KeyGated" }
        ) as KeyedClaim
      }
      // a first row with a job: every row has one (a gate or rate row comes alone)
      const jobs = claimedJobsOf(rows as ReadonlyArray<ClaimRow>)
      // 0041: every row carries why the call stopped short, if it did
      const blocked = gate === "keyGated" ? "gated" : gate === "keyLockContended" ? "contended" : undefined
      return { _tag: "Claimed", jobs, blocked, nextTokenAt } as KeyedClaim
    })

  const openGrants = (policy: string, key: string) =>
    Effect.map(
      sql<{ n: number }>`SELECT ${s}.key_open_grants(${policy}, ${s}.key_digest(${key})) AS n`,
      (rows) => rows[0]!.n
    )

  const stats = Effect.map(
    sql<{
      id: string
      state: KeyPolicyState
      open_grants: number
      keys_at_limit: number
      oldest: Date | null
    }>`
      SELECT kp.id, kp.state, coalesce(sum(g.n), 0)::int AS open_grants,
             count(*) FILTER (WHERE g.n >= kp.max_in_flight)::int AS keys_at_limit, min(g.oldest) AS oldest
      FROM ${s}.key_policies kp
      LEFT JOIN LATERAL (
        SELECT count(*) AS n, min(c.claimed_at) AS oldest FROM ${s}.claims c
        WHERE c.key_policy = kp.id
          AND NOT EXISTS (SELECT 1 FROM ${s}.closures x
                          WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease AND x.slot = c.slot)
        GROUP BY c.key_digest
      ) g ON true
      GROUP BY kp.id, kp.state, kp.max_in_flight
      ORDER BY kp.id`,
    (rows) =>
      rows.map(
        (r): KeyGrantStats => ({
          policy: r.id,
          state: r.state,
          openGrants: r.open_grants,
          keysAtLimit: r.keys_at_limit,
          oldestOpenGrantAt: r.oldest
        })
      )
  )

  // On the cancel channel as `key-closed:<policy>` (StorageSignals `Closed`): only claimers that
  // may be waiting for a grant act on it. `key-gated:<policy>` (`Gated`) is a waiting claimer's
  // call for them (ADR 0037).
  const closedChannel = cancelChannel(schema)
  const notifyClosed = (policies: ReadonlyArray<string>) =>
    policies.length === 0
      ? Effect.void
      : Effect.asVoid(
          sql`SELECT pg_notify(${closedChannel}, p) FROM jsonb_array_elements_text(${JSON.stringify([...new Set(policies)].map(closedPayload))}::jsonb) AS p`
        )

  const notifyGated = (policy: string) =>
    Effect.asVoid(sql`SELECT pg_notify(${closedChannel}, ${gatedPayload(policy)})`)

  return KeyGrants.of({
    create,
    show,
    lower,
    resume,
    cancelChange,
    forceDisable,
    claim,
    openGrants,
    stats,
    notifyClosed,
    notifyGated
  })
})

export const layer = (options: PgKeyGrantsOptions = {}) => Layer.effect(KeyGrants, make(options))
