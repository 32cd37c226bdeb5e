/**
 * Each system's adapter factory, loaded on demand (a run imports only the system it measures, so
 * a child process of one system does not load the others' drivers).
 */
import type { AdapterFactory, SystemName } from "./types.ts"

export const factories: Record<SystemName, () => Promise<AdapterFactory>> = {
  awa: async () => (await import("./awa.ts")).make,
  "graphile-worker": async () => (await import("./graphile.ts")).make,
  "pg-boss": async () => (await import("./pgboss.ts")).make
}
