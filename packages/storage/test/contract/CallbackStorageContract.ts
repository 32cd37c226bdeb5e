/**
 * External callbacks (capabilities.md §17, §6; issue 21 item 1): the cases every `CallbackStorage`
 * passes, run on Postgres by `PgCallbackStorage.test.ts` and on the simulation by
 * `SimCallbackStorage.test.ts`.
 */
import { randomUUID } from "node:crypto"
import type { Vitest } from "@effect/vitest"
import { assert } from "@effect/vitest"
import { Effect, Option } from "effect"
import { type CallbackAction, CallbackStorage } from "../../src/CallbackStorage.ts"
import { type ClaimedJob, QueueStorage } from "../../src/QueueStorage.ts"

export interface CallbackContractOptions<R> {
  /** Moves every pending callback's timeout `ms` closer (Postgres: backdates; simulation: TestClock). */
  readonly ageCallbacks: (ms: number) => Effect.Effect<void, never, R>
  /** Lets `ms` of storage time pass for everything (claim deadlines). */
  readonly advance: (ms: number) => Effect.Effect<void>
}

const freshQueue = (label: string) => `${label}-${randomUUID().slice(0, 8)}`

type Services = QueueStorage | CallbackStorage

/** Enqueues one job on a fresh queue and claims it. */
const claimOne = (label: string, maxAttempts = 3, deadlineMs = 0) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const queue = freshQueue(label)
    yield* storage.enqueueMany([{ kind: "cb_job", queue, args: { label }, maxAttempts }])
    const [claimed] = yield* storage.claim({ queue, max: 1, deadlineMs, agingIntervalMs: 0 })
    assert.isDefined(claimed)
    return claimed!
  })

const register = (job: ClaimedJob, timeoutMs = 60_000) =>
  Effect.gen(function* () {
    const callbacks = yield* CallbackStorage
    const id = yield* callbacks.register(job, { timeoutMs })
    assert.isTrue(Option.isSome(id))
    return Option.getOrThrow(id)
  })

const stateOf = (job: ClaimedJob) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    return (yield* storage.getJob(job.jobId)).state
  })

const complete = (job: ClaimedJob) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    return yield* storage.finalizeMany([
      { jobId: job.jobId, runLease: job.runLease, outcome: { _tag: "Complete" } }
    ])
  })

export const callbackSuite = <R = never>(
  it: Vitest.MethodsNonLive<Services | R>,
  { ageCallbacks, advance }: CallbackContractOptions<R>
) => {
  it.effect("park frees the attempt (waiting_external); resume hands it back with the same run lease", () =>
    Effect.gen(function* () {
      const callbacks = yield* CallbackStorage
      const job = yield* claimOne("park-resume")
      const id = yield* register(job)
      assert.deepStrictEqual(yield* callbacks.park(job, id), { _tag: "Parked" })
      assert.strictEqual(yield* stateOf(job), "waiting_external")
      const info = yield* callbacks.info(id)
      assert.strictEqual(info.status, "pending")
      assert.isTrue(info.waiting)
      const resumed = yield* callbacks.resolve(id, { _tag: "Resume", payload: { approved: true } })
      assert.strictEqual(resumed.runLease, job.runLease)
      const [back, ...more] = yield* callbacks.claimResumed(job.queue, 10)
      assert.strictEqual(more.length, 0)
      assert.strictEqual(back!.jobId, job.jobId)
      assert.strictEqual(back!.runLease, job.runLease)
      assert.strictEqual(back!.attempt, job.attempt)
      assert.deepStrictEqual(back!.callbackResult, { approved: true })
      assert.strictEqual(back!.deadlineAt, null)
      // taken once
      assert.strictEqual((yield* callbacks.claimResumed(job.queue, 10)).length, 0)
      assert.strictEqual(yield* stateOf(job), "running")
      const [done] = yield* complete(back!)
      assert.deepStrictEqual(done, { _tag: "Applied", state: "completed" })
    })
  )

  it.effect(
    "a resumed attempt taken back and given back unstarted is resumed again, payload and lease kept (0035)",
    () =>
      Effect.gen(function* () {
        const callbacks = yield* CallbackStorage
        const storage = yield* QueueStorage
        const job = yield* claimOne("release-resumed")
        const id = yield* register(job)
        yield* callbacks.park(job, id)
        yield* callbacks.resolve(id, { _tag: "Resume", payload: { approved: "yes" } })
        const [taken] = yield* callbacks.claimResumed(job.queue, 10)
        assert.isDefined(taken)
        // a stopping worker gives it back: parked as resumed again, not closed
        assert.isTrue(yield* callbacks.releaseResumed(job))
        // as right after the resume: running, waiting for a worker to take it back
        assert.strictEqual(yield* stateOf(job), "running")
        // only once: it is no longer a taken-back attempt
        assert.isFalse(yield* callbacks.releaseResumed(job))
        const [again, ...more] = yield* callbacks.claimResumed(job.queue, 10)
        assert.strictEqual(more.length, 0)
        assert.strictEqual(again!.runLease, job.runLease)
        assert.strictEqual(again!.attempt, job.attempt)
        assert.deepStrictEqual(again!.callbackResult, { approved: "yes" })
        const [done] = yield* complete(again!)
        assert.deepStrictEqual(done, { _tag: "Applied", state: "completed" })
        // a closed attempt, and a running one that never parked, are not released
        assert.isFalse(yield* callbacks.releaseResumed(job))
        const plain = yield* claimOne("release-plain")
        assert.isFalse(yield* callbacks.releaseResumed(plain))
        assert.strictEqual((yield* storage.getJob(plain.jobId)).state, "running")
      })
  )

  it.effect("two sequential in-handler waits, then complete", () =>
    Effect.gen(function* () {
      const callbacks = yield* CallbackStorage
      const job = yield* claimOne("sequential")
      for (const step of [1, 2]) {
        const id = yield* register(job)
        assert.deepStrictEqual(yield* callbacks.take(job, id), { _tag: "Pending" })
        assert.strictEqual(yield* stateOf(job), "running")
        yield* callbacks.resolve(id, { _tag: "Resume", payload: { step } })
        assert.deepStrictEqual(yield* callbacks.take(job, id), { _tag: "Resumed", payload: { step } })
        // spent: a second resume of the same id is stale
        const again = yield* Effect.flip(callbacks.resolve(id, { _tag: "Resume", payload: {} }))
        assert.strictEqual(again._tag, "CallbackStale")
      }
      const [done] = yield* complete(job)
      assert.deepStrictEqual(done, { _tag: "Applied", state: "completed" })
    })
  )

  it.effect(
    "a callback that completes before the handler parks wins; park and the handler's outcome are stale",
    () =>
      Effect.gen(function* () {
        const callbacks = yield* CallbackStorage
        const job = yield* claimOne("early")
        const id = yield* register(job)
        const r = yield* callbacks.resolve(id, { _tag: "Complete" })
        assert.strictEqual(r.state, "completed")
        assert.deepStrictEqual(yield* callbacks.park(job, id), { _tag: "Stale" })
        assert.deepStrictEqual(yield* complete(job), [{ _tag: "Stale" }])
        assert.strictEqual(yield* stateOf(job), "completed")
      })
  )

  it.effect("a resume that arrives before the park is delivered after it", () =>
    Effect.gen(function* () {
      const callbacks = yield* CallbackStorage
      const job = yield* claimOne("early-resume")
      const id = yield* register(job)
      yield* callbacks.resolve(id, { _tag: "Resume", payload: "early" })
      assert.deepStrictEqual(yield* callbacks.park(job, id), { _tag: "Resumed" })
      const [back] = yield* callbacks.claimResumed(job.queue, 10)
      assert.strictEqual(back!.runLease, job.runLease)
      assert.strictEqual(back!.callbackResult, "early")
    })
  )

  it.effect("an older id is stale after re-registration; unknown and malformed ids are not found", () =>
    Effect.gen(function* () {
      const callbacks = yield* CallbackStorage
      const job = yield* claimOne("reregister")
      const first = yield* register(job)
      const second = yield* register(job)
      assert.notStrictEqual(first, second)
      assert.strictEqual(
        (yield* Effect.flip(callbacks.resolve(first, { _tag: "Complete" })))._tag,
        "CallbackStale"
      )
      assert.strictEqual((yield* Effect.flip(callbacks.info(first)))._tag, "CallbackStale")
      assert.deepStrictEqual(yield* callbacks.park(job, first), { _tag: "Stale" })
      for (const bad of ["", "nope", "1.2.3", `${job.jobId + 1_000_000n}.1.${"0".repeat(32)}`]) {
        assert.strictEqual(
          (yield* Effect.flip(callbacks.resolve(bad, { _tag: "Complete" })))._tag,
          "CallbackNotFound"
        )
      }
      assert.strictEqual((yield* callbacks.resolve(second, { _tag: "Complete" })).state, "completed")
    })
  )

  it.effect("10 concurrent resolutions of one callback: exactly one wins, the rest are stale", () =>
    Effect.gen(function* () {
      const callbacks = yield* CallbackStorage
      const race = (actions: ReadonlyArray<CallbackAction>) =>
        Effect.gen(function* () {
          const job = yield* claimOne("race")
          const id = yield* register(job)
          yield* callbacks.park(job, id)
          const results = yield* Effect.all(
            actions.map((a) => Effect.result(callbacks.resolve(id, a))),
            { concurrency: "unbounded" }
          )
          const wins = results.filter((r) => r._tag === "Success")
          assert.strictEqual(wins.length, 1, `${wins.length} winners of ${actions[0]!._tag}…`)
          for (const r of results)
            if (r._tag === "Failure") assert.strictEqual(r.failure._tag, "CallbackStale")
        })
      // ten resumes (no closure decides these: only the callback's own state does)
      yield* race(Array.from({ length: 10 }, (_, i): CallbackAction => ({ _tag: "Resume", payload: i })))
      // and a mix of every resolving action
      yield* race(
        Array.from(
          { length: 10 },
          (_, i): CallbackAction =>
            i % 3 === 0
              ? { _tag: "Complete" }
              : i % 3 === 1
                ? { _tag: "Fail", error: `no ${i}` }
                : { _tag: "Resume", payload: i }
        )
      )
    })
  )

  it.effect(
    "fail from outside ends the job failed; retry from a parked attempt runs it again from attempt 0",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const callbacks = yield* CallbackStorage
        const failed = yield* claimOne("fail")
        const f = yield* register(failed)
        assert.strictEqual((yield* callbacks.resolve(f, { _tag: "Fail", error: "declined" })).state, "failed")
        const view = yield* storage.getJob(failed.jobId)
        assert.strictEqual(view.errors.at(-1)!.error, "declined")

        const job = yield* claimOne("retry")
        const id = yield* register(job)
        // only from waiting
        assert.strictEqual(
          (yield* Effect.flip(callbacks.resolve(id, { _tag: "Retry" })))._tag,
          "InvalidTransition"
        )
        yield* callbacks.park(job, id)
        const r = yield* callbacks.resolve(id, { _tag: "Retry" })
        assert.strictEqual(r.state, "retryable")
        const again = yield* storage.getJob(job.jobId)
        assert.strictEqual(again.attempt, 0)
        yield* storage.promoteDue(1000)
        const [next] = yield* storage.claim({ queue: job.queue, max: 1, deadlineMs: 0, agingIntervalMs: 0 })
        assert.strictEqual(next!.attempt, 1)
        assert.isTrue(next!.runLease > job.runLease)
      })
  )

  it.effect(
    "a heartbeat extends the wait past the original timeout; without one the attempt is rescued",
    () =>
      Effect.gen(function* () {
        const callbacks = yield* CallbackStorage
        const kept = yield* claimOne("cb-heartbeat")
        const keptId = yield* register(kept, 2_000)
        yield* callbacks.park(kept, keptId)
        const lapsed = yield* claimOne("cb-timeout")
        const lapsedId = yield* register(lapsed, 2_000)
        yield* callbacks.park(lapsed, lapsedId)

        yield* ageCallbacks(1_500)
        const hb = yield* callbacks.resolve(keptId, { _tag: "Heartbeat", timeoutMs: 10_000 })
        assert.strictEqual(hb.state, "waiting_external")
        yield* ageCallbacks(1_000) // past both original timeouts
        const rescued = yield* callbacks.rescueTimedOut(500)
        const mine = rescued.filter((r) => r.jobId === kept.jobId || r.jobId === lapsed.jobId)
        assert.deepStrictEqual(
          mine.map((r) => [r.jobId, r.reason, r.state]),
          [[lapsed.jobId, "callback_timeout", "retryable"]]
        )
        assert.strictEqual(yield* stateOf(kept), "waiting_external")
        assert.strictEqual(yield* stateOf(lapsed), "retryable")
        assert.strictEqual(
          (yield* Effect.flip(callbacks.resolve(lapsedId, { _tag: "Complete" })))._tag,
          "CallbackStale"
        )
        assert.strictEqual((yield* callbacks.resolve(keptId, { _tag: "Complete" })).state, "completed")
      })
  )

  it.effect("callback timeout on the last attempt fails the job", () =>
    Effect.gen(function* () {
      const callbacks = yield* CallbackStorage
      const job = yield* claimOne("cb-exhaust", 1)
      const id = yield* register(job, 1_000)
      yield* callbacks.park(job, id)
      yield* ageCallbacks(2_000)
      const rescued = (yield* callbacks.rescueTimedOut(500)).filter((r) => r.jobId === job.jobId)
      assert.deepStrictEqual(
        rescued.map((r) => r.state),
        ["failed"]
      )
      const view = yield* (yield* QueueStorage).getJob(job.jobId)
      assert.strictEqual(view.errors.at(-1)!.error, "callback timed out")
    })
  )

  it.effect("a parked attempt is neither stale nor past its deadline; an unparked one is", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const callbacks = yield* CallbackStorage
      const parked = yield* claimOne("not-stale", 3, 1_000)
      const id = yield* register(parked)
      yield* callbacks.park(parked, id)
      const running = yield* claimOne("stale", 3, 1_000)
      yield* advance(1_100)
      const stale = (yield* storage.rescueStale({ stalenessMs: 1_000, limit: 10_000 })).map((r) => r.jobId)
      assert.isFalse(stale.includes(parked.jobId))
      assert.isTrue(stale.includes(running.jobId))
      const late = (yield* storage.rescueDeadlines(10_000)).map((r) => r.jobId)
      assert.isFalse(late.includes(parked.jobId))
      assert.strictEqual(yield* stateOf(parked), "waiting_external")
    })
  )

  it.effect("cancelling a pending callback withdraws it; register on a closed attempt is None", () =>
    Effect.gen(function* () {
      const callbacks = yield* CallbackStorage
      const job = yield* claimOne("cb-cancel")
      const id = yield* register(job)
      assert.isTrue(yield* callbacks.cancel(job))
      assert.isFalse(yield* callbacks.cancel(job))
      assert.strictEqual(
        (yield* Effect.flip(callbacks.resolve(id, { _tag: "Complete" })))._tag,
        "CallbackStale"
      )
      yield* complete(job)
      assert.isTrue(Option.isNone(yield* callbacks.register(job, { timeoutMs: 60_000 })))
    })
  )

  it.effect("timeouts outside 1 s – 30 days are rejected", () =>
    Effect.gen(function* () {
      const callbacks = yield* CallbackStorage
      const job = yield* claimOne("cb-range")
      for (const timeoutMs of [999, 30 * 86_400_000 + 1, 1.5]) {
        const e = yield* Effect.flip(callbacks.register(job, { timeoutMs }))
        assert.strictEqual(e._tag, "ValidationError")
      }
    })
  )
}
