/**
 * Unique state masks and re-entry (capabilities.md §4; issue 14 property 3): the cases every
 * `QueueStorage` layer passes, run on Postgres by `PgQueueStorage.masks.test.ts` and on the
 * simulation by `SimQueueStorage.masks.test.ts`. A job holds its key exactly while its state is in
 * its mask; a job that re-enters its mask (retry, rescue, snooze, promotion) while a newer job
 * holds the key is cancelled with `superseded by duplicate <id>`.
 */
import { randomUUID } from "node:crypto"
import type { JobState, NewJob } from "@awa/core"
import type { Vitest } from "@effect/vitest"
import { assert } from "@effect/vitest"
import { Clock, Effect } from "effect"
import { type ClaimParams, QueueStorage } from "../../src/QueueStorage.ts"

export interface MasksOptions {
  /** Lets storage time pass: a real sleep on Postgres, `TestClock.adjust` in the simulation. */
  readonly advance: (ms: number) => Effect.Effect<void>
}

const freshQueue = (label: string) => `${label}-${randomUUID().slice(0, 8)}`
const keyed = (queue: string, states: ReadonlyArray<JobState>, extra: Partial<NewJob> = {}): NewJob => ({
  kind: "mask_job",
  queue,
  args: { key: queue },
  unique: { byArgs: true, states: [...states] },
  ...extra
})
const claimOf = (queue: string, max: number, extra: Partial<ClaimParams> = {}): ClaimParams => ({
  queue,
  max,
  deadlineMs: 0,
  agingIntervalMs: 0,
  ...extra
})

/** A run time `ms` from now on the storage's clock (a scheduled job, due after `advance(ms + …)`). */
const later = (ms: number) => Effect.map(Clock.currentTimeMillis, (now) => new Date(now + ms))
/** Far enough ahead that a loaded machine still enqueues the job as scheduled. */
const dueIn = 1500

export const masksSuite = (it: Vitest.MethodsNonLive<QueueStorage>, { advance }: MasksOptions) => {
  it.effect("a mask that omits the initial state takes no key at enqueue; the key follows the state", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("mask-follow")
      const mask: Array<JobState> = ["available", "completed"]
      const [a] = yield* storage.enqueueMany([keyed(q, mask)])
      // available is in the mask: a duplicate is rejected
      const dup = yield* Effect.flip(storage.enqueueMany([keyed(q, mask)]))
      assert.strictEqual(dup._tag, "UniqueConflict")
      // running is not: claiming releases the key, and a duplicate is accepted
      const [ca] = yield* storage.claim(claimOf(q, 1))
      assert.strictEqual(ca!.jobId, a!.id)
      const [b] = yield* storage.enqueueMany([keyed(q, mask)])
      // a completes: completed is in the mask, but b holds the key; a finishes all the same
      yield* storage.finalizeMany([
        { jobId: ca!.jobId, runLease: ca!.runLease, outcome: { _tag: "Complete" } }
      ])
      assert.strictEqual((yield* storage.getJob(a!.id)).state, "completed")
      const conflict = yield* Effect.flip(storage.enqueueMany([keyed(q, mask)]))
      assert.strictEqual(conflict._tag, "UniqueConflict")
      if (conflict._tag === "UniqueConflict") assert.strictEqual(conflict.existingJobId, b!.id)
      // a mask of only a terminal state: no key until then, so duplicates queue up freely
      const r = freshQueue("mask-terminal")
      yield* storage.enqueueMany([keyed(r, ["completed"])])
      yield* storage.enqueueMany([keyed(r, ["completed"])])
      assert.strictEqual((yield* storage.claim(claimOf(r, 10))).length, 2)
    })
  )

  it.effect(
    "mask without running: a duplicate enqueued while the first runs wins; the first, retried, is superseded and the rest of the batch applies",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("mask-retry")
        const mask: Array<JobState> = ["scheduled", "available", "retryable"]
        const [a] = yield* storage.enqueueMany([keyed(q, mask)])
        const [other] = yield* storage.enqueueMany([{ kind: "mask_job", queue: q, args: { n: 1 } }])
        const [ca, co] = yield* storage.claim(claimOf(q, 2))
        assert.strictEqual(ca!.jobId, a!.id)
        const [b] = yield* storage.enqueueMany([keyed(q, mask)])
        const results = yield* storage.finalizeMany([
          {
            jobId: ca!.jobId,
            runLease: ca!.runLease,
            outcome: { _tag: "Retry", delayMs: 0, error: "flaky" }
          },
          { jobId: co!.jobId, runLease: co!.runLease, outcome: { _tag: "Retry", delayMs: 0, error: "flaky" } }
        ])
        assert.deepStrictEqual(
          results.map((x) => (x._tag === "Applied" ? x.state : x._tag)),
          ["cancelled", "retryable"]
        )
        const view = yield* storage.getJob(a!.id)
        assert.strictEqual(view.state, "cancelled")
        assert.strictEqual(view.errors.at(-1)!.error, `cancelled: superseded by duplicate ${b!.id}`)
        assert.strictEqual((yield* storage.getJob(b!.id)).state, "available")
        assert.strictEqual((yield* storage.getJob(other!.id)).state, "retryable")
      })
  )

  it.effect(
    "mask without running: a rescued first job is superseded by the duplicate; the sweep goes on",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("mask-rescue")
        const mask: Array<JobState> = ["scheduled", "available", "retryable"]
        const [a] = yield* storage.enqueueMany([keyed(q, mask)])
        const [plain] = yield* storage.enqueueMany([{ kind: "mask_job", queue: q, args: { n: 2 } }])
        yield* storage.claim(claimOf(q, 2, { deadlineMs: 10 }))
        const [b] = yield* storage.enqueueMany([keyed(q, mask)])
        yield* advance(60)
        const rescued = yield* storage.rescueDeadlines(500)
        assert.sameMembers(
          rescued.map((r) => `${r.jobId}:${r.state}`),
          [`${a!.id}:cancelled`, `${plain!.id}:retryable`]
        )
        assert.strictEqual(
          (yield* storage.getJob(a!.id)).errors.at(-1)!.error,
          `cancelled: superseded by duplicate ${b!.id}`
        )
        assert.strictEqual((yield* storage.getJob(b!.id)).state, "available")
      })
  )

  it.effect("promotion into a mask meets a newer holder: the promoted job is superseded", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("mask-promote")
      const mask: Array<JobState> = ["available"]
      const runAt = yield* later(dueIn)
      // scheduled is not in the mask: no key yet, so the available duplicate takes it
      const [a] = yield* storage.enqueueMany([keyed(q, mask, { runAt })])
      assert.strictEqual(a!.state, "scheduled")
      const [b] = yield* storage.enqueueMany([keyed(q, mask)])
      yield* advance(dueIn + 300)
      yield* storage.promoteDue(100)
      const view = yield* storage.getJob(a!.id)
      assert.strictEqual(view.state, "cancelled")
      assert.strictEqual(view.errors.at(-1)!.error, `cancelled: superseded by duplicate ${b!.id}`)
      // once b leaves the mask (claimed), a later scheduled job is promoted and takes the key
      const [cb] = yield* storage.claim(claimOf(q, 1))
      assert.strictEqual(cb!.jobId, b!.id)
      const [c] = yield* storage.enqueueMany([keyed(q, mask, { runAt: yield* later(dueIn) })])
      yield* advance(dueIn + 300)
      yield* storage.promoteDue(100)
      assert.strictEqual((yield* storage.getJob(c!.id)).state, "available")
      const dup = yield* Effect.flip(storage.enqueueMany([keyed(q, mask)]))
      assert.strictEqual(dup._tag, "UniqueConflict")
    })
  )

  it.effect("promotion out of a mask releases the key", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("mask-leave")
      const mask: Array<JobState> = ["scheduled"]
      const [a] = yield* storage.enqueueMany([keyed(q, mask, { runAt: yield* later(dueIn) })])
      const dup = yield* Effect.flip(storage.enqueueMany([keyed(q, mask, { runAt: yield* later(dueIn) })]))
      assert.strictEqual(dup._tag, "UniqueConflict")
      yield* advance(dueIn + 300)
      yield* storage.promoteDue(100)
      assert.strictEqual((yield* storage.getJob(a!.id)).state, "available")
      const [b] = yield* storage.enqueueMany([keyed(q, mask, { runAt: yield* later(dueIn) })])
      assert.strictEqual(b!.state, "scheduled")
    })
  )
}
