export * as EmbeddedPostgres from "./EmbeddedPostgres.ts"
export * as TestDatabase from "./TestDatabase.ts"
