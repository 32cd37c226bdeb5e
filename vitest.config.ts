import { defineConfig } from "vitest/config"

// Workspace packages resolve to their sources through the "@awa/source" export condition
// (ADR 0015). Vitest sets its own resolve options per environment; these are added to them.
const resolve = { conditions: ["@awa/source"] }

export default defineConfig({
  environments: { ssr: { resolve }, __vitest__: { resolve } },
  test: {
    include: ["packages/*/test/**/*.test.ts", "test/**/*.test.ts"],
    globalSetup: ["test/support/globalSetup.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000
  }
})
