/**
 * Shared fixtures of the Postgres storage tests (properties, prune, ledgers): retention
 * policies, fresh queue names, job and claim parameters, and completing a claimed batch.
 */
import { randomUUID } from "node:crypto"
import { Effect } from "effect"
import { type ClaimedJob, QueueStorage, type RetentionParams } from "../src/QueueStorage.ts"

export const day = 86_400_000
export const keepAll: RetentionParams = { completedMs: day, failedMs: 3 * day, cancelledMs: 3 * day }
export const keepNothing: RetentionParams = { completedMs: 0, failedMs: 0, cancelledMs: 0 }

/** A queue name no other test uses. */
export const fresh = (label: string) => `${label}-${randomUUID().slice(0, 8)}`

/** Claim parameters with no deadline and no aging. */
export const claimOf = (queue: string, max: number) => ({ queue, max, deadlineMs: 0, agingIntervalMs: 0 })

/** Completes every attempt of a claimed batch. */
export const completeAll = (claimed: ReadonlyArray<ClaimedJob>) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.finalizeMany(
      claimed.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
    )
  )
