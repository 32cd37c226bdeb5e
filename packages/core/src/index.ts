export * from "./AwaError.ts"
