#!/usr/bin/env node
/**
 * The `awa` executable (`bin` of `@awa/effect`): runs the command line of `../Cli.ts` on Node and
 * exits with its code (0 done, 1 error, 2 checked and not ready). Needs `@effect/platform-node`.
 */
import { NodeRuntime, NodeServices } from "@effect/platform-node"
import { Effect } from "effect"
import { run } from "../Cli.ts"

NodeRuntime.runMain(
  run(process.argv.slice(2)).pipe(
    Effect.flatMap((code) =>
      Effect.sync(() => {
        process.exitCode = code
      })
    ),
    Effect.provide(NodeServices.layer)
  ),
  { disableErrorReporting: true }
)
