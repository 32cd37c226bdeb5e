export * as Migrations from "./Migrations.ts"
export * as SqlText from "./SqlText.ts"
