/** Thrown by a handler: fails the attempt with `message`; `retryable: false` fails the step for good. */
export class TaskError extends Error {
  /** Whether the node's retry policy may run the step again (default true). */
  readonly retryable: boolean;

  constructor(message: string, options: { retryable?: boolean | undefined; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "TaskError";
    this.retryable = options.retryable ?? true;
  }
}

/**
 * The reason of a task's `signal` when the worker lost the task's lease (it
 * stalled past the lease and another worker took it, or the run was
 * cancelled): stop, the result will be dropped.
 */
export class LeaseLostError extends Error {
  readonly taskId: string;

  constructor(taskId: string, message: string) {
    super(message);
    this.name = "LeaseLostError";
    this.taskId = taskId;
  }
}
