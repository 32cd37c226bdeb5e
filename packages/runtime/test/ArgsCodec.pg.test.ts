/**
 * Args are stored in the JSON form of their Schema (core `argsCodec`, `Schema.toCodecJson`):
 * insert encodes with it, the worker decodes with it, so every Schema round-trips through
 * Postgres, also those whose plain encoded form is not JSON (a Date, a bigint, an Option, a Map,
 * a class, a transformation).
 */
import { Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Layer, Option, Redacted, Schema, SchemaTransformation, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"

class Customer extends Schema.Class<Customer>("Customer")({ name: Schema.String, since: Schema.Date }) {
  get greeting() {
    return `hello ${this.name}`
  }
}

const CentsFromDollars = Schema.Number.pipe(
  Schema.decodeTo(
    Schema.Number,
    SchemaTransformation.transform({ decode: (dollars) => dollars * 100, encode: (cents) => cents / 100 })
  )
)

const Args = Schema.Struct({
  at: Schema.Date,
  amount: Schema.BigInt,
  note: Schema.Option(Schema.String),
  missing: Schema.Option(Schema.Number),
  counts: Schema.ReadonlyMap(Schema.String, Schema.Number),
  customer: Customer,
  cents: CentsFromDollars,
  parsed: Schema.NumberFromString,
  nickname: Schema.optional(Schema.String)
})

const Rich = Job.define({ kind: "rich_args", args: Args, queue: "codec" })

describe("args round-trip through Postgres in their JSON form", () => {
  it.live(
    "Date, BigInt, Option, Map, a class and transformations reach the handler as inserted",
    () =>
      Effect.flatMap(TestDatabase.acquire(), ({ url }) => {
        const awa = Awa.layerPg().pipe(
          Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 4 }))
        )
        return Effect.gen(function* () {
          const received = yield* Deferred.make<typeof Args.Type>()
          // closed by the test's scope too, so a failing test does not leave the worker running
          const scope = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void))
          yield* Layer.buildWithScope(
            Awa.worker({
              queues: { codec: { pollInterval: "50 millis" } },
              handlers: [handler(Rich, (args) => Effect.asVoid(Deferred.succeed(received, args)))],
              maintenance: false
            }),
            scope
          )
          const client = yield* AwaClient
          const sent: typeof Args.Type = {
            at: new Date("2030-01-02T03:04:05.678Z"),
            amount: 12_345_678_901_234_567_890n,
            note: Option.some("rush"),
            missing: Option.none(),
            counts: new Map([
              ["a", 1],
              ["b", 2]
            ]),
            customer: new Customer({ name: "Ada", since: new Date("2020-05-06T00:00:00.000Z") }),
            cents: 250,
            parsed: 42,
            nickname: undefined
          }
          const job = yield* client.insert(Rich, sent)
          const got = yield* Deferred.await(received)
          assert.strictEqual(got.at.toISOString(), "2030-01-02T03:04:05.678Z")
          assert.strictEqual(got.amount, 12_345_678_901_234_567_890n)
          assert.deepStrictEqual(got.note, Option.some("rush"))
          assert.isTrue(Option.isNone(got.missing))
          assert.deepStrictEqual(
            [...got.counts],
            [
              ["a", 1],
              ["b", 2]
            ]
          )
          assert.instanceOf(got.customer, Customer)
          assert.strictEqual(got.customer.greeting, "hello Ada")
          assert.strictEqual(got.customer.since.toISOString(), "2020-05-06T00:00:00.000Z")
          assert.strictEqual(got.cents, 250)
          assert.strictEqual(got.parsed, 42)
          assert.strictEqual(got.nickname, undefined)
          // what is stored is plain JSON, the transformations' encoded side
          const stored = (yield* client.storage.getJob(job.id)).args as Record<string, unknown>
          assert.deepStrictEqual(
            [stored.at, stored.amount, stored.cents, stored.parsed],
            ["2030-01-02T03:04:05.678Z", "12345678901234567890", 2.5, "42"]
          )
          yield* Scope.close(scope, Exit.void)
        }).pipe(Effect.provide(awa))
      }),
    60_000
  )

  it.effect("args of a plain JSON Schema are stored exactly as Schema.encode gives them", () =>
    Effect.gen(function* () {
      const Plain = Schema.Struct({ n: Schema.Number, s: Schema.String, tags: Schema.Array(Schema.String) })
      const value = { n: 1, s: "x", tags: ["a"] }
      const viaCodec = yield* Schema.encodeEffect(Job.argsCodec(Plain))(value)
      assert.deepStrictEqual(viaCodec, yield* Schema.encodeEffect(Plain)(value))
    })
  )
})
