import { describe, layer } from "@effect/vitest"
import { TestClock } from "effect/testing"
import * as SimQueueStorage from "../src/SimQueueStorage.ts"
import { masksSuite } from "./contract/UniqueMasksContract.ts"

describe("SimQueueStorage unique masks", () => {
  layer(SimQueueStorage.layer)("mask contract", (it) => {
    masksSuite(it, { advance: (ms) => TestClock.adjust(ms) })
  })
})
