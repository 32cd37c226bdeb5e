import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { imported, resumeFromCheckpoint } from "../docs/examples/progress.ts"

describe("docs examples", () => {
  it.effect("progress: a failed import resumes from its checkpoint", () =>
    Effect.map(resumeFromCheckpoint, (job) => {
      assert.deepStrictEqual([job.state, job.attempt], ["completed", 2])
      assert.deepStrictEqual(imported, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    })
  )
})
