/**
 * Progress and checkpoints: an import that fails halfway resumes from its checkpoint on the next
 * attempt. Used by docs/guide.md and run by test/docs-examples.progress.test.ts (inside
 * `it.effect`, which provides `TestClock`).
 */
import { Job } from "@awa/core"
import { Awa, AwaClient, Handler } from "@awa/runtime"
import { Effect, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"

const ImportFile = Job.define({
  kind: "import_file",
  args: Schema.Struct({ path: Schema.String, rows: Schema.Number }),
  queue: "imports",
  backoff: () => "1 second"
})

/** Rows imported, in order, across attempts. */
export const imported: Array<number> = []

const importFile = Handler.handler(ImportFile, ({ rows }, ctx) =>
  Effect.gen(function* () {
    // the checkpoint the previous attempt left (null on the first attempt)
    const start = (ctx.job.progress?.metadata?.nextRow as number | undefined) ?? 0
    for (let row = start; row < rows; row++) {
      // the first attempt fails at row 6: the checkpoint below says where to pick up
      if (ctx.job.attempt === 1 && row === 6)
        return yield* Effect.fail(new Job.JobRetryableError({ message: "connection reset" }))
      imported.push(row)
      yield* ctx.setProgress((100 * (row + 1)) / rows, `row ${row + 1} of ${rows}`)
      yield* ctx.updateMetadata({ nextRow: row + 1 })
    }
  })
)

/** The import fails once at row 6 and resumes there: every row is imported exactly once. */
export const resumeFromCheckpoint = Effect.gen(function* () {
  const awa = yield* AwaClient.AwaClient
  const job = yield* awa.insert(ImportFile, { path: "users.csv", rows: 10 })
  for (let t = 0; t < 3000; t += 100) {
    yield* TestClock.adjust("100 millis")
    yield* Effect.yieldNow
  }
  return yield* awa.storage.getJob(job.id)
}).pipe(
  Effect.provide(
    Awa.worker({ queues: { imports: { pollInterval: "100 millis" } }, handlers: [importFile] }).pipe(
      Layer.provideMerge(Awa.layerSim())
    )
  )
)
