/**
 * Unique state masks and re-entry (capabilities.md §4; issue 14 property 3): the cases every
 * `QueueStorage` layer passes, run on Postgres by `PgQueueStorage.masks.test.ts` and on the
 * simulation by `SimQueueStorage.masks.test.ts`. A job holds its key exactly while its state is in
 * its mask; a job that re-enters its mask (retry, rescue, snooze, promotion, or a claim when the
 * mask holds `running` but not `available`) while another job holds the key is cancelled with
 * `superseded by duplicate <id>`.
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
  it.effect(
    "mask with running but not available: the key is taken at claim; a duplicate reaching the head is superseded and the claim goes on down the lane",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("mask-claim")
        const mask: Array<JobState> = ["scheduled", "running"]
        // available is not in the mask: no key at enqueue, both are accepted
        const [a] = yield* storage.enqueueMany([keyed(q, mask)])
        const [b] = yield* storage.enqueueMany([keyed(q, mask)])
        const [c] = yield* storage.enqueueMany([{ kind: "mask_job", queue: q, args: { n: 3 } }])
        const [ca] = yield* storage.claim(claimOf(q, 1))
        assert.strictEqual(ca!.jobId, a!.id)
        // a runs holding its key: a scheduled duplicate (scheduled is in the mask) is refused
        const refused = yield* Effect.flip(
          storage.enqueueMany([keyed(q, mask, { runAt: yield* later(60_000) })])
        )
        assert.strictEqual(refused._tag, "UniqueConflict")
        if (refused._tag === "UniqueConflict") assert.strictEqual(refused.existingJobId, a!.id)
        // b reaches the head while a holds the key: superseded, and claim(1) returns the next job
        const next = yield* storage.claim(claimOf(q, 1))
        assert.deepStrictEqual(
          next.map((x) => x.jobId),
          [c!.id]
        )
        const vb = yield* storage.getJob(b!.id)
        assert.strictEqual(vb.state, "cancelled")
        assert.strictEqual(vb.attempt, 0)
        assert.strictEqual(vb.errors.at(-1)!.error, `cancelled: superseded by duplicate ${a!.id}`)
        assert.deepStrictEqual(yield* storage.claim(claimOf(q, 1)), [])
        // a completes (completed is not in the mask): the key is free, the next duplicate runs
        yield* storage.finalizeMany([
          { jobId: ca!.jobId, runLease: ca!.runLease, outcome: { _tag: "Complete" } }
        ])
        const [d] = yield* storage.enqueueMany([keyed(q, mask)])
        const [cd] = yield* storage.claim(claimOf(q, 1))
        assert.strictEqual(cd!.jobId, d!.id)
      })
  )

  it.effect(
    "mask with running but not available: of two duplicates in one claim, the first in lane order runs",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("mask-claim-batch")
        const mask: Array<JobState> = ["running"]
        const [a] = yield* storage.enqueueMany([keyed(q, mask)])
        const [b] = yield* storage.enqueueMany([keyed(q, mask)])
        const [c] = yield* storage.enqueueMany([{ kind: "mask_job", queue: q, args: { n: 4 } }])
        // (Postgres returns the rows that take their key at claim after the call's other rows)
        const claimed = yield* storage.claim(claimOf(q, 10))
        assert.sameMembers(
          claimed.map((x) => x.jobId),
          [a!.id, c!.id]
        )
        const vb = yield* storage.getJob(b!.id)
        assert.strictEqual(vb.state, "cancelled")
        assert.strictEqual(vb.errors.at(-1)!.error, `cancelled: superseded by duplicate ${a!.id}`)
      })
  )

  it.effect(
    "mask with running but not available: concurrent claimers of two queues' jobs with one key run one, supersede the other",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const qa = freshQueue("mask-claim-a")
        const qb = freshQueue("mask-claim-b")
        // byQueue is off: the same kind and args give both queues' jobs one key
        const args = { key: `${qa}+${qb}` }
        const job = (queue: string): NewJob => ({
          kind: "mask_job",
          queue,
          args,
          unique: { byArgs: true, states: ["running"] }
        })
        const [a] = yield* storage.enqueueMany([job(qa)])
        const [b] = yield* storage.enqueueMany([job(qb)])
        const [ra, rb] = yield* Effect.all([storage.claim(claimOf(qa, 1)), storage.claim(claimOf(qb, 1))], {
          concurrency: 2
        })
        const ran = [...ra!, ...rb!].map((x) => x.jobId)
        assert.strictEqual(ran.length, 1)
        const winner = ran[0]!
        const loser = winner === a!.id ? b!.id : a!.id
        const vl = yield* storage.getJob(loser)
        assert.strictEqual(vl.state, "cancelled")
        assert.strictEqual(vl.errors.at(-1)!.error, `cancelled: superseded by duplicate ${winner}`)
        assert.strictEqual((yield* storage.getJob(winner)).state, "running")
      })
  )
  it.effect(
    "one claim hands a key from a job leaving its mask (available only) to the next entering it (running only)",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("mask-claim-handover")
        const [a] = yield* storage.enqueueMany([keyed(q, ["available"])])
        // running is not in b's mask's initial state: accepted beside a, no key yet
        const [b] = yield* storage.enqueueMany([keyed(q, ["running"])])
        const claimed = yield* storage.claim(claimOf(q, 10))
        assert.sameMembers(
          claimed.map((x) => x.jobId),
          [a!.id, b!.id]
        )
        // a released the key as it left available, b took it as it entered running
        const conflict = yield* Effect.flip(storage.enqueueMany([keyed(q, ["available"])]))
        assert.strictEqual(conflict._tag, "UniqueConflict")
        if (conflict._tag === "UniqueConflict") assert.strictEqual(conflict.existingJobId, b!.id)
      })
  )
}
