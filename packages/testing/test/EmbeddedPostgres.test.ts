import { spawn } from "node:child_process"
import { existsSync } from "node:fs"
import { setTimeout as sleep } from "node:timers/promises"
import { PgClient } from "@effect/sql-pg"
import { Effect, Redacted } from "effect"
import { describe, expect, inject, it } from "vitest"
import { resolve, runningPostmaster, startTemporary } from "../src/EmbeddedPostgres.ts"

const selectOne = (url: string) =>
  Effect.runPromise(
    Effect.gen(function* () {
      const sql = yield* PgClient.PgClient
      const [row] = yield* sql<{ one: number }>`SELECT 1 AS one`
      return row!.one
    }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))
  )

const waitFor = async (condition: () => boolean, ms: number) => {
  for (const start = Date.now(); Date.now() - start < ms; await sleep(100)) if (condition()) return true
  return condition()
}

describe("EmbeddedPostgres", () => {
  it("starts a temporary server and leaves nothing behind when stopped", async () => {
    const server = await startTemporary()
    expect(await selectOne(server.url)).toBe(1)
    const pid = runningPostmaster(server.dataDir)
    expect(pid).toBeGreaterThan(0)
    await server.stop()
    expect(existsSync(server.dataDir)).toBe(false)
    expect(runningPostmaster(server.dataDir)).toBeUndefined()
  })

  it("is stopped and deleted by its reaper when the owning process is killed with SIGKILL", async () => {
    const script = `
      import { startTemporary } from ${JSON.stringify(new URL("../src/EmbeddedPostgres.ts", import.meta.url).pathname)}
      const server = await startTemporary()
      console.log(JSON.stringify({ dataDir: server.dataDir }))
      setInterval(() => {}, 1000)
    `
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], {
      stdio: ["ignore", "pipe", "inherit"]
    })
    const line = await new Promise<string>((ok, fail) => {
      child.stdout.once("data", (chunk) => ok(String(chunk)))
      child.once("exit", () => fail(new Error("child exited before starting the server")))
    })
    const { dataDir } = JSON.parse(line) as { dataDir: string }
    const postmaster = runningPostmaster(dataDir)
    expect(postmaster).toBeGreaterThan(0)
    child.kill("SIGKILL")
    expect(await waitFor(() => !existsSync(dataDir), 20_000)).toBe(true)
    expect(
      await waitFor(() => {
        try {
          process.kill(postmaster!, 0)
          return false
        } catch {
          return true
        }
      }, 10_000)
    ).toBe(true)
  })

  it("uses DATABASE_URL when it is set instead of starting a server", async () => {
    const url = inject("awaAdminUrl")
    let started = false
    const server = await resolve({ DATABASE_URL: url }, async () => {
      started = true
      throw new Error("must not start")
    })
    expect(started).toBe(false)
    expect(server.url).toBe(url)
    expect(await selectOne(server.url)).toBe(1)
  })
})
