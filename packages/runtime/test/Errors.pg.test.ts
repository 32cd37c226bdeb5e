/**
 * Errors that point somewhere: `SchemaNotMigrated` names a remedy that exists (and following it
 * works), and a bad `DATABASE_URL` names its real cause on the first line of the message.
 */
import { SchemaNotMigrated } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { SqlError } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { createClient } from "../src/PromiseClient.ts"

const firstLine = (message: string) => message.split("\n")[0]!

/** Builds Awa on `url` and returns the failure. */
const failureOn = (url: string) =>
  Effect.flip(
    Effect.scoped(
      Layer.build(Awa.layerPg().pipe(Layer.provideMerge(Awa.pgClient({ url: Redacted.make(url) }))))
    )
  )

describe("errors that point somewhere", () => {
  it.live("SchemaNotMigrated recommends Awa.migrate(), and running it is enough", () =>
    Effect.flatMap(TestDatabase.acquire({ migrated: false }), ({ url }) =>
      Effect.gen(function* () {
        const error = yield* failureOn(url)
        assert.instanceOf(error, SchemaNotMigrated)
        assert.notInclude(error.message, "awa migrate", "no such command ships")
        assert.include(error.message, "Awa.migrate()")
        assert.include(error.message, "migrateOnStart: true")
        // the advice works: migrate, then the same layer builds and inserts
        yield* Awa.migrate().pipe(Effect.provide(Awa.pgClient({ url: Redacted.make(url) })))
        yield* Effect.scoped(
          Effect.flatMap(
            Layer.build(Awa.layerPg().pipe(Layer.provideMerge(Awa.pgClient({ url: Redacted.make(url) })))),
            () => Effect.void
          )
        )
      })
    )
  )

  it.live("a refused connection says ECONNREFUSED on the first line", () =>
    Effect.gen(function* () {
      const error = yield* failureOn("postgres://awa@127.0.0.1:1/awa")
      assert.isTrue(SqlError.isSqlError(error))
      assert.match(firstLine(error.message), /ECONNREFUSED 127\.0\.0\.1:1/)
    })
  )

  it.live("a database that does not exist says so on the first line, also through the Promise facade", () =>
    Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
      Effect.gen(function* () {
        const wrong = new URL(url)
        wrong.pathname = "/awa_no_such_database"
        const error = yield* failureOn(wrong.toString())
        assert.isTrue(SqlError.isSqlError(error))
        assert.include(firstLine(error.message), 'database "awa_no_such_database" does not exist')
        const rejected = yield* Effect.promise(() =>
          createClient({ databaseUrl: wrong.toString() }).then(
            async (client) => {
              await client.close()
              return undefined
            },
            (e: unknown) => e
          )
        )
        assert.include(
          firstLine((rejected as Error).message),
          'database "awa_no_such_database" does not exist'
        )
      })
    )
  )
})
