/**
 * The contract every `QueueStorage` layer passes, unchanged (storage-engine.md §13, items marked
 * (S), plus capabilities.md §2–§5). `PgQueueStorage.test.ts` runs it on real Postgres with real
 * time; `SimQueueStorage.test.ts` runs it under `TestClock`. Each test uses its own queue names,
 * so tests sharing one storage instance never see each other's jobs.
 */
import { randomUUID } from "node:crypto"
import { checkNewJob, type NewJob, UniqueKey } from "@awa/core"
import type { Vitest } from "@effect/vitest"
import { assert } from "@effect/vitest"
import { Effect, Option } from "effect"
import { type ClaimParams, type FinalizeItem, QueueStorage } from "../../src/QueueStorage.ts"

export interface ContractOptions {
  /** Lets storage time pass: a real sleep on Postgres, `TestClock.adjust` in the simulation. */
  readonly advance: (ms: number) => Effect.Effect<void>
  /**
   * How many times longer the windows are in which something must NOT have happened yet (a retry
   * not yet due, a heartbeat not yet stale, a DLQ entry not yet expired). Default 1. On Postgres
   * they run on the wall clock, where a loaded machine can stretch the gap between two statements
   * past a window of 50 ms: there they are scaled up to seconds.
   */
  readonly scale?: number | undefined
}

const freshQueue = (label: string) => `${label}-${randomUUID().slice(0, 8)}`
const job = (queue: string, extra: Partial<NewJob> = {}): NewJob => ({
  kind: "contract_job",
  queue,
  args: { n: 0 },
  ...extra
})
const claimOf = (queue: string, max: number, extra: Partial<ClaimParams> = {}): ClaimParams => ({
  queue,
  max,
  deadlineMs: 0,
  agingIntervalMs: 0,
  ...extra
})
const complete = (t: { jobId: bigint; runLease: bigint }): FinalizeItem => ({
  ...t,
  outcome: { _tag: "Complete" }
})

export const suite = (it: Vitest.MethodsNonLive<QueueStorage>, { advance, scale = 1 }: ContractOptions) => {
  it.effect("enqueue returns increasing ids, available now or scheduled for a future runAt", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("enqueue")
      const far = new Date(Date.UTC(2100, 0, 1))
      const out = yield* storage.enqueueMany([job(q), job(q, { runAt: far }), job(q)])
      assert.deepStrictEqual(
        out.map((o) => o.state),
        ["available", "scheduled", "available"]
      )
      assert.isTrue(out[0]!.id < out[1]!.id && out[1]!.id < out[2]!.id)
      const scheduled = yield* storage.getJob(out[1]!.id)
      assert.strictEqual(scheduled.state, "scheduled")
      assert.strictEqual(scheduled.runAt.getTime(), far.getTime())
      const available = yield* storage.getJob(out[0]!.id)
      assert.deepStrictEqual(
        {
          state: available.state,
          attempt: available.attempt,
          runLease: available.runLease,
          args: available.args
        },
        { state: "available", attempt: 0, runLease: 0n, args: { n: 0 } }
      )
      assert.strictEqual(available.priority, 2)
      assert.strictEqual(available.maxAttempts, 25)
    })
  )

  it.effect("claims strictly in FIFO order within a lane, a batch at a time, each job once", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("fifo")
      const ids = (yield* storage.enqueueMany(
        Array.from({ length: 10 }, (_, n) => job(q, { args: { n } }))
      )).map((o) => o.id)
      const seen: Array<bigint> = []
      for (let round = 0; round < 4; round++) {
        const batch = yield* storage.claim(claimOf(q, 3))
        seen.push(...batch.map((c) => c.jobId))
      }
      assert.deepStrictEqual(seen, ids)
      assert.deepStrictEqual(yield* storage.claim(claimOf(q, 3)), [])
    })
  )

  it.effect("a claim increments run lease and attempt and returns the job snapshot", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("snapshot")
      const [enq] = yield* storage.enqueueMany([
        job(q, {
          args: { hello: "wörld", nested: [1, { a: null }] },
          tags: ["t1", "t2"],
          metadata: { m: 1 },
          maxAttempts: 3,
          priority: 3
        })
      ])
      const [c] = yield* storage.claim(claimOf(q, 10, { deadlineMs: 60_000 }))
      assert.strictEqual(c!.jobId, enq!.id)
      assert.strictEqual(c!.runLease, 1n)
      assert.strictEqual(c!.attempt, 1)
      assert.strictEqual(c!.maxAttempts, 3)
      assert.strictEqual(c!.priority, 3)
      assert.deepStrictEqual(c!.args, { hello: "wörld", nested: [1, { a: null }] })
      assert.deepStrictEqual(c!.tags, ["t1", "t2"])
      assert.deepStrictEqual(c!.metadata, { m: 1 })
      assert.isNotNull(c!.deadlineAt)
      assert.strictEqual(c!.deadlineAt!.getTime() - c!.claimedAt.getTime(), 60_000)
      assert.strictEqual((yield* storage.getJob(enq!.id)).state, "running")
    })
  )

  it.effect("serves higher priorities first and keeps FIFO inside each priority", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("prio")
      const out = yield* storage.enqueueMany([
        job(q, { priority: 3 }),
        job(q, { priority: 1 }),
        job(q, { priority: 4 }),
        job(q, { priority: 1 }),
        job(q, { priority: 2 })
      ])
      const order: Array<bigint> = []
      for (let i = 0; i < 5; i++) order.push(...(yield* storage.claim(claimOf(q, 1))).map((c) => c.jobId))
      assert.deepStrictEqual(order, [out[1]!.id, out[3]!.id, out[4]!.id, out[0]!.id, out[2]!.id])
    })
  )

  it.effect("claim-time aging lets a long-waiting low priority job overtake new high priority work", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("aging")
      const [old] = yield* storage.enqueueMany([job(q, { priority: 4 })])
      yield* advance(200)
      const [fresh] = yield* storage.enqueueMany([job(q, { priority: 1 })])
      // without aging the priority-1 job goes first
      const noAging = yield* storage.claim(claimOf(q, 1, { agingIntervalMs: 0 }))
      assert.strictEqual(noAging[0]!.jobId, fresh!.id)
      const [again] = yield* storage.enqueueMany([job(q, { priority: 1 })])
      // 200 ms waited at 50 ms per level: 4 − 4 ⇒ effective 1, and its head is older
      const aged = yield* storage.claim(claimOf(q, 1, { agingIntervalMs: 50 }))
      assert.strictEqual(aged[0]!.jobId, old!.id)
      const next = yield* storage.claim(claimOf(q, 1, { agingIntervalMs: 50 }))
      assert.strictEqual(next[0]!.jobId, again!.id)
    })
  )

  it.effect("a paused queue is not claimed but still accepts jobs; resume restarts claims", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("pause")
      yield* storage.pauseQueue(q)
      const [enq] = yield* storage.enqueueMany([job(q)])
      assert.deepStrictEqual(yield* storage.claim(claimOf(q, 5)), [])
      yield* storage.resumeQueue(q)
      const claimed = yield* storage.claim(claimOf(q, 5))
      assert.deepStrictEqual(
        claimed.map((c) => c.jobId),
        [enq!.id]
      )
    })
  )

  it.effect("completion is guarded by the run lease: duplicates and stale leases change nothing", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("guard")
      yield* storage.enqueueMany([job(q)])
      const [c] = yield* storage.claim(claimOf(q, 1))
      const stale = yield* storage.finalizeMany([
        { jobId: c!.jobId, runLease: c!.runLease + 5n, outcome: { _tag: "Complete" } }
      ])
      assert.deepStrictEqual(stale, [{ _tag: "Stale" }])
      assert.strictEqual((yield* storage.getJob(c!.jobId)).state, "running")
      const twice = yield* storage.finalizeMany([complete(c!), complete(c!)])
      assert.deepStrictEqual(twice, [{ _tag: "Applied", state: "completed" }, { _tag: "Stale" }])
      assert.deepStrictEqual(yield* storage.finalizeMany([complete(c!)]), [{ _tag: "Stale" }])
      const done = yield* storage.getJob(c!.jobId)
      assert.strictEqual(done.state, "completed")
      assert.isNotNull(done.finalizedAt)
      assert.deepStrictEqual(
        yield* storage.finalizeMany([{ jobId: 987654321n, runLease: 1n, outcome: { _tag: "Complete" } }]),
        [{ _tag: "Stale" }]
      )
    })
  )

  it.effect("a retry records the error, waits its delay and runs again with the next lease", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("retry")
      yield* storage.enqueueMany([job(q, { maxAttempts: 3 })])
      const [first] = yield* storage.claim(claimOf(q, 1))
      const [r] = yield* storage.finalizeMany([
        {
          jobId: first!.jobId,
          runLease: first!.runLease,
          outcome: { _tag: "Retry", delayMs: 100 * scale, error: "boom 1" }
        }
      ])
      assert.deepStrictEqual(r, { _tag: "Applied", state: "retryable" })
      const waiting = yield* storage.getJob(first!.jobId)
      assert.strictEqual(waiting.state, "retryable")
      assert.strictEqual(waiting.errors.length, 1)
      assert.strictEqual(waiting.errors[0]!.error, "boom 1")
      assert.strictEqual(waiting.errors[0]!.attempt, 1)
      assert.strictEqual(yield* storage.promoteDue(100), 0)
      assert.deepStrictEqual(yield* storage.claim(claimOf(q, 1)), [])
      yield* advance(150 * scale)
      assert.isAtLeast(yield* storage.promoteDue(1000), 1)
      const [second] = yield* storage.claim(claimOf(q, 1))
      assert.strictEqual(second!.jobId, first!.jobId)
      assert.strictEqual(second!.attempt, 2)
      assert.strictEqual(second!.runLease, 2n)
      assert.strictEqual(second!.errors.length, 1)
    })
  )

  it.effect("a retry on the last attempt fails the job terminally", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("exhaust")
      yield* storage.enqueueMany([job(q, { maxAttempts: 1 })])
      const [c] = yield* storage.claim(claimOf(q, 1))
      const [r] = yield* storage.finalizeMany([
        { jobId: c!.jobId, runLease: c!.runLease, outcome: { _tag: "Retry", delayMs: 0, error: "last" } }
      ])
      assert.deepStrictEqual(r, { _tag: "Applied", state: "failed" })
      const failed = yield* storage.getJob(c!.jobId)
      assert.strictEqual(failed.state, "failed")
      assert.strictEqual(failed.errors.at(-1)!.terminal, true)
      // nothing was deferred for it: promotion must not bring it back
      yield* storage.promoteDue(1000)
      assert.deepStrictEqual(yield* storage.claim(claimOf(q, 1)), [])
    })
  )

  it.effect("snooze does not count an attempt; fail and cancel outcomes are terminal", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("outcomes")
      const [a, b, c] = yield* storage.enqueueMany([job(q), job(q), job(q)])
      const claimed = yield* storage.claim(claimOf(q, 3))
      const results = yield* storage.finalizeMany([
        { jobId: a!.id, runLease: claimed[0]!.runLease, outcome: { _tag: "Snooze", delayMs: 0 } },
        { jobId: b!.id, runLease: claimed[1]!.runLease, outcome: { _tag: "Fail", error: "bad input" } },
        { jobId: c!.id, runLease: claimed[2]!.runLease, outcome: { _tag: "Cancel", reason: "not needed" } }
      ])
      assert.deepStrictEqual(
        results.map((r) => (r._tag === "Applied" ? r.state : r._tag)),
        ["scheduled", "failed", "cancelled"]
      )
      const failed = yield* storage.getJob(b!.id)
      assert.deepStrictEqual(
        [failed.errors.at(-1)!.error, failed.errors.at(-1)!.terminal],
        ["bad input", true]
      )
      const cancelled = yield* storage.getJob(c!.id)
      assert.strictEqual(cancelled.errors.at(-1)!.error, "cancelled: not needed")
      yield* advance(5)
      yield* storage.promoteDue(1000)
      const [again] = yield* storage.claim(claimOf(q, 5))
      assert.strictEqual(again!.jobId, a!.id)
      assert.strictEqual(again!.attempt, 1)
      assert.strictEqual(again!.runLease, 2n)
    })
  )

  it.effect(
    "heartbeats keep attempts alive, carry progress, and report attempts that are no longer open",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("heartbeat")
        yield* storage.enqueueMany([job(q), job(q)])
        const [live, other] = yield* storage.claim(claimOf(q, 2))
        yield* storage.finalizeMany([complete(other!)])
        const notOpen = yield* storage.heartbeatMany([
          { jobId: live!.jobId, runLease: live!.runLease, progress: { step: 3 } },
          { jobId: other!.jobId, runLease: other!.runLease }
        ])
        assert.deepStrictEqual(notOpen, [{ jobId: other!.jobId, runLease: other!.runLease }])
        assert.deepStrictEqual((yield* storage.getJob(live!.jobId)).progress, { step: 3 })
        yield* storage.finalizeMany([
          { jobId: live!.jobId, runLease: live!.runLease, outcome: { _tag: "Retry", delayMs: 0, error: "x" } }
        ])
        assert.deepStrictEqual((yield* storage.getJob(live!.jobId)).progress, { step: 3 })
      })
  )

  it.effect("deadline rescue retries the attempt, and the rescued attempt's late completion is stale", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("deadline")
      const [enq] = yield* storage.enqueueMany([job(q, { maxAttempts: 5 })])
      const [c] = yield* storage.claim(claimOf(q, 1, { deadlineMs: 20 }))
      yield* advance(60)
      const rescued = (yield* storage.rescueDeadlines(500)).filter((r) => r.jobId === enq!.id)
      assert.deepStrictEqual(rescued, [
        {
          jobId: enq!.id,
          runLease: 1n,
          reason: "deadline_exceeded",
          state: "retryable",
          queue: q,
          kind: "contract_job"
        }
      ])
      const view = yield* storage.getJob(enq!.id)
      assert.strictEqual(view.state, "retryable")
      assert.strictEqual(view.errors.at(-1)!.error, "hard deadline exceeded")
      // the old handler finishes late: rejected, nothing changes
      assert.deepStrictEqual(yield* storage.finalizeMany([complete(c!)]), [{ _tag: "Stale" }])
      assert.strictEqual((yield* storage.getJob(enq!.id)).state, "retryable")
      // a second sweep finds nothing more for it
      assert.deepStrictEqual(
        (yield* storage.rescueDeadlines(500)).filter((r) => r.jobId === enq!.id),
        []
      )
    })
  )

  it.effect("stale-heartbeat rescue spares attempts that heartbeat and fails exhausted ones", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("stale")
      const [a, b] = yield* storage.enqueueMany([job(q, { maxAttempts: 1 }), job(q, { maxAttempts: 1 })])
      const claimed = yield* storage.claim(claimOf(q, 2))
      yield* advance(80 * scale)
      yield* storage.heartbeatMany([{ jobId: b!.id, runLease: claimed[1]!.runLease }])
      const rescued = (yield* storage.rescueStale({ stalenessMs: 40 * scale, limit: 500 })).filter(
        (r) => r.jobId === a!.id || r.jobId === b!.id
      )
      assert.deepStrictEqual(rescued, [
        {
          jobId: a!.id,
          runLease: 1n,
          reason: "stale_heartbeat",
          state: "failed",
          queue: q,
          kind: "contract_job"
        }
      ])
      assert.strictEqual((yield* storage.getJob(a!.id)).state, "failed")
      assert.strictEqual((yield* storage.getJob(b!.id)).state, "running")
    })
  )

  it.effect("a unique key admits one live job, names the holder, and is released when the job fails", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("unique")
      const unique = { byArgs: true }
      const [first] = yield* storage.enqueueMany([job(q, { args: { user: 1 }, unique, maxAttempts: 1 })])
      const conflict = yield* Effect.flip(storage.enqueueMany([job(q, { args: { user: 1 }, unique })]))
      assert.strictEqual(conflict._tag, "UniqueConflict")
      if (conflict._tag === "UniqueConflict") {
        assert.strictEqual(conflict.existingJobId, first!.id)
        assert.match(conflict.key, /^[0-9a-f]{32}$/)
      }
      // other args are another key; key order in the args does not matter
      yield* storage.enqueueMany([job(q, { args: { user: 2 }, unique })])
      const sameKeyOtherOrder = yield* Effect.flip(
        storage.enqueueMany([
          job(q, { args: { b: 1, a: 2 }, unique }),
          job(q, { args: { a: 2, b: 1 }, unique })
        ])
      )
      assert.strictEqual(sameKeyOtherOrder._tag, "UniqueConflict")
      // the whole batch was rejected: the first of the two was not stored either
      yield* storage.enqueueMany([job(q, { args: { a: 2, b: 1 }, unique })])
      // failing releases the key (failed is outside the default mask)
      const [c] = yield* storage.claim(claimOf(q, 1))
      assert.strictEqual(c!.jobId, first!.id)
      yield* storage.finalizeMany([
        { jobId: c!.jobId, runLease: c!.runLease, outcome: { _tag: "Fail", error: "no" } }
      ])
      const [again] = yield* storage.enqueueMany([job(q, { args: { user: 1 }, unique })])
      assert.isTrue(again!.id > first!.id)
    })
  )

  it.effect("bad input is a ValidationError naming the field, and nothing is written", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("bad")
      const cases: Array<[Partial<NewJob>, string]> = [
        [{ priority: 0 }, "priority"],
        [{ priority: 2.5 }, "priority"],
        [{ maxAttempts: 1001 }, "maxAttempts"],
        [{ queue: " padded" }, "queue"],
        [{ queue: "" }, "queue"],
        [{ queue: "x".repeat(201) }, "queue"],
        [{ args: { big: 10n } }, "args.big"],
        [{ args: { f: () => 1 } }, "args.f"],
        [{ args: { s: "nul\u0000" } }, "args.s"],
        [{ args: Number.NaN }, "args"],
        [{ metadata: { "awa:internal": 1 } }, "metadata.awa:internal"],
        [{ tags: Array.from({ length: 21 }, (_, i) => `t${i}`) }, "tags"],
        [{ orderingKey: "" }, "orderingKey"],
        [{ orderingKey: "x".repeat(1025) }, "orderingKey"]
      ]
      for (const [extra, field] of cases) {
        const error = yield* Effect.flip(storage.enqueueMany([job(q), job(q, extra)]))
        assert.strictEqual(error._tag, "ValidationError", field)
        if (error._tag === "ValidationError") assert.strictEqual(error.field, field)
      }
      assert.deepStrictEqual(yield* storage.listJobs({ queue: q }), [])
      assert.deepStrictEqual(yield* storage.claim(claimOf(q, 10)), [])
    })
  )

  it.effect(
    "a queue's enqueueShards out of 1–64 is a ValidationError; in range, every job is still claimed",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("shards")
        for (const bad of [0, 65, 2.5]) {
          const error = yield* Effect.flip(storage.configureQueue(q, { enqueueShards: bad }))
          assert.strictEqual(error._tag, "ValidationError", String(bad))
          if (error._tag === "ValidationError") assert.strictEqual(error.field, "enqueueShards")
        }
        yield* storage.configureQueue(q, { enqueueShards: 3 })
        for (let n = 0; n < 6; n++)
          yield* storage.enqueueMany([job(q, { args: { n }, orderingKey: `k${n % 2}` })])
        const claimed = yield* storage.claim(claimOf(q, 10))
        assert.deepStrictEqual(
          claimed.map((c) => (c.args as { n: number }).n).sort((a, b) => a - b),
          [0, 1, 2, 3, 4, 5]
        )
        // one key's jobs in insert order, whatever the shards
        const ofKey0 = claimed.map((c) => (c.args as { n: number }).n).filter((n) => n % 2 === 0)
        assert.deepStrictEqual(ofKey0, [0, 2, 4])
      })
  )

  it.effect("a maintenance policy out of range is a ValidationError naming the field", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const retention = { completedMs: 0, failedMs: 0, cancelledMs: 0 }
      const cases: Array<
        [Effect.Effect<unknown, { readonly _tag: string; readonly field?: string }>, string]
      > = [
        [storage.rotateWhenDue({ minRows: 0 }), "minRows"],
        [storage.rotateWhenDue({ minRows: 1.5 }), "minRows"],
        [storage.rotateWhenDue({ maxAgeMs: -1 }), "maxAgeMs"],
        [storage.rotateWhenDue({ maxAgeMs: 3_600_001 }), "maxAgeMs"],
        [storage.prune({ ...retention, carryAfterMs: -1 }), "carryAfterMs"],
        [storage.prune({ ...retention, carryAfterMs: 0.5 }), "carryAfterMs"]
      ]
      for (const [call, field] of cases) {
        const error = yield* Effect.flip(call)
        assert.strictEqual(error._tag, "ValidationError", field)
        assert.strictEqual(error.field, field)
      }
    })
  )

  it.effect("a queue name of the maximum length and SQL-looking strings are stored verbatim", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = `${"q".repeat(190)}${randomUUID().slice(0, 10)}`
      const evil = "x'); DROP TABLE jobs; --"
      const [enq] = yield* storage.enqueueMany([
        job(q, { kind: evil, tags: [evil], metadata: { [evil]: evil } })
      ])
      const [c] = yield* storage.claim(claimOf(q, 1))
      assert.strictEqual(c!.jobId, enq!.id)
      assert.strictEqual(c!.kind, evil)
      assert.deepStrictEqual(c!.tags, [evil])
      assert.deepStrictEqual(c!.metadata, { [evil]: evil })
    })
  )

  it.effect("operator cancel works on available, scheduled and running jobs and refuses finished ones", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("cancel")
      const [avail, sched, run] = yield* storage.enqueueMany([
        job(q),
        job(q, { runAt: new Date(Date.UTC(2100, 0, 1)) }),
        job(q)
      ])
      const cancelledAvail = yield* storage.cancelJob(avail!.id, "operator")
      assert.strictEqual(cancelledAvail.state, "cancelled")
      assert.strictEqual(cancelledAvail.errors.at(-1)!.error, "cancelled: operator")
      assert.strictEqual((yield* storage.cancelJob(sched!.id, "operator")).state, "cancelled")
      const [c] = yield* storage.claim(claimOf(q, 10))
      assert.strictEqual(c!.jobId, run!.id) // the cancelled available job was skipped
      assert.strictEqual((yield* storage.cancelJob(run!.id, "stop")).state, "cancelled")
      assert.deepStrictEqual(yield* storage.finalizeMany([complete(c!)]), [{ _tag: "Stale" }])
      const again = yield* Effect.flip(storage.cancelJob(run!.id, "again"))
      assert.strictEqual(again._tag, "InvalidTransition")
      const missing = yield* Effect.flip(storage.cancelJob(999_999_999n, "x"))
      assert.strictEqual(missing._tag, "JobNotFound")
    })
  )

  it.effect("operator retry makes a failed job available again with attempt 0 and a growing run lease", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("opretry")
      const [enq] = yield* storage.enqueueMany([job(q, { maxAttempts: 1 })])
      const [c] = yield* storage.claim(claimOf(q, 1))
      yield* storage.finalizeMany([
        { jobId: c!.jobId, runLease: c!.runLease, outcome: { _tag: "Fail", error: "nope" } }
      ])
      const view = yield* storage.retryJob(enq!.id)
      assert.strictEqual(view.state, "available")
      assert.strictEqual(view.attempt, 0)
      assert.strictEqual(view.errors.length, 1)
      const [again] = yield* storage.claim(claimOf(q, 1))
      assert.strictEqual(again!.jobId, enq!.id)
      assert.strictEqual(again!.attempt, 1)
      assert.strictEqual(again!.runLease, 2n)
      yield* storage.finalizeMany([complete(again!)])
      assert.strictEqual((yield* storage.getJob(enq!.id)).state, "completed")
      const refused = yield* Effect.flip(storage.retryJob(enq!.id))
      assert.strictEqual(refused._tag, "InvalidTransition")
      assert.strictEqual((yield* Effect.flip(storage.retryJob(999_999_998n)))._tag, "JobNotFound")
    })
  )

  it.effect("lists jobs newest first with filters and keyset pagination, and counts them per state", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("list")
      const out = yield* storage.enqueueMany([
        job(q, { kind: "a", tags: ["red"] }),
        job(q, { kind: "b" }),
        job(q, { kind: "a", tags: ["red", "blue"] }),
        job(q, { kind: "a" })
      ])
      const [c] = yield* storage.claim(claimOf(q, 1))
      yield* storage.finalizeMany([complete(c!)])
      const page1 = yield* storage.listJobs({ queue: q, limit: 2 })
      assert.deepStrictEqual(
        page1.map((j) => j.id),
        [out[3]!.id, out[2]!.id]
      )
      const page2 = yield* storage.listJobs({ queue: q, limit: 2, before: page1[1]!.id })
      assert.deepStrictEqual(
        page2.map((j) => j.id),
        [out[1]!.id, out[0]!.id]
      )
      assert.deepStrictEqual(
        (yield* storage.listJobs({ queue: q, kind: "a" })).map((j) => j.id),
        [out[3]!.id, out[2]!.id, out[0]!.id]
      )
      assert.deepStrictEqual(
        (yield* storage.listJobs({ queue: q, tag: "red" })).map((j) => j.id),
        [out[2]!.id, out[0]!.id]
      )
      assert.deepStrictEqual(
        (yield* storage.listJobs({ queue: q, state: "completed" })).map((j) => j.id),
        [out[0]!.id]
      )
      const counts = (yield* storage.countByQueueState).filter((x) => x.queue === q)
      assert.deepStrictEqual(counts, [
        { queue: q, state: "available", count: 3 },
        { queue: q, state: "completed", count: 1 }
      ])
      assert.strictEqual((yield* Effect.flip(storage.listJobs({ limit: 0 })))._tag, "ValidationError")
    })
  )

  it.effect("cancel by unique key cancels the live holder once, and nothing for a free or finished key", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("bykey")
      const unique = { byArgs: true, byQueue: true }
      const keyOf = (args: unknown) =>
        Effect.map(checkNewJob(job(q, { args, unique }), { nowMillis: 0 }), (c) =>
          UniqueKey.toHex(c.uniqueKey!)
        )
      const [held] = yield* storage.enqueueMany([job(q, { args: { k: 1 }, unique })])
      const cancelled = yield* storage.cancelByUniqueKey(yield* keyOf({ k: 1 }), "by key")
      assert.deepStrictEqual(cancelled, Option.some(held!.id))
      const view = yield* storage.getJob(held!.id)
      assert.deepStrictEqual([view.state, view.errors.at(-1)!.error], ["cancelled", "cancelled: by key"])
      assert.deepStrictEqual(yield* storage.cancelByUniqueKey(yield* keyOf({ k: 1 }), "again"), Option.none())
      assert.deepStrictEqual(
        yield* storage.cancelByUniqueKey(yield* keyOf({ k: 404 }), "free"),
        Option.none()
      )
      // a completed job keeps its key (completed is in the default mask) but is not live
      const [done] = yield* storage.enqueueMany([job(q, { args: { k: 2 }, unique })])
      const [c] = yield* storage.claim(claimOf(q, 1))
      assert.strictEqual(c!.jobId, done!.id)
      yield* storage.finalizeMany([complete(c!)])
      assert.deepStrictEqual(yield* storage.cancelByUniqueKey(yield* keyOf({ k: 2 }), "late"), Option.none())
      assert.strictEqual((yield* storage.getJob(done!.id)).state, "completed")
    })
  )

  it.effect("error messages and cancel reasons are stored cut to 4 KiB", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("longmsg")
      const [a, b] = yield* storage.enqueueMany([job(q), job(q)])
      const claimed = yield* storage.claim(claimOf(q, 2))
      yield* storage.finalizeMany([
        {
          jobId: claimed[0]!.jobId,
          runLease: claimed[0]!.runLease,
          outcome: { _tag: "Fail", error: "e".repeat(5000) }
        },
        {
          jobId: claimed[1]!.jobId,
          runLease: claimed[1]!.runLease,
          outcome: { _tag: "Cancel", reason: "r".repeat(5000) }
        }
      ])
      assert.strictEqual((yield* storage.getJob(a!.id)).errors.at(-1)!.error.length, 4096)
      assert.strictEqual(
        (yield* storage.getJob(b!.id)).errors.at(-1)!.error,
        `cancelled: ${"r".repeat(4096)}`
      )
    })
  )

  it.effect("outcome delays outside 0 ms – 30 days are rejected before anything is applied", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("delay")
      yield* storage.enqueueMany([job(q)])
      const [c] = yield* storage.claim(claimOf(q, 1))
      const error = yield* Effect.flip(
        storage.finalizeMany([
          { jobId: c!.jobId, runLease: c!.runLease, outcome: { _tag: "Snooze", delayMs: -1 } }
        ])
      )
      assert.strictEqual(error._tag, "ValidationError")
      assert.strictEqual((yield* storage.getJob(c!.jobId)).state, "running")
    })
  )

  // --- dead letter queue (capability 19) ------------------------------------------------------

  const failTo = (c: { jobId: bigint; runLease: bigint }, error = "broken"): FinalizeItem => ({
    jobId: c.jobId,
    runLease: c.runLease,
    outcome: { _tag: "Fail", error }
  })

  it.effect(
    "a DLQ queue dead-letters terminal errors and exhausted retries with their reason and history",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("dlq-route")
        const plain = freshQueue("no-dlq")
        yield* storage.configureQueue(q, { dlq: true })
        const [terminal, exhausted] = yield* storage.enqueueMany([
          job(q, { maxAttempts: 3 }),
          job(q, { maxAttempts: 2 })
        ])
        const [kept] = yield* storage.enqueueMany([job(plain, { maxAttempts: 1 })])
        const [a, b] = yield* storage.claim(claimOf(q, 2))
        yield* storage.finalizeMany([
          failTo(a!, "bad input"),
          { jobId: b!.jobId, runLease: b!.runLease, outcome: { _tag: "Retry", delayMs: 0, error: "try 1" } }
        ])
        yield* advance(5)
        yield* storage.promoteDue(100)
        const [b2] = yield* storage.claim(claimOf(q, 1))
        yield* storage.finalizeMany([
          { jobId: b2!.jobId, runLease: b2!.runLease, outcome: { _tag: "Retry", delayMs: 0, error: "try 2" } }
        ])
        const [c] = yield* storage.claim(claimOf(plain, 1))
        yield* storage.finalizeMany([failTo(c!)])

        const t = yield* storage.getDlq(terminal!.id)
        assert.deepStrictEqual(
          [t.reason, t.attempt, t.originalRunLease, t.queue],
          ["terminal_error", 1, 1n, q]
        )
        assert.strictEqual(t.errors.at(-1)!.error, "bad input")
        const e = yield* storage.getDlq(exhausted!.id)
        assert.deepStrictEqual([e.reason, e.attempt, e.originalRunLease], ["max_attempts_exhausted", 2, 2n])
        assert.deepStrictEqual(
          e.errors.map((x) => x.error),
          ["try 1", "try 2"]
        )
        const view = yield* storage.getJob(exhausted!.id)
        assert.deepStrictEqual([view.state, view.dlqReason], ["failed", "max_attempts_exhausted"])
        // a queue without DLQ keeps its failed job as a plain failed job
        assert.deepStrictEqual(
          [(yield* storage.getJob(kept!.id)).dlqReason, (yield* storage.getJob(kept!.id)).state],
          [null, "failed"]
        )
        assert.strictEqual((yield* Effect.flip(storage.getDlq(kept!.id)))._tag, "JobNotFound")
        assert.deepStrictEqual(
          (yield* storage.listDlq({ queue: q })).map((x) => x.id),
          [exhausted!.id, terminal!.id]
        )
      })
  )

  it.effect("rescue exhaustion on a DLQ queue is dead-lettered with the rescue's reason", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("dlq-rescue")
      yield* storage.configureQueue(q, { dlq: true })
      const [late, silent] = yield* storage.enqueueMany([
        job(q, { maxAttempts: 1 }),
        job(q, { maxAttempts: 1 })
      ])
      yield* storage.claim(claimOf(q, 1, { deadlineMs: 10 }))
      yield* storage.claim(claimOf(q, 1))
      yield* advance(60)
      yield* storage.rescueDeadlines(500)
      yield* storage.rescueStale({ stalenessMs: 30, limit: 500 })
      assert.strictEqual((yield* storage.getDlq(late!.id)).reason, "deadline_exceeded")
      assert.strictEqual((yield* storage.getDlq(silent!.id)).reason, "stale_heartbeat")
    })
  )

  it.effect("the global default routes queues without a setting; a queue's own setting wins", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("dlq-default")
      const optOut = freshQueue("dlq-optout")
      yield* storage.configureQueue(optOut, { dlq: false })
      yield* storage.setDlqDefault(true)
      const [a] = yield* storage.enqueueMany([job(q)])
      const [b] = yield* storage.enqueueMany([job(optOut)])
      yield* storage.finalizeMany([failTo((yield* storage.claim(claimOf(q, 1)))[0]!)])
      yield* storage.finalizeMany([failTo((yield* storage.claim(claimOf(optOut, 1)))[0]!)])
      yield* storage.setDlqDefault(false)
      assert.strictEqual((yield* storage.getJob(a!.id)).dlqReason, "terminal_error")
      assert.strictEqual((yield* storage.getJob(b!.id)).dlqReason, null)
    })
  )

  it.effect(
    "retry from the DLQ runs the job again from attempt 1 with a growing lease, honouring overrides",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("dlq-retry")
        const moved = freshQueue("dlq-moved")
        yield* storage.configureQueue(q, { dlq: true })
        const [one, two] = yield* storage.enqueueMany([job(q), job(q)])
        const claimed = yield* storage.claim(claimOf(q, 2))
        yield* storage.finalizeMany(claimed.map((c) => failTo(c)))
        const back = yield* storage.retryFromDlq(one!.id)
        assert.deepStrictEqual([back.state, back.attempt, back.dlqReason], ["available", 0, null])
        const [again] = yield* storage.claim(claimOf(q, 1))
        assert.deepStrictEqual([again!.jobId, again!.attempt, again!.runLease], [one!.id, 1, 2n])
        assert.deepStrictEqual(yield* storage.finalizeMany([complete(again!)]), [
          { _tag: "Applied", state: "completed" }
        ])
        // overrides: another queue, another priority, later
        const later = new Date(Date.UTC(2100, 0, 1))
        const scheduled = yield* storage.retryFromDlq(two!.id, { queue: moved, priority: 1, runAt: later })
        assert.deepStrictEqual(
          [scheduled.state, scheduled.queue, scheduled.priority],
          ["scheduled", moved, 1]
        )
        assert.deepStrictEqual(yield* storage.listDlq({ queue: q }), [])
        assert.strictEqual((yield* Effect.flip(storage.retryFromDlq(one!.id)))._tag, "JobNotFound")
        assert.strictEqual((yield* Effect.flip(storage.retryFromDlq(424_242_424n)))._tag, "JobNotFound")
      })
  )

  it.effect("purge removes entries; bulk actions need a filter or all: true and return counts", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("dlq-bulk")
      yield* storage.configureQueue(q, { dlq: true })
      const jobs = yield* storage.enqueueMany([
        job(q, { kind: "a" }),
        job(q, { kind: "a" }),
        job(q, { kind: "b" }),
        job(q, { kind: "b" })
      ])
      yield* storage.finalizeMany((yield* storage.claim(claimOf(q, 4))).map((c) => failTo(c)))
      yield* storage.purgeDlq(jobs[0]!.id)
      assert.strictEqual((yield* Effect.flip(storage.getDlq(jobs[0]!.id)))._tag, "JobNotFound")
      assert.strictEqual((yield* Effect.flip(storage.purgeDlq(jobs[0]!.id)))._tag, "JobNotFound")
      const unsafe = yield* Effect.flip(storage.purgeDlqBulk({}))
      assert.strictEqual(unsafe._tag, "UnsafeBulkFilter")
      assert.strictEqual((yield* Effect.flip(storage.retryDlqBulk({})))._tag, "UnsafeBulkFilter")
      assert.strictEqual(yield* storage.retryDlqBulk({ queue: q, kind: "b" }), 2)
      assert.deepStrictEqual(
        (yield* storage.listDlq({ queue: q })).map((e) => e.id),
        [jobs[1]!.id]
      )
      assert.strictEqual(yield* storage.purgeDlqBulk({ queue: q }), 1)
      assert.deepStrictEqual(yield* storage.listDlq({ queue: q }), [])
      assert.strictEqual((yield* Effect.flip(storage.listDlq({ limit: 0 })))._tag, "ValidationError")
    })
  )

  it.effect("DLQ retention deletes only entries older than their queue's retention", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const short = freshQueue("dlq-short")
      const long = freshQueue("dlq-long")
      yield* storage.configureQueue(short, { dlq: true, dlqRetentionMs: 50 * scale })
      yield* storage.configureQueue(long, { dlq: true })
      const [s] = yield* storage.enqueueMany([job(short)])
      const [l] = yield* storage.enqueueMany([job(long)])
      yield* storage.finalizeMany([failTo((yield* storage.claim(claimOf(short, 1)))[0]!)])
      yield* storage.finalizeMany([failTo((yield* storage.claim(claimOf(long, 1)))[0]!)])
      assert.strictEqual(yield* storage.cleanupDlq(30 * 86_400_000, 1000), 0)
      assert.isDefined(yield* storage.getDlq(s!.id))
      yield* advance(120 * scale)
      assert.isAtLeast(yield* storage.cleanupDlq(30 * 86_400_000, 1000), 1)
      assert.strictEqual((yield* Effect.flip(storage.getDlq(s!.id)))._tag, "JobNotFound")
      assert.strictEqual((yield* storage.getDlq(l!.id)).id, l!.id)
    })
  )

  it.effect("draining a queue cancels everything not yet running and leaves running jobs alone", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const q = freshQueue("drain")
      const [running, waiting, scheduled] = yield* storage.enqueueMany([
        job(q),
        job(q),
        job(q, { runAt: new Date(Date.UTC(2100, 0, 1)) })
      ])
      const [c] = yield* storage.claim(claimOf(q, 1))
      assert.strictEqual(c!.jobId, running!.id)
      assert.strictEqual(yield* storage.drainQueue(q, "queue drained"), 2)
      assert.strictEqual((yield* storage.getJob(waiting!.id)).state, "cancelled")
      assert.strictEqual((yield* storage.getJob(scheduled!.id)).state, "cancelled")
      assert.strictEqual((yield* storage.getJob(running!.id)).state, "running")
      assert.strictEqual(yield* storage.drainQueue(q, "again"), 0)
    })
  )
}
