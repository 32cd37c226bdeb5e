export * as PgQueueStorage from "./PgQueueStorage.ts"
export * from "./QueueStorage.ts"
export * as SimQueueStorage from "./SimQueueStorage.ts"
export * as StorageChecks from "./StorageChecks.ts"
