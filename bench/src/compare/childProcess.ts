/**
 * A system's child process seen from the orchestrator: request/response over the IPC channel,
 * each call with a timeout, and a close that falls back to SIGKILL (by pid) when the child does
 * not exit in time.
 */
import { type ChildProcess, fork } from "node:child_process"
import { fileURLToPath } from "node:url"
import { Effect } from "effect"
import type { SystemName } from "../systems/types.ts"
import type { Request, Response } from "./protocol.ts"

const childScript = fileURLToPath(new URL("./child.ts", import.meta.url))

export class ChildError extends Error {
  override readonly name = "ChildError"
}

export interface Child {
  readonly pid: number
  readonly system: SystemName
  readonly call: <A>(request: Request, timeoutMs: number) => Effect.Effect<A, ChildError>
}

interface Pending {
  readonly resolve: (value: unknown) => void
  readonly reject: (error: Error) => void
}

const waitExit = (proc: ChildProcess, timeoutMs: number) =>
  new Promise<boolean>((resolve) => {
    if (proc.exitCode !== null || proc.signalCode !== null) return resolve(true)
    const timer = setTimeout(() => resolve(false), timeoutMs)
    proc.once("exit", () => {
      clearTimeout(timer)
      resolve(true)
    })
  })

export interface SpawnOptions {
  /** Extra `node` flags for the child (e.g. `--cpu-prof`). */
  readonly execArgv?: ReadonlyArray<string> | undefined
  readonly env?: Readonly<Record<string, string>> | undefined
}

/** Forks the child for `system` on `url`; waits for its "ready". Closed (or killed) with the scope. */
export const spawnChild = (system: SystemName, url: string, options: SpawnOptions = {}) =>
  Effect.acquireRelease(
    Effect.tryPromise({
      try: () =>
        new Promise<{ proc: ChildProcess; child: Child }>((resolve, reject) => {
          const proc = fork(childScript, [system, url], {
            execArgv: [...process.execArgv, ...(options.execArgv ?? [])],
            env: { ...process.env, ...options.env },
            stdio: ["ignore", "inherit", "inherit", "ipc"]
          })
          const pending = new Map<number, Pending>()
          let nextId = 1
          let ready = false
          proc.on("message", (message: Response) => {
            if (message.id === 0) {
              ready = true
              resolve({ proc, child })
              return
            }
            const p = pending.get(message.id)
            if (p === undefined) return
            pending.delete(message.id)
            if (message.ok) p.resolve(message.value)
            else p.reject(new ChildError(`${system}: ${message.error}`))
          })
          proc.on("exit", (code, signal) => {
            const error = new ChildError(`${system} child exited (code ${code}, signal ${signal})`)
            for (const p of pending.values()) p.reject(error)
            pending.clear()
            if (!ready) reject(error)
          })
          const child: Child = {
            pid: proc.pid!,
            system,
            call: <A>(request: Request, timeoutMs: number) =>
              Effect.tryPromise({
                try: () =>
                  new Promise<A>((res, rej) => {
                    const id = nextId++
                    const timer = setTimeout(() => {
                      pending.delete(id)
                      rej(new ChildError(`${system}: ${request.op} timed out after ${timeoutMs} ms`))
                    }, timeoutMs)
                    pending.set(id, {
                      resolve: (v) => {
                        clearTimeout(timer)
                        res(v as A)
                      },
                      reject: (e) => {
                        clearTimeout(timer)
                        rej(e)
                      }
                    })
                    proc.send({ id, request })
                  }),
                catch: (e) => (e instanceof ChildError ? e : new ChildError(String(e)))
              })
          }
        }),
      catch: (e) => (e instanceof ChildError ? e : new ChildError(String(e)))
    }),
    ({ proc, child }) =>
      Effect.promise(async () => {
        if (proc.exitCode !== null || proc.signalCode !== null) return
        // Clean close: stop workers, close pools, exit; SIGKILL (this pid only) after 30 s.
        await Effect.runPromise(Effect.ignore(child.call({ op: "close" }, 30_000)))
        if (!(await waitExit(proc, 5_000))) {
          console.error(`  ${child.system} child ${proc.pid} did not exit; killing it`)
          proc.kill("SIGKILL")
          await waitExit(proc, 5_000)
        }
      })
  ).pipe(Effect.map(({ child }) => child))

/**
 * Installs `system` on `url` from a short-lived child of its own, as the harness does before it
 * forks a phase's process: the process that measures then has run none of the install's
 * statements (docs/benchmarks.md, "Why the harness's drain cost Awa more").
 */
export const installInChild = (system: SystemName, url: string) =>
  Effect.scoped(
    Effect.flatMap(spawnChild(system, url, { env: { AWA_BENCH_PROFILE: "tuned" } }), (child) =>
      child.call({ op: "install" }, 120_000)
    )
  )
