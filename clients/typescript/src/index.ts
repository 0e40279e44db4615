/**
 * `@composer/client`: a client of Composer's REST API and a worker of its
 * task API, for Node 20 or later, with no runtime dependencies.
 */

export { Client } from "./client.js";
export type {
  BackfillOptions,
  ClientOptions,
  CreatedNamespace,
  CreatedWebhook,
  ListEventsOptions,
  ListLimitsOptions,
  ListRunsOptions,
  RegisteredWorkflow,
  RegisterWorkflowOptions,
  SendEventOptions,
  StartedRun,
  StartRunOptions,
  UpdateRunOptions,
  WaitOptions,
} from "./client.js";
export {
  ComposerError,
  ConflictError,
  InvalidRequestError,
  NotFoundError,
  UnauthorizedError,
  UnavailableError,
  WaitTimeoutError,
} from "./errors.js";
export type { ComposerErrorOptions } from "./errors.js";
export { LeaseLostError, TaskError } from "./task-error.js";
export { Worker } from "./worker.js";
export type { Handler, RunOptions, WorkerLogger, WorkerOptions, WorkerTask } from "./worker.js";
export * from "./workflow/index.js";
export { isTerminal, RUN_STATUSES, TERMINAL_STATUSES } from "./types.js";
export type * from "./types.js";
