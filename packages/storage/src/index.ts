export * as PgQueueStorage from "./PgQueueStorage.ts"
export * from "./QueueStorage.ts"
