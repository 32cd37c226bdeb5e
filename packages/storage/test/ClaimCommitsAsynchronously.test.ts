/**
 * Migration 0062: claim and claim_keyed commit asynchronously (synchronous_commit off for their own
 * transaction), unless the transaction wrote before them; the claim answers as before
 * (docs/adr/0042-claims-commit-asynchronously.md).
 *
 * What would break: a claim that waits for its WAL flush (on a slow volume a millisecond more on
 * every pickup), a caller's own earlier writes made asynchronous by a claim in their transaction,
 * or a setting that outlives the claim's transaction (a completion on the same connection
 * acknowledged before it is on disk). The transaction under test sets the server's default
 * (`on`) itself: the test server runs with `synchronous_commit = off`. The first two tests were
 * seen to fail on 0061's functions (`on` after the claim), the third with the guard removed.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { KeyGrants } from "../src/KeyGrants.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { fresh, withGrantsDatabase } from "./pgFixtures.ts"

/**
 * `synchronous_commit` after `claim` in a transaction that set it `on` and ran `before` first, with
 * what the claim answered.
 */
const settingAfter = <A>(
  claim: (sql: SqlClient.SqlClient) => Effect.Effect<A, unknown>,
  before: ReadonlyArray<string> = []
) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    return yield* sql.withTransaction(
      Effect.gen(function* () {
        yield* sql`SET LOCAL synchronous_commit = on`
        for (const statement of before) yield* sql.unsafe(statement)
        const answer = yield* claim(sql)
        const [row] = yield* sql<{ setting: string }>`SELECT current_setting('synchronous_commit') AS setting`
        return { setting: row!.setting, answer }
      })
    )
  })

describe("claims commit asynchronously (0062)", () => {
  it.live("claim turns synchronous_commit off for its transaction, and only for it", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const queue = fresh("async")
        yield* storage.enqueueMany([{ kind: "k", queue, args: { n: 1 } }])
        const { setting, answer } = yield* settingAfter(
          (sql) => sql`SELECT job_id FROM awa.claim(${queue}, 10, 0::bigint, 0::bigint)`
        )
        assert.strictEqual(setting, "off")
        assert.strictEqual(answer.length, 1, "the claim answers as before")
        // an empty claim too (it writes nothing: nothing to flush either way)
        assert.strictEqual(
          (yield* settingAfter((sql) => sql`SELECT * FROM awa.claim(${queue}, 10, 0::bigint, 0::bigint)`))
            .setting,
          "off"
        )
        // on one connection whose session says `on`: the claim's transaction off, the next one on
        const seen = yield* Effect.scoped(
          Effect.gen(function* () {
            const connection = yield* sql.reserve
            const run = (statement: string) => connection.executeUnprepared(statement, [], undefined)
            const setting = () =>
              Effect.map(
                run("SELECT current_setting('synchronous_commit') AS setting"),
                (rows) => (rows[0] as { setting: string }).setting
              )
            yield* run("SET synchronous_commit = on")
            yield* run("BEGIN")
            yield* run(`SELECT * FROM awa.claim('${queue}', 10, 0::bigint, 0::bigint)`)
            const inside = yield* setting()
            yield* run("COMMIT")
            return [inside, yield* setting()]
          })
        )
        assert.deepStrictEqual(seen, ["off", "on"])
      })
    )
  )

  it.live("claim_keyed and claim_rated commit asynchronously too", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const grants = yield* KeyGrants
        const queue = fresh("async-keyed")
        const policy = `${queue}-policy`
        yield* grants.create({ id: policy, maxInFlight: 10 })
        yield* storage.enqueueMany([
          { kind: "k", queue, args: { n: 0 }, concurrencyKey: "a" },
          { kind: "k", queue, args: { n: 1 } }
        ])
        assert.strictEqual(
          (yield* settingAfter(
            (sql) => sql`SELECT * FROM awa.claim_keyed(${queue}, ${policy}, 1, 0::bigint, 0::bigint)`
          )).setting,
          "off"
        )
        assert.strictEqual(
          (yield* settingAfter(
            (sql) => sql`SELECT * FROM awa.claim_rated(${queue}, 1, 0::bigint, 0::bigint, 100::float8, 10)`
          )).setting,
          "off"
        )
      })
    )
  )

  it.live("a transaction that wrote before the claim keeps its durability", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const queue = fresh("async-caller")
        yield* storage.enqueueMany([{ kind: "k", queue, args: { n: 1 } }])
        const { setting } = yield* settingAfter(
          (sql) => sql`SELECT * FROM awa.claim(${queue}, 10, 0::bigint, 0::bigint)`,
          ["CREATE TEMP TABLE caller_wrote (x int) ON COMMIT DROP", "INSERT INTO caller_wrote VALUES (1)"]
        )
        assert.strictEqual(setting, "on")
      })
    )
  )
})
