/**
 * The keyed claim's count of open grants slot by slot (migration 0059): `key_grants_in_slot` has one
 * branch per slot of the queue ring, each naming its slot's `claims_<n>` and `closures_<n>`, and
 * `claim_keyed` sums it over the slots its ranges hold. A branch that read another slot's claims
 * would miss an open grant there (a second grant of the key admitted over the limit); one that read
 * another slot's closures would keep a closed grant open (the key gated for good). So the ring is
 * walked through all sixteen slots with a limit of 1, and in each: a grant taken there must gate
 * the key, its closure there must free it, and the grant left open must still gate the key from
 * the next slot. Once with windows of one row (0056's one-row statement) and once with windows of
 * two (the general path's count per key).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { type KeyedClaim, KeyGrants } from "../src/KeyGrants.ts"
import { type ClaimedJob, QueueStorage } from "../src/QueueStorage.ts"
import { completeAll, fresh, withGrantsDatabase } from "./pgFixtures.ts"

const ringSlots = 16

const claimOf = (queue: string, policy: string) => ({
  queue,
  policy,
  max: 10,
  deadlineMs: 0,
  agingIntervalMs: 0
})
const jobsOf = (c: KeyedClaim): ReadonlyArray<ClaimedJob> => (c._tag === "Claimed" ? c.jobs : [])

/** `rows` jobs of key "k" in `queue`: the claim's window holds that many. */
const enqueueKeyed = (queue: string, rows: number) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.enqueueMany(
      Array.from({ length: rows }, (_, i) => ({ kind: "k", queue, args: { i }, concurrencyKey: "k" }))
    )
  )

const currentSlot = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{
      slot: number
    }>`SELECT slot FROM awa.ring_rotations WHERE ring = 'queue' ORDER BY generation DESC LIMIT 1`,
    (rows) => rows[0]!.slot
  )
)

const walkTheRing = (windowRows: number) =>
  withGrantsDatabase(
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const grants = yield* KeyGrants
      const sql = yield* SqlClient.SqlClient
      const p = fresh("policy")
      yield* grants.create({ id: p, maxInFlight: 1 })
      const visited: Array<number> = []
      // the grant left open by the previous slot's round, in that slot
      let open: ReadonlyArray<ClaimedJob> = []
      for (let round = 0; round < ringSlots; round++) {
        const slot = yield* currentSlot
        visited.push(slot)
        const first = fresh(`first-${slot}`)
        const second = fresh(`second-${slot}`)
        yield* enqueueKeyed(first, windowRows)
        if (open.length > 0) {
          // the previous slot's grant, still open, gates the key from this slot
          assert.strictEqual(
            (yield* grants.claim(claimOf(first, p)))._tag,
            "KeyGated",
            `slot ${slot}: open grant of the slot before`
          )
          yield* completeAll(open)
        }
        const taken = jobsOf(yield* grants.claim(claimOf(first, p)))
        assert.strictEqual(taken.length, 1, `slot ${slot}: the key is free`)
        const [grant] = yield* sql<{ slot: number }>`
          SELECT slot FROM awa.claims WHERE job_id = ${taken[0]!.jobId} AND run_lease = ${taken[0]!.runLease}`
        assert.strictEqual(grant!.slot, slot, "the grant is in the current slot")
        // this slot's grant gates the key for another queue under the policy
        yield* enqueueKeyed(second, windowRows)
        assert.strictEqual(
          (yield* grants.claim(claimOf(second, p)))._tag,
          "KeyGated",
          `slot ${slot}: its own open grant`
        )
        // its closure, in this slot, frees it
        yield* completeAll(taken)
        open = jobsOf(yield* grants.claim(claimOf(second, p)))
        assert.strictEqual(open.length, 1, `slot ${slot}: the grant's closure`)
        if (round < ringSlots - 1)
          assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 }), "Rotated")
      }
      assert.deepStrictEqual(
        [...visited].sort((a, b) => a - b),
        Array.from({ length: ringSlots }, (_, i) => i)
      )
    })
  )

describe("the keyed count, slot by slot (0059)", () => {
  it.live("every slot's grants and closures are counted: windows of one row", () => walkTheRing(1))
  it.live("every slot's grants and closures are counted: windows of two rows", () => walkTheRing(2))
})
