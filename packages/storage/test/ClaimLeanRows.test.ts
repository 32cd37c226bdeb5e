/**
 * Migration 0061: claim and claim_keyed answer lean rows (empty metadata, tags and errors as NULL,
 * `run_at` NULL when it equals `created_at`, the call's `claimed_at` and `deadline_at` on the first
 * row of each answering statement only), and the storage layer restores every value.
 *
 * What would break: a worker that reads a NULL as the value (a job without its tags, its errors or
 * its run time, or a job of a call's second lane without its deadline: never cut off) or a claim
 * whose answer repeats what the worker already knows. The raw-row assertions were seen to fail on
 * 0060's functions (every value on every row); the decoded ones guard the restoration, for each
 * statement that answers: claim's pick (two lanes in one call: two statements), claim's
 * keys-at-claim statement, claim_keyed's one-row statement and its general one.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { KeyGrants } from "../src/KeyGrants.ts"
import type { ClaimedJob } from "../src/QueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { fresh, withGrantsDatabase } from "./pgFixtures.ts"

interface RawRow {
  readonly job_id: string
  readonly metadata: unknown
  readonly tags: unknown
  readonly errors: unknown
  readonly run_at: Date | null
  readonly claimed_at: Date | null
  readonly deadline_at: Date | null
}

const minuteMs = 60_000
const past = new Date(Date.now() - 3_600_000)

/** Every job of one call has the call's times; a deadline a minute after the claim. */
const assertCallTimes = (jobs: ReadonlyArray<ClaimedJob>) => {
  const claimedAt = jobs[0]!.claimedAt.getTime()
  for (const job of jobs) {
    assert.strictEqual(job.claimedAt.getTime(), claimedAt)
    assert.strictEqual(job.deadlineAt?.getTime(), claimedAt + minuteMs)
  }
}

describe("lean claim rows (0061)", () => {
  it.live("claim leaves out empty values and repeated times; the jobs have them all", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const queue = fresh("lean")
        // two lanes (priorities 1 and 2): one call answers in two statements
        yield* storage.enqueueMany([
          { kind: "k", queue, args: { n: 0 }, priority: 1 },
          {
            kind: "k",
            queue,
            args: { n: 1 },
            priority: 1,
            tags: ["a", "b"],
            metadata: { m: 1 },
            runAt: past
          },
          { kind: "k", queue, args: { n: 2 }, priority: 2 },
          { kind: "k", queue, args: { n: 3 }, priority: 2 }
        ])
        const raw =
          yield* sql<RawRow>`SELECT job_id::text, metadata, tags, errors, run_at, claimed_at, deadline_at
                                       FROM awa.claim(${queue}, 10, ${minuteMs}::bigint, 0)`
        assert.strictEqual(raw.length, 4)
        // the call's times on the first row of each lane's statement only
        assert.deepStrictEqual(
          raw.map((r) => [r.claimed_at !== null, r.deadline_at !== null]),
          [
            [true, true],
            [false, false],
            [true, true],
            [false, false]
          ]
        )
        assert.deepStrictEqual(
          raw.map((r) => [r.metadata, r.tags, r.errors, r.run_at === null]),
          [
            [null, null, null, true],
            [{ m: 1 }, ["a", "b"], null, false],
            [null, null, null, true],
            [null, null, null, true]
          ]
        )

        // the same kind of call through the storage layer: every value restored
        const again = fresh("lean")
        const enqueued = yield* storage.enqueueMany([
          { kind: "k", queue: again, args: { n: 0 }, priority: 1 },
          {
            kind: "k",
            queue: again,
            args: { n: 1 },
            priority: 1,
            tags: ["a", "b"],
            metadata: { m: 1 },
            runAt: past
          },
          { kind: "k", queue: again, args: { n: 2 }, priority: 2 }
        ])
        const jobs = yield* storage.claim({ queue: again, max: 10, deadlineMs: minuteMs, agingIntervalMs: 0 })
        assert.deepStrictEqual(
          jobs.map((j) => j.jobId),
          enqueued.map((e) => e.id)
        )
        assertCallTimes(jobs)
        assert.deepStrictEqual(
          jobs.map((j) => [j.metadata, j.tags, j.errors, j.progress]),
          [
            [{}, [], [], null],
            [{ m: 1 }, ["a", "b"], [], null],
            [{}, [], [], null]
          ]
        )
        const views = yield* Effect.forEach(enqueued, (e) => storage.getJob(e.id))
        for (let i = 0; i < jobs.length; i++) {
          assert.strictEqual(jobs[i]!.createdAt.getTime(), views[i]!.createdAt.getTime())
          assert.strictEqual(jobs[i]!.runAt.getTime(), views[i]!.runAt.getTime())
        }
        assert.strictEqual(jobs[1]!.runAt.getTime(), past.getTime())
        assert.notStrictEqual(jobs[0]!.runAt, jobs[0]!.createdAt) // a Date of its own

        // a retried job's second attempt carries its errors
        const [retried] = yield* storage.finalizeMany([
          {
            jobId: jobs[0]!.jobId,
            runLease: jobs[0]!.runLease,
            outcome: { _tag: "Retry", delayMs: 0, error: "boom" }
          }
        ])
        assert.deepStrictEqual(retried, { _tag: "Applied", state: "retryable" })
        yield* storage.promoteDue(100)
        const [second] = yield* storage.claim({ queue: again, max: 10, deadlineMs: 0, agingIntervalMs: 0 })
        assert.deepStrictEqual(
          [second!.jobId, second!.attempt, second!.errors.map((e) => e.error), second!.deadlineAt],
          [jobs[0]!.jobId, 2, ["boom"], null]
        )
      })
    )
  )

  it.live("claim's keys-at-claim statement answers lean rows, its first row with the call's times", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        // a mask holding 'running' but not 'available': the key is taken at claim, by claim's
        // second statement (0024); the pick's statement answers none of these rows, so the
        // second statement's rows come first and must carry the call's times themselves
        const unique = { byArgs: true, states: ["running"] as const }
        // (args of their own per queue: the first queue's jobs hold their keys while running)
        const keysAtClaim = (queue: string) =>
          storage.enqueueMany([
            { kind: "k", queue, args: { queue, n: 1 }, unique },
            { kind: "k", queue, args: { queue, n: 2 }, unique, tags: ["t"] }
          ])
        const queue = fresh("lean-keys")
        yield* keysAtClaim(queue)
        const raw =
          yield* sql<RawRow>`SELECT job_id::text, metadata, tags, errors, run_at, claimed_at, deadline_at
                                       FROM awa.claim(${queue}, 10, ${minuteMs}::bigint, 0)`
        assert.deepStrictEqual(
          raw.map((r) => [r.claimed_at !== null, r.deadline_at !== null, r.tags, r.errors, r.run_at]),
          [
            [true, true, null, null, null],
            [false, false, ["t"], null, null]
          ]
        )
        const again = fresh("lean-keys")
        yield* keysAtClaim(again)
        const jobs = yield* storage.claim({ queue: again, max: 10, deadlineMs: minuteMs, agingIntervalMs: 0 })
        assert.deepStrictEqual(
          jobs.map((j) => [j.args, j.tags, j.errors]),
          [
            [{ queue: again, n: 1 }, [], []],
            [{ queue: again, n: 2 }, ["t"], []]
          ]
        )
        assertCallTimes(jobs)
      })
    )
  )

  it.live("claim_keyed answers lean rows in its one-row and its general statement", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const grants = yield* KeyGrants
        const sql = yield* SqlClient.SqlClient
        const queue = fresh("lean-keyed")
        const policy = `${queue}-policy`
        yield* grants.create({ id: policy, maxInFlight: 10 })
        yield* storage.enqueueMany([
          { kind: "k", queue, args: { n: 0 }, concurrencyKey: "a" },
          { kind: "k", queue, args: { n: 1 }, concurrencyKey: "b", tags: ["x"] },
          { kind: "k", queue, args: { n: 2 }, concurrencyKey: "a", runAt: past }
        ])
        const claimKeyed = (max: number) =>
          Effect.map(grants.claim({ queue, policy, max, deadlineMs: minuteMs, agingIntervalMs: 0 }), (out) =>
            out._tag === "Claimed" ? out.jobs : []
          )
        // one job: the one-row statement (0056)
        const [one] = yield* claimKeyed(1)
        // a keyed job's metadata holds its key
        assert.deepStrictEqual(
          [one!.args, one!.tags, one!.metadata, one!.errors],
          [{ n: 0 }, [], { "awa:concurrencyKey": "a" }, []]
        )
        assert.strictEqual(one!.deadlineAt?.getTime(), one!.claimedAt.getTime() + minuteMs)
        assert.strictEqual(one!.runAt.getTime(), one!.createdAt.getTime())
        // two: the general statement, its times on the first row only
        const raw =
          yield* sql<RawRow>`SELECT job_id::text, metadata, tags, errors, run_at, claimed_at, deadline_at
                                       FROM awa.claim_keyed(${queue}, ${policy}, 10, ${minuteMs}::bigint, 0)`
        assert.deepStrictEqual(
          raw.map((r) => [r.claimed_at !== null, r.deadline_at !== null, r.tags, r.run_at === null]),
          [
            [true, true, ["x"], true],
            [false, false, null, false]
          ]
        )
      })
    )
  )

  it.live("the general keyed statement's jobs are restored through the storage layer", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const grants = yield* KeyGrants
        const queue = fresh("lean-keyed2")
        const policy = `${queue}-policy`
        yield* grants.create({ id: policy, maxInFlight: 10 })
        yield* storage.enqueueMany([
          { kind: "k", queue, args: { n: 0 }, concurrencyKey: "a", metadata: { m: 2 } },
          { kind: "k", queue, args: { n: 1 }, concurrencyKey: "b" },
          { kind: "k", queue, args: { n: 2 }, concurrencyKey: "a", runAt: past }
        ])
        const out = yield* grants.claim({ queue, policy, max: 10, deadlineMs: minuteMs, agingIntervalMs: 0 })
        assert.strictEqual(out._tag, "Claimed")
        const jobs = out._tag === "Claimed" ? out.jobs : []
        assert.deepStrictEqual(
          jobs.map((j) => [j.args, j.metadata, j.tags, j.errors]),
          [
            [{ n: 0 }, { m: 2, "awa:concurrencyKey": "a" }, [], []],
            [{ n: 1 }, { "awa:concurrencyKey": "b" }, [], []],
            [{ n: 2 }, { "awa:concurrencyKey": "a" }, [], []]
          ]
        )
        assertCallTimes(jobs)
        assert.strictEqual(jobs[2]!.runAt.getTime(), past.getTime())
      })
    )
  )
})
