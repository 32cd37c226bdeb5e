/**
 * Quick start without Effect: the Promise facade. Used by docs/guide.md and run by
 * test/docs-examples.test.ts.
 */
import { Job, PromiseClient } from "@awa/effect"
import { Schema } from "effect"

export const main = async (databaseUrl: string) => {
  const awa = await PromiseClient.createClient({ databaseUrl, migrateOnStart: true })
  try {
    const Resize = awa.define({
      kind: "resize_image",
      args: Schema.Struct({ path: Schema.String, width: Schema.Number }),
      queue: "media"
    })
    const done: Array<string> = []
    const worker = await awa.start({
      queues: { media: { maxConcurrency: 4 } },
      handlers: [
        awa.handler(Resize, async ({ path, width }, { signal }) => {
          if (signal.aborted) return Job.JobResult.cancel("stopped before start")
          done.push(`${path}@${width}`)
        })
      ]
    })
    const job = await awa.insert(Resize, { path: "cat.png", width: 640 })
    while ((await awa.getJob(job.id)).state !== "completed") await new Promise((r) => setTimeout(r, 25))
    await worker.stop()
    return done
  } finally {
    await awa.close()
  }
}
