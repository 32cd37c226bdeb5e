/**
 * `CallbackStorage` on Postgres: the functions of migration 0034 (register_callback,
 * park_callback, take_callback, callback_info, resolve_callback, cancel_callback, claim_resumed,
 * rescue('callback')). Each runs in READ COMMITTED (its own transaction when the pool's default
 * is another level), as every attempt-scoped storage call does.
 */

import { CallbackNotFound, CallbackStale, InvalidTransition, type JobState } from "@awa/core"
import { Migrations } from "@awa/sql"
import { Effect, Layer, Option } from "effect"
import { SqlClient } from "effect/sql"
import {
  type CallbackAction,
  type CallbackExpressions,
  type CallbackId,
  type CallbackInfo,
  CallbackStorage,
  type ParkResult,
  type RegisterCallback,
  type ResumedJob,
  type TakeResult,
  timeoutMsRange
} from "./CallbackStorage.ts"
import { type ClaimRow, claimedJobsOf } from "./PgQueueStorage.ts"
import type { AttemptToken, RescuedAttempt } from "./QueueStorage.ts"
import * as ReadCommitted from "./ReadCommitted.ts"
import { checkInteger } from "./StorageChecks.ts"

export interface PgCallbackStorageOptions {
  /** Schema Awa is installed in. Default `"awa"`. */
  readonly schema?: string | undefined
}

/** JSON text for a jsonb parameter; `undefined` is JSON null. */
const jsonText = (value: unknown): string => JSON.stringify(value === undefined ? null : value)

/** The expressions object as stored: only the fields given. */
const expressionsJson = (e: CallbackExpressions | undefined): string | null => {
  if (e === undefined) return null
  const out: Record<string, string> = {}
  for (const key of ["filter", "onComplete", "onFail", "transform"] as const) {
    const value = e[key]
    if (value !== undefined) out[key] = value
  }
  return Object.keys(out).length === 0 ? null : JSON.stringify(out)
}

const actionName = {
  Complete: "complete",
  Fail: "fail",
  Retry: "retry",
  Resume: "resume",
  Heartbeat: "heartbeat"
} as const

export const make = Effect.fnUntraced(function* (options: PgCallbackStorageOptions = {}) {
  const sql = yield* SqlClient.SqlClient
  const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
  const s = sql(schema)
  const rc = ReadCommitted.make(sql)

  const register = (token: AttemptToken, params: RegisterCallback) =>
    Effect.gen(function* () {
      yield* checkInteger("timeout", params.timeoutMs, timeoutMsRange.min, timeoutMsRange.max)
      const rows = yield* rc(
        "register_callback",
        sql<{
          id: string | null
        }>`SELECT ${s}.register_callback(${token.jobId}::bigint, ${token.runLease}::bigint,
          ${params.timeoutMs}::bigint, ${expressionsJson(params.expressions)}::jsonb) AS id`
      )
      return Option.fromNullishOr(rows[0]?.id)
    })

  const park = (token: AttemptToken, callbackId: CallbackId) =>
    Effect.map(
      rc(
        "park_callback",
        sql<{ status: string }>`SELECT status FROM ${s}.park_callback(${token.jobId}::bigint,
          ${token.runLease}::bigint, ${callbackId})`
      ),
      (rows): ParkResult =>
        rows[0]?.status === "parked"
          ? { _tag: "Parked" }
          : rows[0]?.status === "resumed"
            ? { _tag: "Resumed" }
            : { _tag: "Stale" }
    )

  const take = (token: AttemptToken, callbackId: CallbackId) =>
    Effect.map(
      rc(
        "take_callback",
        sql<{
          status: string
          result: unknown
        }>`SELECT status, result FROM ${s}.take_callback(${token.jobId}::bigint,
          ${token.runLease}::bigint, ${callbackId})`
      ),
      (rows): TakeResult =>
        rows[0]?.status === "pending"
          ? { _tag: "Pending" }
          : rows[0]?.status === "resumed"
            ? { _tag: "Resumed", payload: rows[0].result }
            : { _tag: "Stale" }
    )

  const info = (callbackId: CallbackId) =>
    Effect.gen(function* () {
      const rows = yield* rc(
        "callback_info",
        sql<{
          status: string
          job_id: bigint | null
          run_lease: bigint | null
          config: CallbackExpressions | null
          waiting: boolean | null
        }>`SELECT status, job_id, run_lease, config, waiting FROM ${s}.callback_info(${callbackId})`
      )
      const row = rows[0]
      if (row === undefined || row.status === "not_found") return yield* new CallbackNotFound({ callbackId })
      if (row.status !== "pending" && row.status !== "resumed")
        return yield* new CallbackStale({ callbackId })
      return {
        callbackId,
        jobId: row.job_id!,
        runLease: row.run_lease!,
        status: row.status,
        expressions: row.config ?? {},
        waiting: row.waiting === true
      } satisfies CallbackInfo
    })

  const resolve = (callbackId: CallbackId, action: CallbackAction) =>
    Effect.gen(function* () {
      if (action._tag === "Heartbeat")
        yield* checkInteger("timeout", action.timeoutMs, timeoutMsRange.min, timeoutMsRange.max)
      const rows = yield* rc(
        "resolve_callback",
        sql<{ result: string; job_id: bigint | null; run_lease: bigint | null; state: JobState | null }>`
          SELECT * FROM ${s}.resolve_callback(${callbackId}, ${actionName[action._tag]},
            ${action._tag === "Resume" ? jsonText(action.payload) : null}::jsonb,
            ${action._tag === "Fail" ? action.error : null}::text,
            ${action._tag === "Heartbeat" ? action.timeoutMs : null}::bigint)`
      )
      const row = rows[0]
      switch (row?.result) {
        case "applied":
          return { jobId: row.job_id!, runLease: row.run_lease!, state: row.state! }
        case "stale":
          return yield* new CallbackStale({ callbackId })
        case "not_waiting":
          return yield* new InvalidTransition({
            jobId: row.job_id!,
            from: "running",
            action: "retry callback of"
          })
        default:
          return yield* new CallbackNotFound({ callbackId })
      }
    })

  const cancel = (token: AttemptToken) =>
    Effect.map(
      rc(
        "cancel_callback",
        sql<{
          ok: boolean
        }>`SELECT ${s}.cancel_callback(${token.jobId}::bigint, ${token.runLease}::bigint) AS ok`
      ),
      (rows) => rows[0]?.ok === true
    )

  const releaseResumed = (token: AttemptToken) =>
    Effect.map(
      rc(
        "release_resumed",
        sql<{
          ok: boolean
        }>`SELECT ${s}.release_resumed(${token.jobId}::bigint, ${token.runLease}::bigint) AS ok`
      ),
      (rows) => rows[0]?.ok === true
    )

  const claimResumed = (queue: string, max: number) =>
    Effect.map(
      rc(
        "claim_resumed",
        sql<
          Omit<ClaimRow, "deadline_at"> & { readonly callback_result: unknown }
        >`SELECT * FROM ${s}.claim_resumed(${queue}, ${max})`
      ),
      (rows) => {
        // parked: the claim's deadline no longer applies (migration 0034); every row carries its
        // own values (claim_resumed's answer is not lean)
        const jobs = claimedJobsOf(rows.map((r) => ({ ...r, deadline_at: null })))
        return rows.map((r, i): ResumedJob => ({ ...jobs[i]!, callbackResult: r.callback_result }))
      }
    )

  const rescueTimedOut = (limit: number) =>
    Effect.map(
      rc(
        "rescue",
        sql<{ job_id: bigint; run_lease: bigint; state: JobState }>`
          SELECT * FROM ${s}.rescue('callback', 0::bigint, ${limit})`
      ),
      (rows) =>
        rows.map(
          (r): RescuedAttempt => ({
            jobId: r.job_id,
            runLease: r.run_lease,
            state: r.state,
            // not looked up for callback timeouts (yet): the counter's queue and kind are empty
            queue: "",
            kind: "",
            reason: "callback_timeout"
          })
        )
    )

  // Reads attempt_state (a plain table) by its primary key's prefix; no lock: the resolution that
  // follows re-checks everything under the attempt's lock.
  const pendingOf = (jobId: bigint) =>
    Effect.map(
      sql<{ callback_id: string }>`SELECT a.callback_id FROM ${s}.attempt_state a
        WHERE a.job_id = ${jobId} AND a.callback_state = 'pending' ORDER BY a.run_lease DESC LIMIT 1`,
      (rows) => Option.fromNullishOr(rows[0]?.callback_id)
    )

  return CallbackStorage.of({
    register,
    park,
    take,
    info,
    resolve,
    cancel,
    claimResumed,
    releaseResumed,
    pendingOf,
    rescueTimedOut
  })
})

export const layer = (options: PgCallbackStorageOptions = {}) => Layer.effect(CallbackStorage, make(options))
