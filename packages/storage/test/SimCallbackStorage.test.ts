import { describe, layer } from "@effect/vitest"
import { TestClock } from "effect/testing"
import * as SimQueueStorage from "../src/SimQueueStorage.ts"
import { callbackSuite } from "./contract/CallbackStorageContract.ts"

describe("SimCallbackStorage", () => {
  layer(SimQueueStorage.layer)("callback contract", (it) => {
    callbackSuite(it, { ageCallbacks: (ms) => TestClock.adjust(ms), advance: (ms) => TestClock.adjust(ms) })
  })
})
