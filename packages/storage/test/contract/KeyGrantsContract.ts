/**
 * Key-execution grants (capabilities.md §23, migration 0033): the same observable behaviour from
 * every `KeyGrants` layer. Run by `KeyGrants.test.ts` on Postgres (real time) and on the
 * simulation (`TestClock`).
 */
import { randomUUID } from "node:crypto"
import type { NewJob } from "@awa/core"
import type { Vitest } from "@effect/vitest"
import { assert } from "@effect/vitest"
import { Effect } from "effect"
import { type KeyedClaim, KeyGrants } from "../../src/KeyGrants.ts"
import { type ClaimedJob, QueueStorage } from "../../src/QueueStorage.ts"

const fresh = (label: string) => `${label}-${randomUUID().slice(0, 8)}`
const job = (queue: string, key: string | undefined, extra: Partial<NewJob> = {}): NewJob => ({
  kind: "keyed_job",
  queue,
  args: {},
  ...(key === undefined ? {} : { concurrencyKey: key }),
  ...extra
})
const claimOf = (queue: string, policy: string, max = 10) => ({
  queue,
  policy,
  max,
  deadlineMs: 0,
  agingIntervalMs: 0
})
const jobsOf = (c: KeyedClaim): ReadonlyArray<ClaimedJob> => (c._tag === "Claimed" ? c.jobs : [])
const blockedOf = (c: KeyedClaim) => (c._tag === "Claimed" ? c.blocked : c._tag)
const complete = (jobs: ReadonlyArray<ClaimedJob>) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.finalizeMany(
      jobs.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
    )
  )

export const suite = (it: Vitest.MethodsNonLive<QueueStorage | KeyGrants>) => {
  it.effect(
    "admits at most maxInFlight per key; a closure admits the next; other keys and unkeyed jobs pass",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const grants = yield* KeyGrants
        const q = fresh("kg")
        const p = fresh("policy")
        yield* grants.create({ id: p, maxInFlight: 2 })
        yield* storage.enqueueMany([
          job(q, "a"),
          job(q, "b"),
          job(q, "a"),
          job(q, undefined),
          job(q, "a"),
          job(q, "b")
        ])
        const first = yield* grants.claim(claimOf(q, p))
        // a, b, a, (none): the third "a" is over the limit and ends the prefix
        assert.deepStrictEqual(
          jobsOf(first).map((j) => j.metadata["awa:concurrencyKey"] ?? null),
          ["a", "b", "a", null]
        )
        assert.strictEqual(blockedOf(first), "gated", "the claim says it stopped at a key at its limit")
        assert.strictEqual(yield* grants.openGrants(p, "a"), 2)
        assert.strictEqual(yield* grants.openGrants(p, "b"), 1)
        // the head is gated: the cursor stays, the "b" behind it waits (FIFO within the lane)
        assert.strictEqual((yield* grants.claim(claimOf(q, p)))._tag, "KeyGated")
        yield* complete(jobsOf(first).slice(0, 1))
        assert.strictEqual(yield* grants.openGrants(p, "a"), 1)
        const secondClaim = yield* grants.claim(claimOf(q, p))
        const second = jobsOf(secondClaim)
        assert.deepStrictEqual(
          second.map((j) => j.metadata["awa:concurrencyKey"]),
          ["a", "b"]
        )
        assert.strictEqual(blockedOf(secondClaim), undefined, "it took all it found")
        assert.strictEqual((yield* grants.claim(claimOf(q, p)))._tag, "Idle")
      })
  )

  it.effect("a gated top lane does not idle the other lanes", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const grants = yield* KeyGrants
      const q = fresh("kg-lanes")
      const p = fresh("policy")
      yield* grants.create({ id: p, maxInFlight: 1 })
      yield* storage.enqueueMany([job(q, "hot", { priority: 1 }), job(q, "hot", { priority: 1 })])
      const heldClaim = yield* grants.claim(claimOf(q, p, 1))
      const held = jobsOf(heldClaim)
      assert.strictEqual(held.length, 1)
      assert.strictEqual(blockedOf(heldClaim), undefined, "a full window is not blocked")
      yield* storage.enqueueMany([job(q, "cold", { priority: 3 }), job(q, undefined, { priority: 4 })])
      const nextClaim = yield* grants.claim(claimOf(q, p))
      const next = jobsOf(nextClaim)
      assert.deepStrictEqual(
        next.map((j) => j.priority),
        [3, 4]
      )
      // the top lane claimed nothing and the lanes after it did: the call still says why
      assert.strictEqual(blockedOf(nextClaim), "gated")
      assert.strictEqual((yield* grants.claim(claimOf(q, p)))._tag, "KeyGated")
    })
  )

  it.effect("every closure closes the grant; a stale completion cannot close the successor's grant", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const grants = yield* KeyGrants
      const q = fresh("kg-stale")
      const p = fresh("policy")
      yield* grants.create({ id: p, maxInFlight: 1 })
      yield* storage.enqueueMany([job(q, "k")])
      const [first] = jobsOf(yield* grants.claim(claimOf(q, p)))
      // the attempt ends (snooze: runnable again at once) and its grant with it
      yield* storage.finalizeMany([
        { jobId: first!.jobId, runLease: first!.runLease, outcome: { _tag: "Snooze", delayMs: 0 } }
      ])
      assert.strictEqual(yield* grants.openGrants(p, "k"), 0)
      yield* storage.promoteDue(100)
      const [second] = jobsOf(yield* grants.claim(claimOf(q, p)))
      assert.strictEqual(second!.jobId, first!.jobId)
      assert.strictEqual(second!.runLease, first!.runLease + 1n)
      assert.strictEqual(yield* grants.openGrants(p, "k"), 1)
      // the old lease's completion is stale and the successor's grant stays open
      const [stale] = yield* storage.finalizeMany([
        { jobId: first!.jobId, runLease: first!.runLease, outcome: { _tag: "Complete" } }
      ])
      assert.strictEqual(stale!._tag, "Stale")
      assert.strictEqual(yield* grants.openGrants(p, "k"), 1)
      yield* storage.enqueueMany([job(q, "k")])
      assert.strictEqual((yield* grants.claim(claimOf(q, p)))._tag, "KeyGated")
      // a cancel of the running attempt closes it
      yield* storage.cancelJob(second!.jobId, "operator")
      assert.strictEqual(yield* grants.openGrants(p, "k"), 0)
      assert.strictEqual(jobsOf(yield* grants.claim(claimOf(q, p))).length, 1)
    })
  )

  it.effect(
    "lowering refuses while over target, resume activates once within it, cancel restores, stale epochs are rejected",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const grants = yield* KeyGrants
        const q = fresh("kg-lower")
        const p = fresh("policy")
        yield* grants.create({ id: p, maxInFlight: 2 })
        yield* storage.enqueueMany([job(q, "a"), job(q, "a"), job(q, "b")])
        const running = jobsOf(yield* grants.claim(claimOf(q, p, 2)))
        assert.strictEqual(running.length, 2)

        const change = yield* grants.lower(p, 1, { verifyTimeoutMs: 0 })
        assert.strictEqual(change.state, "draining")
        assert.deepStrictEqual(
          { ...(yield* grants.show(p)), epoch: 0n },
          { id: p, maxInFlight: 2, state: "draining", target: 1, epoch: 0n }
        )
        // draining admits no keyed job, not even one whose key is free
        assert.strictEqual((yield* grants.claim(claimOf(q, p)))._tag, "KeyGated")
        assert.strictEqual((yield* grants.resume(p, change.epoch, 1)).state, "draining")
        // a stale epoch, or another target, is rejected
        const stale = yield* Effect.flip(grants.resume(p, change.epoch - 1n, 1))
        assert.strictEqual(stale._tag, "StaleKeyPolicyEpoch")
        const otherTarget = yield* Effect.flip(grants.cancelChange(p, change.epoch, 2))
        assert.strictEqual(otherTarget._tag, "StaleKeyPolicyEpoch")
        // cancel restores the old limit
        const restored = yield* grants.cancelChange(p, change.epoch, 1)
        assert.deepStrictEqual([restored.state, restored.maxInFlight, restored.target], ["active", 2, null])
        assert.isTrue(restored.epoch > change.epoch)
        assert.strictEqual(
          (yield* Effect.flip(grants.resume(p, change.epoch, 1)))._tag,
          "StaleKeyPolicyEpoch"
        )

        // lower again; once a grant closes, resume activates the target
        const again = yield* grants.lower(p, 1, { verifyTimeoutMs: 0 })
        assert.strictEqual(again.state, "draining")
        yield* complete(running.slice(0, 1))
        assert.deepStrictEqual(yield* grants.resume(p, again.epoch, 1), {
          epoch: again.epoch,
          state: "active"
        })
        const now = yield* grants.show(p)
        assert.deepStrictEqual([now.state, now.maxInFlight, now.target], ["active", 1, null])
        // limit 1 with one "a" open: "b" (free) is admitted
        assert.deepStrictEqual(
          jobsOf(yield* grants.claim(claimOf(q, p))).map((j) => j.metadata["awa:concurrencyKey"]),
          ["b"]
        )
        // a lower that finds every key within the target activates at once
        assert.strictEqual((yield* grants.lower(p, 3, { verifyTimeoutMs: 0 })).state, "active")
        assert.strictEqual((yield* grants.show(p)).maxInFlight, 3)
      })
  )

  it.effect("forceDisable lifts the limit; bad input and unknown policies are typed errors", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const grants = yield* KeyGrants
      const q = fresh("kg-off")
      const p = fresh("policy")
      yield* grants.create({ id: p, maxInFlight: 1 })
      // the same create again is a no-op; another limit is refused
      assert.strictEqual((yield* grants.create({ id: p, maxInFlight: 1 })).maxInFlight, 1)
      assert.strictEqual(
        (yield* Effect.flip(grants.create({ id: p, maxInFlight: 5 })))._tag,
        "ValidationError"
      )
      assert.strictEqual(
        (yield* Effect.flip(grants.create({ id: fresh("p"), maxInFlight: 0 })))._tag,
        "ValidationError"
      )
      assert.strictEqual(
        (yield* Effect.flip(grants.create({ id: "", maxInFlight: 1 })))._tag,
        "ValidationError"
      )
      assert.strictEqual((yield* Effect.flip(grants.show(fresh("nope"))))._tag, "KeyPolicyNotFound")
      yield* storage.enqueueMany([job(q, "x")])
      assert.strictEqual(
        (yield* Effect.flip(grants.claim(claimOf(q, fresh("nope")))))._tag,
        "KeyPolicyNotFound"
      )
      const tooLong = yield* Effect.flip(storage.enqueueMany([job(q, "é".repeat(513))]))
      assert.strictEqual(tooLong._tag, "ValidationError")
      const atClaim = yield* Effect.flip(
        storage.enqueueMany([job(q, "x", { unique: { states: ["running"] } })])
      )
      assert.strictEqual(atClaim._tag, "ValidationError")

      yield* storage.enqueueMany([job(q, "x"), job(q, "x")])
      assert.strictEqual(jobsOf(yield* grants.claim(claimOf(q, p))).length, 1)
      const off = yield* grants.forceDisable(p)
      assert.strictEqual(off.state, "disabled")
      assert.strictEqual(jobsOf(yield* grants.claim(claimOf(q, p))).length, 2)
      assert.strictEqual(yield* grants.openGrants(p, "x"), 3)
      const stats = (yield* grants.stats).find((s) => s.policy === p)
      assert.deepStrictEqual([stats?.state, stats?.openGrants], ["disabled", 3])
      assert.isNotNull(stats?.oldestOpenGrantAt)
    })
  )
}
