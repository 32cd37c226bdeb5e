/**
 * The JIT drain probe of the PostgreSQL version matrix (.ci/matrix.ts, docs/postgres-support.md):
 * drains the same backlog twice on one server, once in a database with `jit = off` and once in
 * a database left at the server's default (JIT on, where the build has LLVM), and prints the
 * ratio of the two times as one JSON line.
 *
 *   node bench/src/jitDrain.ts [--jobs 5000] [--cap 5]
 *
 * Postgres: `DATABASE_URL` (the role needs CREATEDB), or a temporary server from
 * `AWA_PG_BIN`/`AWA_PG_SETTINGS` (default: the embedded PostgreSQL 17 with stock settings).
 *
 * The JIT-on drain is abandoned once it has taken `--cap` times the JIT-off drain (at least
 * 60 s): a compiled hot path is 10–50× slower (issue 13), and waiting for all of it would blow
 * CI's time limit; the ratio is then reported as "more than cap".
 */
import os from "node:os"
import { EmbeddedPostgres } from "@awa/testing"
import { Effect } from "effect"
import { createDatabase, databaseName, dropDatabase, execute, stringArg, withClient } from "./lib.ts"
import { make } from "./systems/awa.ts"

const jobs = Number(stringArg("--jobs", "5000"))
const cap = Number(stringArg("--cap", "5"))

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

interface Drain {
  readonly ms: number
  /** False when the drain was abandoned at its deadline; `ms` is then the time until then. */
  readonly finished: boolean
  readonly completed: number
}

/** Enqueues `jobs` jobs in a fresh database, then times the worker draining them. */
const drain = async (serverUrl: string, jit: "off" | "default", deadlineMs: number): Promise<Drain> => {
  const name = databaseName(`awa_jit_${jit}`)
  const url = await Effect.runPromise(createDatabase(serverUrl, name))
  if (jit === "off") await Effect.runPromise(execute(serverUrl, `ALTER DATABASE ${name} SET jit = off`))
  const adapter = await make(url)
  try {
    for (let seq = 0; seq < jobs; seq += 1000)
      await adapter.enqueueBatch(Array.from({ length: Math.min(1000, jobs - seq) }, (_, i) => seq + i))
    let started = 0
    const t0 = performance.now()
    await adapter.startWorkers(() => {
      started++
    })
    let open = jobs
    while (performance.now() - t0 < deadlineMs) {
      if (started >= jobs) {
        open = await adapter.openJobs()
        if (open === 0) break
      }
      await sleep(100)
    }
    const ms = performance.now() - t0
    await adapter.stopWorkers()
    return { ms, finished: open === 0, completed: jobs - (await adapter.openJobs()) }
  } finally {
    await adapter.close()
    await Effect.runPromise(dropDatabase(serverUrl, name))
  }
}

const main = async () => {
  const server = await EmbeddedPostgres.resolve(process.env, () =>
    EmbeddedPostgres.startTemporary({ settings: "stock", ...EmbeddedPostgres.optionsFromEnv(process.env) })
  )
  try {
    const [info] = await Effect.runPromise(
      withClient(
        server.url,
        (sql) => sql<{ version: string; jit: string; available: boolean }>`
          SELECT current_setting('server_version') AS version, current_setting('jit') AS jit,
                 pg_jit_available() AS available`
      )
    )
    const off = await drain(server.url, "off", 30 * 60_000)
    const on = await drain(server.url, "default", Math.max(60_000, cap * off.ms))
    const ratio = on.ms / off.ms
    console.log(
      JSON.stringify({
        server: info!.version,
        jitSetting: info!.jit,
        jitAvailable: info!.available,
        jobs,
        offMs: Math.round(off.ms),
        onMs: Math.round(on.ms),
        onFinished: on.finished,
        onCompleted: on.completed,
        ratio: Number(ratio.toFixed(2)),
        ratioIsLowerBound: !on.finished,
        load: os.loadavg().map((l) => Number(l.toFixed(2)))
      })
    )
  } finally {
    await server.stop()
  }
}

await main()
