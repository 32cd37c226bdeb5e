/**
 * `npm run test:consumer` (the last step of `.ci/run`): installs Awa the way an application does
 * and checks the result, outside the workspace.
 *
 * 1. `npm run build`, then `npm pack` every published package.
 * 2. `publint` and `@arethetypeswrong/cli` on every tarball (no errors allowed).
 * 3. A fresh application in a temporary directory, with its own `package.json`, runs the README's
 *    install line with `@awa/effect` replaced by the tarballs (the other `@awa/*` packages are not
 *    on the registry; with them beside it npm resolves the entry package's dependencies to them).
 *    `effect` and the other peers come from the registry, in the supported ranges.
 * 4. Type-checks `test/consumer/app.ts` there with a plain `tsc` configuration (`module: nodenext`,
 *    `strict`, no `allowImportingTsExtensions`, library declarations checked too).
 * 5. Runs the compiled app on the oldest Node the `engines` field promises (the registry's `node`
 *    package of exactly that version) against Postgres: enqueue inside a transaction, a worker.
 * 6. Runs `npx awa --help` there (the `awa` bin of `@awa/effect`, on that Node) and checks it
 *    lists the commands.
 * 7. Bundles it with esbuild and runs the bundle alone in an empty directory (no node_modules).
 *
 * Postgres: `DATABASE_URL` (a role with CREATEDB) or a temporary embedded server. Set
 * `AWA_CONSUMER_KEEP=1` to keep the scratch directory.
 */
import { type ExecFileSyncOptions, execFileSync } from "node:child_process"
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { fileURLToPath } from "node:url"
import { PgClient } from "@effect/sql-pg"
import { Effect, Redacted } from "effect"
import { Reactivity } from "effect/reactivity"
import { resolve, startTemporary, withDatabase } from "../packages/testing/src/EmbeddedPostgres.ts"
import { publishedPackages } from "./build.ts"

const root = fileURLToPath(new URL("..", import.meta.url))
const entryPackage = JSON.parse(readFileSync(`${root}packages/effect/package.json`, "utf8"))

// Exact versions of the tools the check itself uses (not the application's dependencies).
const tools = {
  esbuild: "0.28.2",
  publint: "0.3.25",
  "@arethetypeswrong/cli": "0.18.5",
  "@types/node": "22.19.3"
}

/** The oldest Node the packages promise: the lower bound of `engines.node` (">=X.Y.Z"). */
const oldestNode = /^>=(\d+\.\d+\.\d+)$/.exec(entryPackage.engines.node)?.[1]
if (oldestNode === undefined)
  throw new Error(`engines.node must read ">=X.Y.Z", not ${entryPackage.engines.node}`)

// The workspace's NODE_OPTIONS (.npmrc) select the "@awa/source" condition; nothing outside the
// workspace may see it, or the installed packages would resolve to their .ts sources.
const outside: NodeJS.ProcessEnv = { ...process.env }
delete outside["NODE_OPTIONS"]
delete outside["DATABASE_URL"]

const run = (file: string, args: ReadonlyArray<string>, options: ExecFileSyncOptions = {}) =>
  execFileSync(file, args, { stdio: "inherit", env: outside, ...options })

const output = (file: string, args: ReadonlyArray<string>, options: ExecFileSyncOptions = {}) =>
  String(execFileSync(file, args, { env: outside, stdio: ["ignore", "pipe", "inherit"], ...options }))

const timings: Array<string> = []
const step = async <A>(name: string, f: () => A | Promise<A>): Promise<A> => {
  console.log(`\n=== consumer test: ${name}`)
  const started = Date.now()
  const result = await f()
  timings.push(`${name}: ${((Date.now() - started) / 1000).toFixed(1)} s`)
  return result
}

/** The README's install line: `npm install @awa/effect …`, exactly one. */
const readmeInstallLine = (): Array<string> => {
  const lines = readFileSync(`${root}README.md`, "utf8")
    .split("\n")
    .filter((line) => line.startsWith("npm install @awa/effect"))
  if (lines.length !== 1)
    throw new Error(`README.md must have one "npm install @awa/effect …" line (${lines.length})`)
  return lines[0]!.trim().split(/\s+/).slice(2)
}

const createDatabase = (adminUrl: string, name: string) =>
  Effect.runPromise(
    PgClient.make({ url: Redacted.make(adminUrl), maxConnections: 1 }).pipe(
      Effect.flatMap((sql) =>
        Effect.andThen(
          sql.unsafe(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).unprepared,
          sql.unsafe(`CREATE DATABASE ${name}`).unprepared
        )
      ),
      Effect.scoped,
      Effect.provide(Reactivity.layer)
    )
  ).then(() => withDatabase(adminUrl, name))

const scratch = mkdtempSync(join(tmpdir(), "awa-consumer-"))
const app = join(scratch, "app")
const tarballs = join(scratch, "tarballs")
const started = Date.now()
const server = await resolve(process.env, startTemporary)
try {
  await step("npm run build", () => run("npm", ["run", "build"], { cwd: root, env: process.env }))

  mkdirSync(tarballs)
  const packed = await step("npm pack", () =>
    publishedPackages.map((name) => {
      const [info] = JSON.parse(
        output("npm", ["pack", "--json", "--pack-destination", tarballs], { cwd: `${root}packages/${name}` })
      ) as Array<{ filename: string; files: Array<{ path: string }> }>
      const tests = info!.files.filter((f) => !/^(dist|src)\/|^(package\.json|LICENSE)$/.test(f.path))
      if (tests.length > 0) throw new Error(`${info!.filename} ships ${tests.map((f) => f.path).join(", ")}`)
      return join(tarballs, info!.filename)
    })
  )

  mkdirSync(join(app, "src"), { recursive: true })
  writeFileSync(
    join(app, "package.json"),
    JSON.stringify(
      {
        name: "awa-consumer-app",
        private: true,
        type: "module",
        devDependencies: { ...tools, node: oldestNode },
        allowScripts: { node: true, esbuild: true }
      },
      null,
      2
    )
  )
  await step("npm install (the README's line, @awa/effect from the tarballs)", () => {
    const specs = readmeInstallLine().flatMap((spec) => (spec === "@awa/effect" ? packed : [spec]))
    run("npm", ["install", "--no-audit", "--no-fund", ...specs], { cwd: app })
    // One copy of effect, the application's: two copies break Schema at the first insert.
    const copies = output("npm", ["ls", "--all", "--parseable", "effect"], { cwd: app }).trim().split("\n")
    if (copies.length !== 1) throw new Error(`expected one copy of effect, found:\n${copies.join("\n")}`)
  })
  const bin = (name: string) => join(app, "node_modules", ".bin", name)

  await step("publint and attw on every tarball", () => {
    for (const tarball of packed) {
      const unpacked = join(scratch, "unpacked", tarball.split("/").at(-1)!)
      mkdirSync(unpacked, { recursive: true })
      run("tar", ["xzf", tarball, "-C", unpacked])
      run(bin("publint"), ["run", "--strict", "--pack", "false", join(unpacked, "package")])
      // ESM only by design: CommonJS `require` of these packages is not offered.
      run(bin("attw"), ["--profile", "esm-only", "--format", "table-flipped", tarball])
    }
  })

  await step("tsc (module nodenext, strict, skipLibCheck off)", () => {
    copyFileSync(`${root}test/consumer/app.ts`, join(app, "src", "app.ts"))
    writeFileSync(
      join(app, "tsconfig.json"),
      JSON.stringify(
        {
          compilerOptions: {
            target: "es2022",
            module: "nodenext",
            moduleResolution: "nodenext",
            strict: true,
            types: ["node"],
            rootDir: "src",
            outDir: "dist"
          },
          include: ["src"]
        },
        null,
        2
      )
    )
    run(`${root}node_modules/.bin/tsc`, ["-p", app])
  })

  const node = bin("node")
  const version = output(node, ["--version"]).trim()
  if (version !== `v${oldestNode}`) throw new Error(`expected Node v${oldestNode}, got ${version}`)

  await step(`run on Node ${version}`, async () => {
    const url = await createDatabase(server.url, "awa_consumer_app")
    run(node, ["dist/app.js"], { cwd: app, env: { ...outside, DATABASE_URL: url }, timeout: 120_000 })
  })

  // the `awa` bin of @awa/effect (issue 18), found by npx in the app and run by its Node
  await step(`npx awa --help on Node ${version}`, () => {
    const path = `${join(app, "node_modules", ".bin")}:${outside["PATH"] ?? ""}`
    // a clean environment, as in a user's shell: under `npm run` the inherited npm variables
    // lead npx back to the workspace's configuration and its "@awa/source" condition
    const env: NodeJS.ProcessEnv = { PATH: path, HOME: outside["HOME"] ?? "" }
    const help = output("npx", ["--no-install", "awa", "--help"], { cwd: app, env })
    for (const command of ["migrate", "status", "queues", "doctor"])
      if (!help.includes(`\n  ${command} `)) throw new Error(`awa --help does not list ${command}:\n${help}`)
  })

  await step(`esbuild bundle, run alone on Node ${version}`, async () => {
    const alone = join(scratch, "bundle")
    mkdirSync(alone)
    run(
      bin("esbuild"),
      [
        "dist/app.js",
        "--bundle",
        "--platform=node",
        "--format=esm",
        `--outfile=${join(alone, "app.mjs")}`,
        "--log-level=warning"
      ],
      { cwd: app }
    )
    const url = await createDatabase(server.url, "awa_consumer_bundle")
    run(node, ["app.mjs"], { cwd: alone, env: { ...outside, DATABASE_URL: url }, timeout: 120_000 })
  })
} finally {
  if (server.started) await server.stop()
  if (process.env["AWA_CONSUMER_KEEP"] === "1") console.log(`kept ${scratch}`)
  else rmSync(scratch, { recursive: true, force: true })
}
console.log(
  `\nconsumer test passed in ${((Date.now() - started) / 1000).toFixed(0)} s:\n  ${timings.join("\n  ")}`
)
