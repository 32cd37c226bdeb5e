/**
 * Callbacks on Postgres (migration 0034): the shared callback contract. Callback timeouts are
 * moved by backdating `attempt_state.callback_timeout_at` (a plain table), not by sleeping.
 */
import { TestDatabase } from "@awa/testing"
import { describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { layer as callbackLayer } from "../src/PgCallbackStorage.ts"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { callbackSuite } from "./contract/CallbackStorageContract.ts"

const StorageLive = Layer.mergeAll(pgLayer(), callbackLayer()).pipe(Layer.provideMerge(TestDatabase.layer()))

const ageCallbacks = (ms: number) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`UPDATE awa.attempt_state SET callback_timeout_at = callback_timeout_at - ${ms} * interval '1 millisecond'
               WHERE callback_state = 'pending'`
  }).pipe(Effect.orDie)

describe("PgCallbackStorage", () => {
  layer(StorageLive, { excludeTestServices: true, timeout: "60 seconds" })("callback contract", (it) => {
    callbackSuite(it, {
      ageCallbacks,
      advance: (ms) => Effect.sleep(ms)
    })
  })
})
