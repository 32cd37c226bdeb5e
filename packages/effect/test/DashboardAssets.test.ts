/**
 * The dashboard's embedded assets (issue 19): `assets.generated.ts` matches the files it is made
 * from (run `npm run gen:dashboard` after editing them), and nothing in them loads from another
 * origin, so the dashboard works offline and behind a strict firewall.
 */
import { readFileSync } from "node:fs"
import { assert, describe, it } from "vitest"
import { generatedFile, render } from "../../../scripts/gen-dashboard.ts"
import * as Assets from "../src/dashboard/assets.generated.ts"

describe("dashboard assets", () => {
  it("assets.generated.ts is up to date with index.html, app.css and app.js", () => {
    assert.strictEqual(readFileSync(generatedFile, "utf8"), render(), "run npm run gen:dashboard")
  })

  it("load nothing from another origin (no CDN, no web fonts)", () => {
    for (const [name, text] of Object.entries(Assets)) {
      assert.notMatch(text, /(src|href)\s*=\s*["']?(https?:)?\/\//i, name)
      assert.notMatch(text, /@import|url\(\s*["']?(https?:)?\/\//i, name)
      assert.notMatch(text, /fetch\(\s*["'`]https?:/i, name)
    }
  })
})
