/**
 * graphile-worker 0.18.0 with the settings of its performance documentation
 * (https://worker.graphile.org/docs/performance): batched fetching through the local queue
 * (`localQueue.size` 500) and batched completion (`completeJobBatchDelay` / `failJobBatchDelay` 0),
 * with `concurrentJobs` 50 here (24 there) and a pool of `concurrentJobs + 2` as its docs advise.
 * LISTEN/NOTIFY is always on. Producers use `addJob` / `addJobs` of `WorkerUtils`. The logger
 * prints warnings and errors only (the default logs a line per job at `info`).
 *
 * "Queue" `bench_i` (the multi-queue producers phase) is the task identifier `bench_i`: a
 * graphile-worker `queueName` would make its jobs run one at a time, which Awa's and pg-boss's
 * queues do not; jobs without one are graphile-worker's parallel default.
 */
import { Logger, makeWorkerUtils, type Runner, run } from "graphile-worker"
import { type AdapterFactory, benchQueue, inFlight, packageVersion } from "./types.ts"

const task = benchQueue
const version = packageVersion("graphile-worker")

const logger = new Logger(() => (level, message) => {
  if (level === "error" || level === "warning") console.error(`[graphile-worker] ${level}: ${message}`)
})

const preset = {
  worker: {
    localQueue: { size: 500 },
    completeJobBatchDelay: 0,
    failJobBatchDelay: 0
  }
}

export const make: AdapterFactory = async (url) => {
  const utils = await makeWorkerUtils({ connectionString: url, logger })
  let runner: Runner | undefined

  return {
    name: "graphile-worker",
    version,
    settings: {
      concurrentJobs: inFlight,
      maxPoolSize: inFlight + 2,
      "preset.worker.localQueue.size": 500,
      "preset.worker.completeJobBatchDelay": 0,
      "preset.worker.failJobBatchDelay": 0,
      pollInterval: "2000 ms (default; LISTEN/NOTIFY always on)",
      producerPool: "WorkerUtils default (10)",
      logger: "warnings and errors only"
    },
    install: () => utils.migrate(),
    enqueueSequential: async (seqs) => {
      for (const seq of seqs) await utils.addJob(task, { seq })
    },
    enqueueOne: async (seq, queue = task) => {
      await utils.addJob(queue, { seq })
    },
    enqueueBatch: async (seqs) => {
      await utils.addJobs(seqs.map((seq) => ({ identifier: task, payload: { seq } })))
    },
    startWorkers: async (onStart, concurrency = inFlight) => {
      runner = await run({
        connectionString: url,
        concurrency,
        maxPoolSize: concurrency + 2,
        noHandleSignals: true,
        logger,
        preset,
        taskList: {
          [task]: async (payload) => {
            onStart((payload as { seq: number }).seq)
          }
        }
      })
    },
    stopWorkers: async () => {
      const r = runner
      runner = undefined
      if (r !== undefined) await r.stop()
    },
    openJobs: () =>
      utils.withPgClient(async (client) => {
        const result = await client.query<{ n: number }>(
          "SELECT count(*)::int AS n FROM graphile_worker.jobs WHERE task_identifier = $1 OR task_identifier LIKE $2",
          [task, `${task}\\_%`]
        )
        return result.rows[0]!.n
      }),
    close: async () => {
      await utils.release()
    }
  }
}
