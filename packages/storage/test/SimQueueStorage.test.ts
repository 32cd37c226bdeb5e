import {
  Backoff,
  checkNewJob,
  InvalidTransition,
  JobNotFound,
  type NewJob,
  UniqueConflict,
  uniqueKeyHex,
  ValidationError
} from "@awa/core"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Random } from "effect"
import { TestClock } from "effect/testing"
import { type ClaimedJob, type ClaimParams, QueueStorage } from "../src/QueueStorage.ts"
import * as SimQueueStorage from "../src/SimQueueStorage.ts"
import { suite } from "./contract/QueueStorageContract.ts"

/** Runs a test body against a fresh, empty simulation. */
const sim = <A, E>(body: Effect.Effect<A, E, QueueStorage>) =>
  body.pipe(Effect.provide(SimQueueStorage.layer))

const job = (fields: Partial<NewJob> = {}): NewJob => ({ kind: "email", args: {}, ...fields })

const params = (fields: Partial<ClaimParams> = {}): ClaimParams => ({
  queue: "default",
  max: 10,
  deadlineMs: 0,
  agingIntervalMs: 0,
  ...fields
})

const ids = (claimed: ReadonlyArray<ClaimedJob>) => claimed.map((c) => c.jobId)

const token = (c: ClaimedJob) => ({ jobId: c.jobId, runLease: c.runLease })

describe("SimQueueStorage", () => {
  describe("claim order", () => {
    it.effect("jobs of one lane are claimed in enqueue order, a batch at a time", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          const enqueued = yield* s.enqueueMany([1, 2, 3].map((n) => job({ args: { n } })))
          assert.deepStrictEqual(
            enqueued.map((e) => [e.id, e.state, e.queue]),
            [
              [1n, "available", "default"],
              [2n, "available", "default"],
              [3n, "available", "default"]
            ]
          )
          const first = yield* s.claim(params({ max: 2 }))
          assert.deepStrictEqual(ids(first), [1n, 2n])
          assert.deepStrictEqual(
            first.map((c) => c.args),
            [{ n: 1 }, { n: 2 }]
          )
          assert.deepStrictEqual(
            first.map((c) => [c.attempt, c.runLease]),
            [
              [1, 1n],
              [1, 1n]
            ]
          )
          yield* s.enqueueMany([job({ args: { n: 4 } })])
          assert.deepStrictEqual(ids(yield* s.claim(params())), [3n, 4n])
          assert.deepStrictEqual(yield* s.claim(params()), [])
          assert.strictEqual((yield* s.getJob(1n)).state, "running")
        })
      )
    )

    it.effect("higher-priority lanes are drained first, each lane in FIFO order", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([
            job({ priority: 3 }),
            job({ priority: 1 }),
            job({ priority: 2 }),
            job({ priority: 1 })
          ])
          assert.deepStrictEqual(ids(yield* s.claim(params({ max: 3 }))), [2n, 4n, 3n])
          assert.deepStrictEqual(ids(yield* s.claim(params())), [1n])
        })
      )
    )

    it.effect("aging lets a long-waiting low-priority job overtake newer high-priority jobs", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job({ priority: 4 })])
          yield* TestClock.adjust("3 seconds")
          yield* s.enqueueMany([job({ priority: 2 }), job({ priority: 2 })])
          // Without aging the stored priority decides.
          assert.deepStrictEqual(ids(yield* s.claim(params({ max: 1 }))), [2n])
          // 3 intervals of 1 s bring priority 4 down to 1, ahead of the fresh priority-2 lane.
          assert.deepStrictEqual(ids(yield* s.claim(params({ max: 1, agingIntervalMs: 1000 }))), [1n])
          assert.deepStrictEqual(ids(yield* s.claim(params({ max: 1, agingIntervalMs: 1000 }))), [3n])
        })
      )
    )

    it.effect("with equal effective priority the lane whose head waited longest goes first", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job({ priority: 2 })])
          yield* TestClock.adjust("1 second")
          yield* s.enqueueMany([job({ priority: 1 })])
          yield* TestClock.adjust("10 seconds")
          // Both lanes have aged to effective priority 1; the older head (priority 2) wins.
          assert.deepStrictEqual(ids(yield* s.claim(params({ agingIntervalMs: 1000 }))), [1n, 2n])
        })
      )
    )

    it.effect("a claim stamps the hard deadline and the claim time", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job(), job()])
          yield* TestClock.adjust(500)
          const [withDeadline] = yield* s.claim(params({ max: 1, deadlineMs: 2000 }))
          const [withoutDeadline] = yield* s.claim(params({ max: 1 }))
          assert.strictEqual(withDeadline!.claimedAt.getTime(), 500)
          assert.strictEqual(withDeadline!.deadlineAt?.getTime(), 2500)
          assert.strictEqual(withoutDeadline!.deadlineAt, null)
        })
      )
    )
  })

  describe("finalization", () => {
    it.effect("only the open attempt's run lease can finalize it; duplicates and old leases are stale", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job()])
          const [claimed] = yield* s.claim(params())
          const results = yield* s.finalizeMany([
            { ...token(claimed!), runLease: 2n, outcome: { _tag: "Complete" } },
            { jobId: 99n, runLease: 1n, outcome: { _tag: "Complete" } },
            { ...token(claimed!), outcome: { _tag: "Retry", delayMs: 0, error: "boom" } },
            { ...token(claimed!), outcome: { _tag: "Complete" } }
          ])
          assert.deepStrictEqual(results, [
            { _tag: "Stale" },
            { _tag: "Stale" },
            { _tag: "Applied", state: "retryable" },
            { _tag: "Stale" }
          ])
          assert.strictEqual((yield* s.getJob(1n)).state, "retryable")
          yield* s.promoteDue(10)
          const [second] = yield* s.claim(params())
          assert.strictEqual(second!.runLease, 2n)
          const late = yield* s.finalizeMany([{ ...token(claimed!), outcome: { _tag: "Complete" } }])
          assert.deepStrictEqual(late, [{ _tag: "Stale" }])
          assert.strictEqual((yield* s.getJob(1n)).state, "running")
        })
      )
    )

    it.effect("a retry backs off by its delay, and the retry of the last allowed attempt fails the job", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job({ maxAttempts: 2 })])
          const [first] = yield* s.claim(params())
          yield* TestClock.adjust(1000)
          const retried = yield* s.finalizeMany([
            { ...token(first!), outcome: { _tag: "Retry", delayMs: 5000, error: "boom 1" } }
          ])
          assert.deepStrictEqual(retried, [{ _tag: "Applied", state: "retryable" }])
          const waiting = yield* s.getJob(1n)
          assert.strictEqual(waiting.runAt.getTime(), 6000)
          assert.strictEqual(waiting.attempt, 1)
          assert.deepStrictEqual(waiting.errors, [
            { error: "boom 1", attempt: 1, at: new Date(1000).toISOString() }
          ])
          yield* TestClock.adjust(4999)
          assert.strictEqual(yield* s.promoteDue(10), 0)
          yield* TestClock.adjust(1)
          assert.strictEqual(yield* s.promoteDue(10), 1)
          const [second] = yield* s.claim(params())
          assert.strictEqual(second!.attempt, 2)
          assert.deepStrictEqual(
            second!.errors.map((e) => e.error),
            ["boom 1"]
          )
          const exhausted = yield* s.finalizeMany([
            { ...token(second!), outcome: { _tag: "Retry", delayMs: 5000, error: "boom 2" } }
          ])
          assert.deepStrictEqual(exhausted, [{ _tag: "Applied", state: "failed" }])
          const failed = yield* s.getJob(1n)
          assert.strictEqual(failed.finalizedAt?.getTime(), 6000)
          assert.deepStrictEqual(
            failed.errors.map((e) => [e.error, e.attempt]),
            [
              ["boom 1", 1],
              ["boom 2", 2]
            ]
          )
        })
      )
    )

    it.effect("a terminal failure fails at once and a cancel outcome records its reason", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job(), job()])
          const [a, b] = yield* s.claim(params())
          const results = yield* s.finalizeMany([
            { ...token(a!), outcome: { _tag: "Fail", error: "bad input" } },
            { ...token(b!), outcome: { _tag: "Cancel", reason: "not needed" } }
          ])
          assert.deepStrictEqual(results, [
            { _tag: "Applied", state: "failed" },
            { _tag: "Applied", state: "cancelled" }
          ])
          const at = new Date(0).toISOString()
          assert.deepStrictEqual((yield* s.getJob(1n)).errors, [
            { error: "bad input", attempt: 1, at, terminal: true }
          ])
          assert.deepStrictEqual((yield* s.getJob(2n)).errors, [
            { error: "cancelled: not needed", attempt: 1, at }
          ])
        })
      )
    )

    it.effect("a snooze does not consume an attempt", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job({ maxAttempts: 1 })])
          const [first] = yield* s.claim(params())
          const snoozed = yield* s.finalizeMany([
            { ...token(first!), outcome: { _tag: "Snooze", delayMs: 2000 } }
          ])
          assert.deepStrictEqual(snoozed, [{ _tag: "Applied", state: "scheduled" }])
          const view = yield* s.getJob(1n)
          assert.strictEqual(view.attempt, 0)
          assert.deepStrictEqual(view.errors, [])
          assert.strictEqual(view.runAt.getTime(), 2000)
          yield* TestClock.adjust(2000)
          yield* s.promoteDue(10)
          const [second] = yield* s.claim(params())
          assert.strictEqual(second!.attempt, 1)
          assert.strictEqual(second!.runLease, 2n)
          const done = yield* s.finalizeMany([{ ...token(second!), outcome: { _tag: "Complete" } }])
          assert.deepStrictEqual(done, [{ _tag: "Applied", state: "completed" }])
        })
      )
    )

    it.effect("delays that are negative or over 30 days reject the whole batch", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job(), job()])
          const [a, b] = yield* s.claim(params())
          for (const delayMs of [-1, 30 * 86_400_000 + 1, Number.NaN]) {
            const error = yield* Effect.flip(
              s.finalizeMany([
                { ...token(a!), outcome: { _tag: "Complete" } },
                { ...token(b!), outcome: { _tag: "Snooze", delayMs } }
              ])
            )
            assert.instanceOf(error, ValidationError)
            assert.strictEqual(error.field, "items[1].delayMs")
          }
          assert.strictEqual((yield* s.getJob(1n)).state, "running")
          const max = yield* s.finalizeMany([
            { ...token(b!), outcome: { _tag: "Retry", delayMs: 30 * 86_400_000, error: "later" } }
          ])
          assert.deepStrictEqual(max, [{ _tag: "Applied", state: "retryable" }])
        })
      )
    )

    it.effect("heartbeat progress survives a retry and is cleared on completion", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job()])
          const [first] = yield* s.claim(params())
          const notOpen = yield* s.heartbeatMany([
            { ...token(first!), progress: { done: 3 } },
            { jobId: 1n, runLease: 7n, progress: { done: 99 } }
          ])
          assert.deepStrictEqual(notOpen, [{ jobId: 1n, runLease: 7n }])
          assert.deepStrictEqual((yield* s.getJob(1n)).progress, { done: 3 })
          yield* s.finalizeMany([{ ...token(first!), outcome: { _tag: "Retry", delayMs: 0, error: "x" } }])
          assert.deepStrictEqual((yield* s.getJob(1n)).progress, { done: 3 })
          yield* s.promoteDue(10)
          const [second] = yield* s.claim(params())
          yield* s.finalizeMany([{ ...token(second!), outcome: { _tag: "Complete" } }])
          assert.strictEqual((yield* s.getJob(1n)).progress, null)
        })
      )
    )

    it.effect("the error history keeps only the newest 100 entries", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job({ maxAttempts: 1000 })])
          for (let i = 1; i <= 101; i++) {
            const [claimed] = yield* s.claim(params())
            yield* s.finalizeMany([
              { ...token(claimed!), outcome: { _tag: "Retry", delayMs: 0, error: `e${i}` } }
            ])
            yield* s.promoteDue(1)
          }
          const errors = (yield* s.getJob(1n)).errors
          assert.strictEqual(errors.length, 100)
          assert.strictEqual(errors[0]!.error, "e2")
          assert.strictEqual(errors[99]!.error, "e101")
        })
      )
    )
  })

  describe("promotion", () => {
    it.effect("due jobs are promoted oldest runAt first, up to the limit, behind jobs already waiting", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          const enqueued = yield* s.enqueueMany([
            job({ runAt: new Date(2000) }),
            job({ runAt: new Date(1000) }),
            job({ runAt: new Date(3000) }),
            job()
          ])
          assert.deepStrictEqual(
            enqueued.map((e) => e.state),
            ["scheduled", "scheduled", "scheduled", "available"]
          )
          yield* TestClock.adjust(2000)
          assert.strictEqual(yield* s.promoteDue(1), 1)
          assert.strictEqual((yield* s.getJob(2n)).state, "available")
          assert.strictEqual((yield* s.getJob(1n)).state, "scheduled")
          assert.strictEqual(yield* s.promoteDue(10), 1)
          assert.strictEqual((yield* s.getJob(3n)).state, "scheduled")
          const claimed = yield* s.claim(params())
          assert.deepStrictEqual(ids(claimed), [4n, 2n, 1n])
          // A promoted job keeps its runAt, which drives aging.
          assert.strictEqual(claimed[1]!.runAt.getTime(), 1000)
        })
      )
    )

    it.effect("a runAt at or before now makes the job available at once, keeping that runAt", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* TestClock.adjust(5000)
          const enqueued = yield* s.enqueueMany([
            job({ runAt: new Date(1000) }),
            job({ runAt: new Date(5000) })
          ])
          assert.deepStrictEqual(
            enqueued.map((e) => e.state),
            ["available", "available"]
          )
          assert.strictEqual((yield* s.getJob(1n)).runAt.getTime(), 1000)
          assert.strictEqual((yield* s.getJob(1n)).createdAt.getTime(), 5000)
        })
      )
    )
  })

  describe("rescue", () => {
    it.effect(
      "an attempt without a recent sign of life is retried with backoff, then failed when exhausted",
      () =>
        sim(
          Effect.gen(function* () {
            const s = yield* QueueStorage
            const rescue = s.rescueStale({ stalenessMs: 90_000, limit: 10 })
            yield* s.enqueueMany([job({ maxAttempts: 2 })])
            const [first] = yield* s.claim(params())
            yield* TestClock.adjust("60 seconds")
            yield* s.heartbeatMany([token(first!)])
            yield* TestClock.adjust("90 seconds")
            assert.deepStrictEqual(yield* rescue, [], "a heartbeat 90 s ago is not older than the cutoff")
            yield* TestClock.adjust(1)
            assert.deepStrictEqual(yield* rescue, [
              {
                jobId: 1n,
                runLease: 1n,
                reason: "stale_heartbeat",
                state: "retryable",
                queue: "default",
                kind: "email"
              }
            ])
            const view = yield* s.getJob(1n)
            const { min, max } = Backoff.backoffBounds(1)
            const delay = view.runAt.getTime() - 150_001
            assert.isTrue(delay >= min && delay < max, `backoff ${delay} within [${min}, ${max})`)
            assert.deepStrictEqual(view.errors.at(-1)!.error, "heartbeat stale: worker presumed dead")
            // The rescued attempt is no longer open: its worker learns it on the next heartbeat.
            assert.deepStrictEqual(yield* s.heartbeatMany([token(first!)]), [token(first!)])
            yield* TestClock.adjust(max)
            yield* s.promoteDue(10)
            const [second] = yield* s.claim(params())
            yield* TestClock.adjust("91 seconds")
            assert.deepStrictEqual(yield* rescue, [
              {
                ...token(second!),
                reason: "stale_heartbeat",
                state: "failed",
                queue: "default",
                kind: "email"
              }
            ])
            assert.strictEqual((yield* s.getJob(1n)).state, "failed")
          })
        )
    )

    it.effect("stale attempts are rescued oldest claim first, up to the limit", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job({ queue: "a" }), job({ queue: "b" })])
          yield* s.claim(params({ queue: "b" }))
          yield* TestClock.adjust(10)
          yield* s.claim(params({ queue: "a" }))
          yield* TestClock.adjust(1000)
          const rescued = yield* s.rescueStale({ stalenessMs: 500, limit: 1 })
          assert.deepStrictEqual(
            rescued.map((r) => r.jobId),
            [2n]
          )
          assert.strictEqual((yield* s.getJob(1n)).state, "running")
        })
      )
    )

    it.effect(
      "attempts past their hard deadline are rescued oldest deadline first, and exhaustion fails them",
      () =>
        sim(
          Effect.gen(function* () {
            const s = yield* QueueStorage
            yield* s.enqueueMany([
              job({ queue: "slow", maxAttempts: 1 }),
              job({ queue: "fast", maxAttempts: 3 }),
              job({ queue: "none" })
            ])
            yield* s.claim(params({ queue: "slow", deadlineMs: 5000 }))
            yield* s.claim(params({ queue: "fast", deadlineMs: 2000 }))
            yield* s.claim(params({ queue: "none" }))
            yield* TestClock.adjust(2000)
            assert.deepStrictEqual(yield* s.rescueDeadlines(10), [], "a deadline equal to now has not passed")
            yield* TestClock.adjust(1)
            assert.deepStrictEqual(yield* s.rescueDeadlines(10), [
              {
                jobId: 2n,
                runLease: 1n,
                reason: "deadline_exceeded",
                state: "retryable",
                queue: "fast",
                kind: "email"
              }
            ])
            yield* TestClock.adjust("1 hour")
            assert.deepStrictEqual(yield* s.rescueDeadlines(10), [
              {
                jobId: 1n,
                runLease: 1n,
                reason: "deadline_exceeded",
                state: "failed",
                queue: "slow",
                kind: "email"
              }
            ])
            assert.strictEqual((yield* s.getJob(1n)).errors[0]!.error, "hard deadline exceeded")
            assert.strictEqual((yield* s.getJob(3n)).state, "running")
          })
        )
    )

    it.effect("rescue backoff jitter is reproducible under a seeded Random", () => {
      const runAtAfterRescue = Effect.gen(function* () {
        const s = yield* QueueStorage
        yield* s.enqueueMany([job(), job(), job()])
        yield* s.claim(params({ deadlineMs: 1 }))
        yield* TestClock.adjust(2)
        yield* s.rescueDeadlines(10)
        return (yield* s.listJobs({})).map((j) => j.runAt.getTime())
      }).pipe(Effect.provide(SimQueueStorage.layer, { local: true }))
      return Effect.gen(function* () {
        const first = yield* Random.withSeed(runAtAfterRescue, 42)
        yield* TestClock.setTime(0)
        const second = yield* Random.withSeed(runAtAfterRescue, 42)
        assert.deepStrictEqual(first, second)
        assert.strictEqual(new Set(first).size, 3, "each rescued attempt draws its own jitter")
      })
    })
  })

  describe("unique jobs", () => {
    const unique = job({ kind: "report", args: { day: "2024-01-01" }, unique: {} })

    it.effect(
      "a key held by a live job rejects a duplicate and writes nothing; a failed job releases it",
      () =>
        sim(
          Effect.gen(function* () {
            const s = yield* QueueStorage
            yield* s.enqueueMany([unique])
            const error = yield* Effect.flip(s.enqueueMany([job(), unique]))
            assert.instanceOf(error, UniqueConflict)
            assert.deepStrictEqual(
              { key: error.key, existingJobId: error.existingJobId },
              { key: uniqueKeyHex(yield* checkNewJob(unique, { nowMillis: 0 }))!, existingJobId: 1n }
            )
            assert.strictEqual((yield* s.listJobs({})).length, 1)
            const [claimed] = yield* s.claim(params())
            yield* Effect.flip(s.enqueueMany([unique]))
            yield* s.finalizeMany([{ ...token(claimed!), outcome: { _tag: "Fail", error: "no" } }])
            const again = yield* s.enqueueMany([unique])
            assert.deepStrictEqual(
              again.map((e) => e.id),
              [2n]
            )
          })
        )
    )

    it.effect("a batch holding the same key twice is rejected whole", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          const error = yield* Effect.flip(s.enqueueMany([unique, job(), unique]))
          assert.instanceOf(error, UniqueConflict)
          assert.strictEqual(error.existingJobId, 1n)
          assert.deepStrictEqual(yield* s.listJobs({}), [])
          assert.deepStrictEqual(
            (yield* s.enqueueMany([unique])).map((e) => e.id),
            [1n]
          )
        })
      )
    )

    it.effect("a completed job holds its key until its history is pruned", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          const retention = { completedMs: 10_000, failedMs: 10_000, cancelledMs: 10_000 }
          yield* s.enqueueMany([unique])
          const [claimed] = yield* s.claim(params())
          yield* s.finalizeMany([{ ...token(claimed!), outcome: { _tag: "Complete" } }])
          yield* TestClock.adjust(10_000)
          assert.deepStrictEqual(yield* s.pruneHistory(retention), { _tag: "Noop" })
          assert.instanceOf(yield* Effect.flip(s.enqueueMany([unique])), UniqueConflict)
          yield* TestClock.adjust(1)
          assert.deepStrictEqual(yield* s.pruneHistory(retention), {
            _tag: "Pruned",
            generation: 1n,
            carried: 0
          })
          assert.instanceOf(yield* Effect.flip(s.getJob(1n)), JobNotFound)
          assert.strictEqual((yield* s.enqueueMany([unique]))[0]!.id, 2n)
        })
      )
    )

    it.effect(
      "a job whose mask omits running releases its key at claim and gives way to a newer holder on retry",
      () =>
        sim(
          Effect.gen(function* () {
            const s = yield* QueueStorage
            const waitingOnly = job({
              kind: "sync",
              unique: { states: ["scheduled", "available", "retryable"] }
            })
            yield* s.enqueueMany([waitingOnly])
            const [claimed] = yield* s.claim(params())
            assert.strictEqual((yield* s.enqueueMany([waitingOnly]))[0]!.id, 2n)
            const results = yield* s.finalizeMany([
              { ...token(claimed!), outcome: { _tag: "Retry", delayMs: 0, error: "boom" } }
            ])
            assert.deepStrictEqual(results, [{ _tag: "Applied", state: "cancelled" }])
            assert.deepStrictEqual(
              (yield* s.getJob(1n)).errors.map((e) => e.error),
              ["boom", "cancelled: superseded by duplicate 2"]
            )
            assert.strictEqual((yield* s.getJob(2n)).state, "available")
          })
        )
    )

    it.effect("jobs with different args or without uniqueness do not conflict", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          const other = job({ kind: "report", args: { day: "2024-01-02" }, unique: {} })
          const plain = job({ kind: "report", args: { day: "2024-01-01" } })
          const enqueued = yield* s.enqueueMany([unique, other, plain, plain])
          assert.strictEqual(enqueued.length, 4)
        })
      )
    )
  })

  describe("operator actions", () => {
    it.effect("cancel stops waiting and running jobs and refuses terminal or unknown ones", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job(), job({ runAt: new Date(60_000) }), job({ queue: "busy" })])
          const [running] = yield* s.claim(params({ queue: "busy" }))
          const available = yield* s.cancelJob(1n, "operator")
          assert.strictEqual(available.state, "cancelled")
          assert.strictEqual(available.finalizedAt?.getTime(), 0)
          assert.deepStrictEqual(available.errors, [
            { error: "cancelled: operator", attempt: 0, at: new Date(0).toISOString() }
          ])
          assert.strictEqual((yield* s.cancelJob(2n, "operator")).state, "cancelled")
          assert.strictEqual((yield* s.cancelJob(3n, "operator")).state, "cancelled")
          // The cancelled attempt is closed: its worker's writes are stale.
          assert.deepStrictEqual(
            yield* s.finalizeMany([{ ...token(running!), outcome: { _tag: "Complete" } }]),
            [{ _tag: "Stale" }]
          )
          assert.deepStrictEqual(yield* s.heartbeatMany([token(running!)]), [token(running!)])
          assert.deepStrictEqual(yield* s.claim(params()), [], "a cancelled job is never claimed")
          const terminal = yield* Effect.flip(s.cancelJob(1n, "again"))
          assert.instanceOf(terminal, InvalidTransition)
          assert.deepStrictEqual(
            [terminal.jobId, terminal.from, terminal.action],
            [1n, "cancelled", "cancel"]
          )
          const missing = yield* Effect.flip(s.cancelJob(42n, "x"))
          assert.instanceOf(missing, JobNotFound)
          assert.strictEqual(missing.jobId, 42n)
        })
      )
    )

    it.effect(
      "retry makes a failed job available again at the back of its lane with attempt 0 and its lease",
      () =>
        sim(
          Effect.gen(function* () {
            const s = yield* QueueStorage
            yield* s.enqueueMany([job()])
            const [first] = yield* s.claim(params())
            yield* s.finalizeMany([{ ...token(first!), outcome: { _tag: "Fail", error: "bad" } }])
            yield* s.enqueueMany([job()])
            yield* TestClock.adjust(3000)
            const retried = yield* s.retryJob(1n)
            assert.deepStrictEqual(
              [
                retried.state,
                retried.attempt,
                retried.runLease,
                retried.runAt.getTime(),
                retried.finalizedAt
              ],
              ["available", 0, 1n, 3000, null]
            )
            assert.strictEqual(retried.errors.length, 1, "errors are kept")
            const claimed = yield* s.claim(params())
            assert.deepStrictEqual(ids(claimed), [2n, 1n])
            assert.deepStrictEqual([claimed[1]!.attempt, claimed[1]!.runLease], [1, 2n])
            const notFailed = yield* Effect.flip(s.retryJob(1n))
            assert.instanceOf(notFailed, InvalidTransition)
            assert.deepStrictEqual([notFailed.from, notFailed.action], ["running", "retry"])
            assert.instanceOf(yield* Effect.flip(s.retryJob(42n)), JobNotFound)
          })
        )
    )

    it.effect("retry of a unique job whose key was taken meanwhile conflicts and changes nothing", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          const unique = job({ kind: "sync", unique: {} })
          yield* s.enqueueMany([unique])
          yield* s.cancelJob(1n, "stop")
          yield* s.enqueueMany([unique])
          const error = yield* Effect.flip(s.retryJob(1n))
          assert.instanceOf(error, UniqueConflict)
          assert.strictEqual(error.existingJobId, 2n)
          assert.strictEqual((yield* s.getJob(1n)).state, "cancelled")
          yield* s.cancelJob(2n, "stop")
          assert.strictEqual((yield* s.retryJob(1n)).state, "available")
        })
      )
    )

    it.effect("a paused queue hands out nothing until resumed, while enqueue still works", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.pauseQueue("default")
          yield* s.enqueueMany([job(), job({ queue: "other" })])
          assert.deepStrictEqual(yield* s.claim(params()), [])
          assert.deepStrictEqual(ids(yield* s.claim(params({ queue: "other" }))), [2n])
          yield* s.resumeQueue("default")
          assert.deepStrictEqual(ids(yield* s.claim(params())), [1n])
        })
      )
    )
  })

  describe("validation", () => {
    it.effect("an invalid job rejects the whole batch before anything is written", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          const error = yield* Effect.flip(s.enqueueMany([job(), job({ priority: 9 })]))
          assert.instanceOf(error, ValidationError)
          assert.strictEqual(error.field, "priority")
          assert.deepStrictEqual(yield* s.listJobs({}), [])
          assert.deepStrictEqual(yield* s.countByQueueState, [])
          assert.deepStrictEqual(
            (yield* s.enqueueMany([job()])).map((e) => e.id),
            [1n]
          )
        })
      )
    )

    it.effect("bad queue names, claim sizes and list limits are typed validation errors", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          const fields = [
            yield* Effect.flip(s.claim(params({ queue: " padded" }))),
            yield* Effect.flip(s.claim(params({ max: -1 }))),
            yield* Effect.flip(s.claim(params({ max: 1.5 }))),
            yield* Effect.flip(s.pauseQueue("")),
            yield* Effect.flip(s.resumeQueue("a\u0000b")),
            yield* Effect.flip(s.listJobs({ limit: 0 })),
            yield* Effect.flip(s.listJobs({ limit: 1001 }))
          ].map((e) => [e._tag, e._tag === "ValidationError" ? e.field : e.message])
          assert.deepStrictEqual(fields, [
            ["ValidationError", "queue"],
            ["ValidationError", "max"],
            ["ValidationError", "max"],
            ["ValidationError", "queue"],
            ["ValidationError", "queue"],
            ["ValidationError", "limit"],
            ["ValidationError", "limit"]
          ])
        })
      )
    )
  })

  describe("reads", () => {
    it.effect("listJobs returns the newest first, filters, and pages with before", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([
            job({ tags: ["a"] }),
            job({ kind: "sms" }),
            job({ queue: "other", tags: ["a"] }),
            job({ tags: ["a"] })
          ])
          yield* s.claim(params({ max: 1 }))
          const list = (filter: Parameters<typeof s.listJobs>[0]) =>
            Effect.map(s.listJobs(filter), (views) => views.map((v) => v.id))
          assert.deepStrictEqual(yield* list({}), [4n, 3n, 2n, 1n])
          assert.deepStrictEqual(yield* list({ limit: 2 }), [4n, 3n])
          assert.deepStrictEqual(yield* list({ before: 3n }), [2n, 1n])
          assert.deepStrictEqual(yield* list({ queue: "default", tag: "a" }), [4n, 1n])
          assert.deepStrictEqual(yield* list({ kind: "sms" }), [2n])
          assert.deepStrictEqual(yield* list({ state: "running" }), [1n])
        })
      )
    )

    it.effect("counts are grouped by queue and state, sorted, without empty groups", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([
            job({ queue: "b" }),
            job({ queue: "a" }),
            job({ queue: "a" }),
            job({ queue: "a" })
          ])
          yield* s.claim(params({ queue: "a", max: 1 }))
          yield* s.cancelJob(4n, "x")
          assert.deepStrictEqual(yield* s.countByQueueState, [
            { queue: "a", state: "available", count: 1 },
            { queue: "a", state: "cancelled", count: 1 },
            { queue: "a", state: "running", count: 1 },
            { queue: "b", state: "available", count: 1 }
          ])
        })
      )
    )

    it.effect("a job view is a copy: mutating it does not change the stored job", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.enqueueMany([job({ args: { list: [1] }, metadata: { m: 1 } })])
          const view = yield* s.getJob(1n)
          ;(view.args as { list: Array<number> }).list.push(2)
          ;(view.metadata as Record<string, unknown>)["m"] = 2
          const again = yield* s.getJob(1n)
          assert.deepStrictEqual([again.args, again.metadata], [{ list: [1] }, { m: 1 }])
          assert.instanceOf(yield* Effect.flip(s.getJob(2n)), JobNotFound)
        })
      )
    )

    it.effect("the ring maintenance calls are no-ops in memory", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          assert.strictEqual(yield* s.rotate, "SkippedIdle")
          assert.strictEqual(yield* s.rotateHistory(1000), "SkippedIdle")
          assert.deepStrictEqual(yield* s.prune({ completedMs: 0, failedMs: 0, cancelledMs: 0 }), {
            _tag: "Noop"
          })
          assert.deepStrictEqual(yield* s.status, {
            generation: 0n,
            slot: 0,
            oldestUnpruned: null,
            historyGeneration: 0n
          })
        })
      )
    )
  })

  describe("dead letter queue", () => {
    const fail = (c: ClaimedJob) => ({ ...token(c), outcome: { _tag: "Fail", error: "no" } as const })
    const unique = job({ kind: "sync", unique: {} })
    const fieldOf = (error: unknown) => (error instanceof ValidationError ? error.field : undefined)

    it.effect("settings change only the fields given; bad names and retentions are rejected", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.configureQueue("default", { dlq: true, dlqRetentionMs: 1000 })
          yield* s.configureQueue("default", { dlqRetentionMs: null })
          yield* s.enqueueMany([job(), job()])
          const [a, b] = yield* s.claim(params())
          yield* s.finalizeMany([fail(a!)])
          // dlq kept true; retention cleared back to the cleanup default
          assert.strictEqual((yield* s.getJob(1n)).dlqReason, "terminal_error")
          yield* TestClock.adjust(5000)
          assert.strictEqual(yield* s.cleanupDlq(10_000, 10), 0)
          yield* s.configureQueue("default", { dlq: null })
          yield* s.finalizeMany([fail(b!)])
          assert.strictEqual((yield* s.getJob(2n)).dlqReason, null)
          const badRetention = yield* Effect.flip(s.configureQueue("default", { dlqRetentionMs: 0.5 }))
          assert.instanceOf(badRetention, ValidationError)
          assert.strictEqual(badRetention.field, "dlqRetentionMs")
          assert.instanceOf(yield* Effect.flip(s.configureQueue("", { dlq: true })), ValidationError)
          assert.instanceOf(yield* Effect.flip(s.drainQueue("", "x")), ValidationError)
          assert.strictEqual(fieldOf(yield* Effect.flip(s.listDlq({ limit: 1001 }))), "limit")
        })
      )
    )

    it.effect("an entry keeps progress and timestamps; since, until and before filter it", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.setDlqDefault(true)
          yield* s.enqueueMany([job({ tags: ["t"] }), job()])
          const [a, b] = yield* s.claim(params())
          yield* s.heartbeatMany([{ ...token(a!), progress: { step: 3 } }])
          yield* TestClock.adjust(100)
          yield* s.finalizeMany([fail(a!)])
          yield* TestClock.adjust(100)
          yield* s.finalizeMany([fail(b!)])
          const entry = yield* s.getDlq(1n)
          assert.deepStrictEqual(
            [entry.progress, entry.dlqAt.getTime(), entry.tags],
            [{ step: 3 }, 100, ["t"]]
          )
          const view = yield* s.getJob(1n)
          assert.deepStrictEqual([view.state, view.finalizedAt?.getTime()], ["failed", 100])
          const listed = (filter: Parameters<typeof s.listDlq>[0]) =>
            Effect.map(s.listDlq(filter), (entries) => entries.map((e) => e.id))
          assert.deepStrictEqual(yield* listed({}), [2n, 1n])
          assert.deepStrictEqual(yield* listed({ since: new Date(200) }), [2n])
          assert.deepStrictEqual(yield* listed({ until: new Date(200) }), [1n])
          assert.deepStrictEqual(yield* listed({ before: 2n }), [1n])
          assert.deepStrictEqual(yield* listed({ tag: "t" }), [1n])
          assert.deepStrictEqual(yield* listed({ limit: 1 }), [2n])
          // history retention leaves dead letters alone; only DLQ cleanup or purge removes them
          assert.deepStrictEqual(yield* s.pruneHistory({ completedMs: 0, failedMs: 0, cancelledMs: 0 }), {
            _tag: "Noop"
          })
          assert.strictEqual(yield* s.purgeDlqBulk({}, { all: true }), 2)
          assert.instanceOf(yield* Effect.flip(s.getJob(1n)), JobNotFound)
        })
      )
    )

    it.effect("a retry whose unique key is taken conflicts and changes nothing; bulk retry skips it", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.configureQueue("default", { dlq: true })
          yield* s.enqueueMany([unique, job()])
          yield* s.finalizeMany((yield* s.claim(params())).map(fail))
          yield* s.enqueueMany([unique])
          const error = yield* Effect.flip(s.retryFromDlq(1n))
          assert.instanceOf(error, UniqueConflict)
          assert.strictEqual(error.existingJobId, 3n)
          assert.strictEqual((yield* s.getDlq(1n)).id, 1n)
          assert.strictEqual(yield* s.retryDlqBulk({ queue: "default" }), 1)
          assert.deepStrictEqual(
            (yield* s.listDlq({})).map((e) => e.id),
            [1n]
          )
          // a key free again only for a later state: scheduled retry still conflicts (default mask)
          const later = new Date(60_000)
          assert.instanceOf(yield* Effect.flip(s.retryFromDlq(1n, { runAt: later })), UniqueConflict)
          yield* s.cancelJob(3n, "stop")
          const back = yield* s.retryFromDlq(1n, { runAt: later })
          assert.deepStrictEqual(
            [back.state, back.runAt.getTime(), back.finalizedAt],
            ["scheduled", 60_000, null]
          )
        })
      )
    )

    it.effect("retry overrides are validated before anything changes", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.configureQueue("default", { dlq: true })
          yield* s.enqueueMany([job()])
          yield* s.finalizeMany((yield* s.claim(params())).map(fail))
          assert.strictEqual(fieldOf(yield* Effect.flip(s.retryFromDlq(1n, { priority: 5 }))), "priority")
          assert.instanceOf(yield* Effect.flip(s.retryFromDlq(1n, { queue: " x" })), ValidationError)
          assert.instanceOf(
            yield* Effect.flip(s.retryFromDlq(1n, { runAt: new Date(Number.NaN) })),
            ValidationError
          )
          assert.strictEqual((yield* s.getDlq(1n)).reason, "terminal_error")
          // operator retryJob also takes a dead-lettered job out of the DLQ
          const back = yield* s.retryJob(1n)
          assert.deepStrictEqual([back.state, back.dlqReason], ["available", null])
          assert.instanceOf(yield* Effect.flip(s.getDlq(1n)), JobNotFound)
        })
      )
    )

    it.effect("cleanup deletes the oldest expired entries first, up to the batch", () =>
      sim(
        Effect.gen(function* () {
          const s = yield* QueueStorage
          yield* s.setDlqDefault(true)
          yield* s.enqueueMany([job(), job(), job()])
          const claimed = yield* s.claim(params())
          for (const c of claimed) {
            yield* s.finalizeMany([fail(c)])
            yield* TestClock.adjust(10)
          }
          // dlqAt 0, 10, 20; now 30
          assert.strictEqual(yield* s.cleanupDlq(15, 1), 1)
          assert.instanceOf(yield* Effect.flip(s.getDlq(1n)), JobNotFound)
          assert.strictEqual(yield* s.cleanupDlq(15, 10), 1)
          assert.strictEqual(yield* s.cleanupDlq(15, 10), 0)
          assert.strictEqual(yield* s.cleanupDlq(5, 10), 1)
          assert.strictEqual((yield* s.listDlq({})).length, 0)
        })
      )
    )
  })
})

describe("SimQueueStorage contract", () => {
  layer(SimQueueStorage.layer)("the shared QueueStorage contract", (it) => {
    suite(it, { advance: (ms) => TestClock.adjust(ms) })
  })
})
