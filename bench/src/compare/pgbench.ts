/**
 * The server's raw multi-row insert rate (issue 17: the chunks-of-1,000 goal is "≥ 4× best peer,
 * or within 80 % of this rate if that is lower"), measured with `pgbench` in the same sitting:
 * one client runs `INSERT … SELECT … generate_series(1, 1000)` into a table shaped like a minimal
 * job row (identity key, queue, kind, jsonb args, priority, run_at, created_at, and one index
 * like a ready-queue index), each statement its own transaction, for a fixed time.
 *
 * The binary: `PGBENCH`, else `/usr/lib/postgresql/15/bin/pgbench` (Debian), else `pgbench` on
 * the PATH; the step is skipped with a note when none runs. Any client version drives any server.
 */
import { execFile } from "node:child_process"
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Effect } from "effect"
import { createDatabase, databaseName, dropDatabase, execute, perJob, round } from "../lib.ts"
import { checkpoint, currentLsn, walBytes } from "./observer.ts"
import { cpuDelta, readCpu } from "./proc.ts"

export const rowsPerStatement = 1_000

const schema = [
  `CREATE TABLE job (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue text NOT NULL,
  kind text NOT NULL,
  args jsonb NOT NULL,
  priority smallint NOT NULL DEFAULT 2,
  run_at timestamptz NOT NULL DEFAULT now(),
  created_at timestamptz NOT NULL DEFAULT now()
)`,
  "CREATE INDEX job_ready ON job (queue, priority, run_at, id)"
]

const script = `INSERT INTO job (queue, kind, args)
  SELECT 'bench', 'bench', jsonb_build_object('seq', g) FROM generate_series(1, ${rowsPerStatement}) AS g;
`

export interface RawInsert {
  readonly pgbench: string
  readonly command: string
  readonly seconds: number
  readonly rowsPerStatement: number
  readonly transactions: number
  readonly tps: number
  readonly rowsPerSec: number
  readonly walBytesPerRow: number
  readonly postgresCpuMsPer1000Rows: number | undefined
}

export const binary = (): string | undefined => {
  const candidates = [process.env.PGBENCH, "/usr/lib/postgresql/15/bin/pgbench", "pgbench"]
  return candidates.find((c) => c !== undefined && c !== "" && (c === "pgbench" || existsSync(c)))
}

export const run = (file: string, args: ReadonlyArray<string>) =>
  Effect.tryPromise({
    try: () =>
      new Promise<string>((resolve, reject) =>
        execFile(file, args, { encoding: "utf8", timeout: 10 * 60_000 }, (error, stdout, stderr) =>
          error === null ? resolve(stdout) : reject(new Error(`${file}: ${error.message}\n${stderr}`))
        )
      ),
    catch: (e) => (e instanceof Error ? e : new Error(String(e)))
  })

/** `pgbench` for `seconds` on a fresh database of the server at `serverUrl`; undefined without pgbench. */
export const rawInsert = (serverUrl: string, postmasterPid: number | undefined, seconds: number) =>
  Effect.gen(function* () {
    const pgbench = binary()
    if (pgbench === undefined) return undefined
    const version = yield* Effect.result(run(pgbench, ["--version"]))
    if (version._tag === "Failure") return undefined
    const name = databaseName("bench_pgbench")
    const dir = mkdtempSync(join(tmpdir(), "awa-pgbench-"))
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => rmSync(dir, { recursive: true, force: true })).pipe(
        Effect.andThen(dropDatabase(serverUrl, name))
      )
    )
    const dbUrl = yield* createDatabase(serverUrl, name)
    for (const statement of schema) yield* execute(dbUrl, statement)
    const file = join(dir, "insert.sql")
    writeFileSync(file, script)
    const args = ["-n", "-c", "1", "-j", "1", "-M", "prepared", "-f", file, "-T"]
    // warm-up: plans, buffers, the table's first pages
    yield* run(pgbench, [...args, "2", dbUrl])
    yield* checkpoint(serverUrl)
    const lsn = yield* currentLsn(serverUrl)
    const cpu0 = readCpu(postmasterPid, undefined)
    const out = yield* run(pgbench, [...args, String(seconds), dbUrl])
    const cpu1 = readCpu(postmasterPid, undefined)
    const wal = yield* walBytes(serverUrl, lsn, yield* currentLsn(serverUrl))
    const transactions = Number(
      /number of transactions actually processed: (\d+)/.exec(out)?.[1] ?? Number.NaN
    )
    const tps = Number(/tps = ([\d.]+) \(without initial connection time\)/.exec(out)?.[1] ?? Number.NaN)
    if (!Number.isFinite(transactions) || !Number.isFinite(tps))
      return yield* Effect.fail(new Error(`pgbench: unexpected output\n${out}`))
    const rows = transactions * rowsPerStatement
    const postgres = cpuDelta(cpu0, cpu1).postgres
    return {
      pgbench: version.success.trim(),
      command: `pgbench ${[...args, String(seconds)].join(" ")} <db>  # ${script.trim().replace(/\s+/g, " ")}`,
      seconds,
      rowsPerStatement,
      transactions,
      tps: round(tps, 1),
      rowsPerSec: Math.round(tps * rowsPerStatement),
      walBytesPerRow: Math.round(perJob(wal, rows)),
      postgresCpuMsPer1000Rows: postgres === undefined ? undefined : round(perJob(postgres * 1e6, rows), 1)
    } satisfies RawInsert
  }).pipe(Effect.scoped)
