/**
 * finalize's statement for a batch of completions only (migration 0038; since 0049
 * finalize_completions, items as arrays, which the storage layer calls for such a batch) writes
 * what the general statement writes for a completion: the attempt's attempt_state row goes, a mask
 * without 'running' but with 'completed' takes its key back when free, a stale item is not applied,
 * and a mixed batch still takes the general statement. finalize(jsonb) hands a batch of
 * completions to it (a rescue's stale_before included); arrays of different lengths are refused.
 * Since 0054 both statements read the ready rows and closures in the slots of the claims they
 * locked: a batch whose claims lie in different slots, one carried by prune, still closes each
 * attempt once.
 */
import { UniqueConflict } from "@awa/core"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh, keepAll, withEagerDatabase } from "./pgFixtures.ts"

const complete = (c: { jobId: bigint; runLease: bigint }) => ({
  jobId: c.jobId,
  runLease: c.runLease,
  outcome: { _tag: "Complete" as const }
})

/** Jobs of `queue` sharing one key whose mask is `available | completed`: released at claim, taken back at completion. */
const releasedAtClaim = (queue: string) => (n: number) => ({
  kind: "k",
  queue,
  args: { key: "same", n },
  unique: { byArgs: false, byQueue: true, states: ["available" as const, "completed" as const] }
})

/** Enqueuing `job` is refused: its key is held by `holder`. */
const refusedAsDuplicateOf = (job: ReturnType<ReturnType<typeof releasedAtClaim>>, holder: bigint) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const dup = yield* Effect.flip(storage.enqueueMany([job]))
    assert.instanceOf(dup, UniqueConflict)
    assert.strictEqual((dup as UniqueConflict).existingJobId, holder)
  })

describe("finalize: a batch of completions", () => {
  it.live("deletes the attempt_state rows of heartbeating attempts and answers stale items as stale", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("fin-complete")
        yield* storage.enqueueMany(
          Array.from({ length: 4 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
        )
        const claimed = yield* storage.claim(claimOf(q, 4))
        yield* storage.heartbeatMany(
          claimed.slice(0, 2).map((c) => ({ jobId: c.jobId, runLease: c.runLease }))
        )
        const ids = claimed.map((c) => c.jobId)
        const states = () =>
          sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.attempt_state WHERE job_id = ANY (${ids})`
        assert.strictEqual((yield* states())[0]!.n, 2)
        // the last item names a lease the attempt does not have: stale, nothing written for it
        const items = [...claimed.slice(0, 3).map(complete), complete({ ...claimed[3]!, runLease: 99n })]
        const results = yield* storage.finalizeMany(items)
        assert.deepStrictEqual(
          results.map((r) => (r._tag === "Applied" ? r.state : r._tag)),
          ["completed", "completed", "completed", "Stale"]
        )
        assert.strictEqual((yield* states())[0]!.n, 0)
        // the same completions again: closed already, stale
        const again = yield* storage.finalizeMany(claimed.slice(0, 3).map(complete))
        assert.deepStrictEqual(
          again.map((r) => r._tag),
          ["Stale", "Stale", "Stale"]
        )
      })
    )
  )

  it.live("a mask with 'completed' but not 'running' takes the key back at completion when it is free", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("fin-mask")
        const job = releasedAtClaim(q)
        const [a] = yield* storage.enqueueMany([job(1)])
        // claimed: 'running' is not in the mask, the key is released
        const [ca] = yield* storage.claim(claimOf(q, 1))
        assert.strictEqual(ca!.jobId, a!.id)
        const [done] = yield* storage.finalizeMany([complete(ca!)])
        assert.deepStrictEqual(done, { _tag: "Applied", state: "completed" })
        // completed is in the mask: the key is the completed job's again, a duplicate is refused
        yield* refusedAsDuplicateOf(job(2), a!.id)
      })
    )
  )

  it.live("a batch mixing a completion and a retry is applied whole by the general statement", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("fin-mixed")
        yield* storage.enqueueMany([0, 1].map((n) => ({ kind: "k", queue: q, args: { n } })))
        const [c0, c1] = yield* storage.claim(claimOf(q, 2))
        const results = yield* storage.finalizeMany([
          complete(c0!),
          { jobId: c1!.jobId, runLease: c1!.runLease, outcome: { _tag: "Retry", error: "boom", delayMs: 0 } }
        ])
        assert.deepStrictEqual(
          results.map((r) => (r._tag === "Applied" ? r.state : r._tag)),
          ["completed", "retryable"]
        )
      })
    )
  )

  it.live("finalize(jsonb) hands completions over with their stale_before: a heartbeat since wins", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("fin-json")
        yield* storage.enqueueMany([0, 1].map((n) => ({ kind: "k", queue: q, args: { n } })))
        const [c0, c1] = yield* storage.claim(claimOf(q, 2))
        const before = (yield* sql<{ t: Date }>`SELECT now() - interval '1 minute' AS t`)[0]!.t
        // c0 heartbeats after the rescue's cut-off (stale_before): its rescue must yield
        yield* storage.heartbeatMany([{ jobId: c0!.jobId, runLease: c0!.runLease }])
        const items = JSON.stringify([
          {
            job_id: String(c0!.jobId),
            run_lease: String(c0!.runLease),
            outcome: "complete",
            stale_before: before
          },
          { job_id: String(c1!.jobId), run_lease: String(c1!.runLease), outcome: "complete" }
        ])
        const rows = yield* sql<{ ord: number; applied: boolean; state: string | null }>`
          SELECT * FROM awa.finalize(${items}::jsonb)`
        assert.deepStrictEqual(
          rows.map((r) => [r.ord, r.applied, r.state]),
          [
            [1, false, null],
            [2, true, "completed"]
          ]
        )
      })
    )
  )

  /**
   * a: claimed in the first slot, then carried by prune into the current one; b, c: claimed in a
   * slot of their own, after a; the batch holds them out of slot order. `aFails`: a's outcome is a
   * failure, so the batch takes the general statement (finalize) instead of finalize_completions.
   */
  const acrossSlots = (aFails: boolean) =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("fin-slots")
        yield* storage.enqueueMany([{ kind: "k", queue: q, args: { n: 0 } }])
        const [a] = yield* storage.claim(claimOf(q, 1))
        yield* storage.rotate
        yield* storage.enqueueMany([1, 2].map((n) => ({ kind: "k", queue: q, args: { n } })))
        const [b, c] = yield* storage.claim(claimOf(q, 2))
        yield* storage.rotate
        assert.strictEqual((yield* storage.prune({ ...keepAll, carryAfterMs: 0 }))._tag, "Pruned")
        const ids = [a!.jobId, b!.jobId, c!.jobId]
        const slots = yield* sql<{ slot: number }>`
          SELECT slot FROM awa.claims WHERE job_id = ANY (${ids}) ORDER BY job_id`
        assert.strictEqual(new Set(slots.map((r) => r.slot)).size, 2, "two slots")
        assert.notStrictEqual(slots[0]!.slot, slots[1]!.slot, "a carried away from b's slot")
        const batch = [
          complete(c!),
          aFails
            ? { jobId: a!.jobId, runLease: a!.runLease, outcome: { _tag: "Fail" as const, error: "no" } }
            : complete(a!),
          complete(b!)
        ]
        const first = yield* storage.finalizeMany(batch)
        assert.deepStrictEqual(
          first.map((r) => (r._tag === "Applied" ? r.state : r._tag)),
          ["completed", aFails ? "failed" : "completed", "completed"]
        )
        // closed now, wherever their claims lie: stale, nothing written twice
        const again = yield* storage.finalizeMany(batch)
        assert.deepStrictEqual(
          again.map((r) => r._tag),
          ["Stale", "Stale", "Stale"]
        )
        // 0057: a batch of completions writes no terminal row (the closure is the completed
        // attempt's terminal record); the general statement still writes one beside each closure.
        // Either way terminal_records holds each attempt once.
        const rows = yield* sql<{ closures: number; terminal: number; records: number }>`
          SELECT (SELECT count(*)::int FROM awa.closures WHERE job_id = ANY (${ids})) AS closures,
                 (SELECT count(*)::int FROM awa.terminal WHERE job_id = ANY (${ids})) AS terminal,
                 (SELECT count(*)::int FROM awa.terminal_records WHERE job_id = ANY (${ids})) AS records`
        assert.deepStrictEqual(rows[0], { closures: 3, terminal: aFails ? 3 : 0, records: 3 })
        assert.strictEqual((yield* storage.getJob(a!.jobId)).state, aFails ? "failed" : "completed")
      })
    )

  it.live(
    "a batch whose claims lie in different slots, one carried by prune, completes each attempt once",
    () => acrossSlots(false)
  )

  it.live("a mixed batch across slots (the general statement) closes each attempt once", () =>
    acrossSlots(true)
  )

  it.live(
    "finalize_completions refuses arrays of different lengths and writes nothing; an empty batch answers nothing",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("fin-arrays")
          yield* storage.enqueueMany([0, 1].map((n) => ({ kind: "k", queue: q, args: { n } })))
          const [c0, c1] = yield* storage.claim(claimOf(q, 2))
          const ids = `{${c0!.jobId},${c1!.jobId}}`
          const refused = yield* Effect.exit(
            sql`SELECT * FROM awa.finalize_completions(${ids}::bigint[], ${`{${c0!.runLease}}`}::bigint[])`
          )
          assert.isTrue(Exit.isFailure(refused))
          assert.include(String(Exit.isFailure(refused) ? refused.cause : ""), "one run lease")
          const closures = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM awa.closures WHERE job_id IN (${c0!.jobId}, ${c1!.jobId})`
          assert.strictEqual(closures[0]!.n, 0)
          const none = yield* sql`SELECT * FROM awa.finalize_completions('{}'::bigint[], '{}'::bigint[])`
          assert.strictEqual(none.length, 0)
          // the two attempts are still open: completed now, through the storage layer
          const results = yield* storage.finalizeMany([complete(c0!), complete(c1!)])
          assert.deepStrictEqual(
            results.map((r) => r._tag),
            ["Applied", "Applied"]
          )
        })
      )
  )

  /**
   * Since 0055 a claims row written by claim or claim_keyed says whether its job has no unique key
   * (without_unique_key), and finalize_completions reads the ready rows of the others only. A
   * claim that says nothing (written before 0055, or carried by prune) reads its ready row as
   * before. What would break: a flag missing from a writer costs the read again (the first test);
   * a claim without the flag read as "no key" would leave a carried attempt's key where it was at
   * completion (the second: the duplicate would be accepted).
   */
  it.live("claim and claim_keyed write whether the job has no unique key; completions apply either way", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("fin-flag")
        const kq = fresh("fin-flag-keyed")
        const policy = fresh("fin-flag-policy")
        yield* storage.enqueueMany([
          { kind: "k", queue: q, args: { n: 0 } },
          {
            kind: "k",
            queue: q,
            args: { n: 1 },
            unique: { byArgs: true, byQueue: true, states: ["available" as const] }
          }
        ])
        yield* sql`INSERT INTO awa.key_policies (id, max_in_flight) VALUES (${policy}, 2)`
        yield* sql`SELECT awa.enqueue_one('k', ${kq}, 2, '{}'::jsonb, ${JSON.stringify({ "awa:concurrencyKey": "t" })}::jsonb,
                                          '[]'::jsonb, 25, now(), NULL, 0)`
        const claimed = yield* storage.claim(claimOf(q, 2))
        const keyed = yield* sql<{ job_id: bigint; run_lease: bigint }>`
          SELECT job_id, run_lease FROM awa.claim_keyed(${kq}, ${policy}, 1, 0, 0)`
        assert.strictEqual(claimed.length, 2)
        assert.strictEqual(keyed.length, 1)
        const flags = yield* sql<{ n: number; flag: boolean | null }>`
          SELECT coalesce((r.args ->> 'n')::int, -1) AS n, c.without_unique_key AS flag
          FROM awa.claims c JOIN awa.ready r ON r.job_id = c.job_id AND r.slot = c.slot
          WHERE c.queue IN (${q}, ${kq}) ORDER BY n`
        assert.deepStrictEqual(
          flags.map((f) => [f.n, f.flag]),
          [
            [-1, true], // claim_keyed's job: no unique key
            [0, true],
            [1, false]
          ]
        )
        const results = yield* storage.finalizeMany([
          ...claimed.map(complete),
          complete({ jobId: keyed[0]!.job_id, runLease: keyed[0]!.run_lease })
        ])
        assert.deepStrictEqual(
          results.map((r) => (r._tag === "Applied" ? r.state : r._tag)),
          ["completed", "completed", "completed"]
        )
      })
    )
  )

  it.live(
    "a unique-keyed attempt carried by prune (its claim says nothing) takes its key back at completion",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("fin-carried-key")
          const job = releasedAtClaim(q)
          const [a] = yield* storage.enqueueMany([job(1)])
          const [ca] = yield* storage.claim(claimOf(q, 1))
          yield* storage.rotate
          assert.strictEqual((yield* storage.prune({ ...keepAll, carryAfterMs: 0 }))._tag, "Pruned")
          const carried = yield* sql<{ flag: boolean | null }>`
          SELECT without_unique_key AS flag FROM awa.claims WHERE job_id = ${a!.id}`
          assert.deepStrictEqual(carried, [{ flag: null }], "carried, without the flag")
          const [done] = yield* storage.finalizeMany([complete(ca!)])
          assert.deepStrictEqual(done, { _tag: "Applied", state: "completed" })
          yield* refusedAsDuplicateOf(job(2), a!.id)
        })
      )
  )
})
