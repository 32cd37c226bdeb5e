/**
 * `npm run build`: the publishable output of every package, in dependency order.
 *
 * 1. Regenerates `packages/sql/src/migrations.generated.ts` from the .sql files, and the
 *    dashboard's embedded assets (`packages/effect/src/dashboard/assets.generated.ts`).
 * 2. Compiles each package's `src/` to `dist/` (ESM JavaScript, `.d.ts`, declaration and source
 *    maps) with its `tsconfig.build.json`. Without the "@awa/source" condition a package compiles
 *    against the declarations of the packages built before it, as an application would.
 * 3. Rewrites relative `.ts` specifiers in the emitted `.d.ts` files to `.js`: tsc's
 *    `rewriteRelativeImportExtensions` rewrites them in JavaScript only, and `.js` is what every
 *    TypeScript version and tool resolves. Same length, so the declaration maps stay exact.
 *
 * The workspace itself never needs this: tests, the demo and the benchmarks run from sources.
 */
import { execFileSync } from "node:child_process"
import { readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { fileURLToPath } from "node:url"
import * as Dashboard from "./gen-dashboard.ts"
import { generatedFile, readMigrationFiles, render } from "./gen-migrations.ts"

/** The published packages, each after the ones it depends on. */
export const publishedPackages = ["core", "sql", "storage", "runtime", "effect"] as const

const root = fileURLToPath(new URL("..", import.meta.url))

const relativeTsSpecifier = /((?:from|import)\s*\(?\s*")(\.{1,2}\/[^"]*)\.ts"/g

/** Rewrites `"./X.ts"` to `"./X.js"` in every `.d.ts` under `dir`; returns how many files changed. */
export const rewriteDeclarationSpecifiers = (dir: string): number => {
  let changed = 0
  for (const entry of readdirSync(dir, { recursive: true, encoding: "utf8" })) {
    if (!entry.endsWith(".d.ts")) continue
    const file = `${dir}/${entry}`
    const text = readFileSync(file, "utf8")
    const rewritten = text.replace(relativeTsSpecifier, '$1$2.js"')
    if (rewritten !== text) {
      writeFileSync(file, rewritten)
      changed++
    }
  }
  return changed
}

if (import.meta.main) {
  writeFileSync(generatedFile, render(readMigrationFiles()))
  writeFileSync(Dashboard.generatedFile, Dashboard.render())
  for (const name of publishedPackages) {
    const dir = `${root}packages/${name}`
    rmSync(`${dir}/dist`, { recursive: true, force: true })
    const started = Date.now()
    execFileSync(`${root}node_modules/.bin/tsc`, ["-p", `${dir}/tsconfig.build.json`], { stdio: "inherit" })
    rewriteDeclarationSpecifiers(`${dir}/dist`)
    console.log(`built packages/${name}/dist in ${((Date.now() - started) / 1000).toFixed(1)} s`)
  }
}
