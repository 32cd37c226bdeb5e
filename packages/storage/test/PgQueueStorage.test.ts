import { TestDatabase } from "@awa/testing"
import { describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { suite } from "./contract/QueueStorageContract.ts"

const StorageLive = pgLayer().pipe(Layer.provideMerge(TestDatabase.layer()))

describe("PgQueueStorage", () => {
  layer(StorageLive, { excludeTestServices: true, timeout: "60 seconds" })("contract", (it) => {
    // windows of 1-2 s where the contract's are 50-100 ms: see ContractOptions.scale
    suite(it, { advance: (ms) => Effect.sleep(ms), scale: 20 })
  })
})
