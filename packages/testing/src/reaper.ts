/**
 * Detached watchdog for a temporary embedded Postgres: `node reaper.ts <ownerPid> <dataDir> <root>`.
 * When the owner process is gone (killed, crashed, interrupted) it stops the server running in
 * `dataDir` and deletes `root`. It exits early when `root` disappears (the owner cleaned up).
 */
import { existsSync, readFileSync, rmSync } from "node:fs"
import { join } from "node:path"

const [ownerArg, dataDir, root] = process.argv.slice(2)
const owner = Number(ownerArg)

const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

const postmasterPid = (): number | undefined => {
  try {
    const pid = Number(readFileSync(join(dataDir!, "postmaster.pid"), "utf8").split("\n")[0])
    return Number.isInteger(pid) && pid > 0 ? pid : undefined
  } catch {
    return undefined
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

const reap = async () => {
  const pid = postmasterPid()
  if (pid !== undefined && alive(pid)) {
    process.kill(pid, "SIGQUIT") // immediate shutdown: the data is thrown away anyway
    for (let i = 0; i < 100 && alive(pid); i++) await sleep(100)
    if (alive(pid)) process.kill(pid, "SIGKILL")
  }
  rmSync(root!, { recursive: true, force: true })
}

const main = async () => {
  while (true) {
    if (!existsSync(root!)) return
    if (!alive(owner)) return reap()
    await sleep(500)
  }
}

void main()
