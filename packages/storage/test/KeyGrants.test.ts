import { TestDatabase } from "@awa/testing"
import { describe, layer } from "@effect/vitest"
import { Layer } from "effect"
import { layer as pgGrants } from "../src/PgKeyGrants.ts"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import * as SimKeyGrants from "../src/SimKeyGrants.ts"
import * as SimQueueStorage from "../src/SimQueueStorage.ts"
import { suite } from "./contract/KeyGrantsContract.ts"

describe("KeyGrants", () => {
  layer(Layer.mergeAll(pgLayer(), pgGrants()).pipe(Layer.provideMerge(TestDatabase.layer())), {
    excludeTestServices: true,
    timeout: "60 seconds"
  })("PgKeyGrants", (it) => suite(it))
  layer(SimKeyGrants.layer.pipe(Layer.provideMerge(SimQueueStorage.layer)))("SimKeyGrants", (it) => suite(it))
})
