/**
 * pg-boss 12.x with batch fetching and LISTEN/NOTIFY wake-ups: `useListenNotify: true` on the
 * instance and `notify: true` on the queue, `work()` with `batchSize` × `localConcurrency` = 50
 * jobs in flight and `burstWhenBatchFull` (fetch again at once while batches come back full).
 * The batch handler runs its jobs concurrently and resolves when all have; pg-boss then completes
 * the batch in one statement. Producers use `send` and `insert`. Defaults otherwise (pool of 10,
 * supervision and maintenance on).
 *
 * The split of 50 into batch size × workers is `PGBOSS_BATCH` (default 25, so 2 workers): in a
 * pilot on the 20,000-job drain, 25×2 and 50×1 reached 8–10k jobs/s and 10×5 only 2.7–4.3k
 * (fetch and complete round trips per job), and 25×2 had the better pickup tail of those two.
 * With fewer jobs in flight per process (the scale phase: 25, 13 or 12) that the batch size does
 * not divide, one worker fetches batches of the whole share (`batchSize` = share × 1).
 *
 * `install` creates the queues `bench` and `bench_1` … `bench_7` (the multi-queue producers phase).
 */
import { PgBoss } from "pg-boss"
import { type AdapterFactory, benchQueue, inFlight, packageVersion, queueCount, queueName } from "./types.ts"

const queue = benchQueue
const version = packageVersion("pg-boss")

export const make: AdapterFactory = async (url) => {
  const batchSize = Number(process.env.PGBOSS_BATCH ?? 25)
  if (!(Number.isInteger(batchSize) && batchSize >= 1 && inFlight % batchSize === 0))
    throw new Error(`PGBOSS_BATCH must divide ${inFlight} (got ${process.env.PGBOSS_BATCH})`)
  /** `batchSize` × `localConcurrency` = `concurrency` jobs in flight. */
  const split = (concurrency: number) =>
    concurrency % batchSize === 0
      ? { batchSize, localConcurrency: concurrency / batchSize }
      : { batchSize: concurrency, localConcurrency: 1 }
  const { localConcurrency } = split(inFlight)
  const boss = new PgBoss({ connectionString: url, useListenNotify: true, application_name: "bench-pgboss" })
  boss.on("error", (error) => console.error(`[pg-boss] error: ${error.message}`))
  await boss.start()
  const workOptions = (concurrency: number) => ({
    ...split(concurrency),
    burstWhenBatchFull: true,
    pollingIntervalSeconds: 0.5
  })

  return {
    name: "pg-boss",
    version,
    settings: {
      useListenNotify: true,
      "queue.notify": true,
      "work.batchSize": batchSize,
      "work.localConcurrency": localConcurrency,
      "work.burstWhenBatchFull": true,
      "work.pollingIntervalSeconds": 0.5,
      "work.notifyPollingIntervalSeconds": "30 (default)",
      max: "10 (default pool)",
      supervise: "true (default)"
    },
    install: async () => {
      for (let i = 0; i < queueCount; i++) await boss.createQueue(queueName(i), { notify: true })
    },
    enqueueSequential: async (seqs) => {
      for (const seq of seqs) await boss.send(queue, { seq })
    },
    enqueueOne: async (seq, onQueue = queue) => {
      await boss.send(onQueue, { seq })
    },
    enqueueBatch: async (seqs) => {
      await boss.insert(
        queue,
        seqs.map((seq) => ({ data: { seq } }))
      )
    },
    startWorkers: async (onStart, concurrency = inFlight) => {
      await boss.work<{ seq: number }>(queue, workOptions(concurrency), async (jobs) => {
        await Promise.all(
          jobs.map(async (job) => {
            onStart(job.data.seq)
          })
        )
      })
    },
    stopWorkers: () => boss.offWork(queue, { wait: true }),
    openJobs: async () => {
      const result = (await boss
        .getDb()
        .executeSql(
          "SELECT count(*)::int AS n FROM pgboss.job WHERE (name = $1 OR name LIKE $2) AND state <> 'completed'",
          [queue, `${queue}\\_%`]
        )) as { rows: Array<{ n: number }> }
      return result.rows[0]!.n
    },
    close: () => boss.stop({ graceful: true, timeout: 10_000 })
  }
}
