/** What an error code may be: what the task API's `/fail` takes. */
const ERROR_CODE = /^[a-z0-9_.-]{1,64}$/;

/**
 * Thrown by a handler: fails the attempt with `message`; `retryable: false` fails the step for good.
 * `code` names what went wrong for failure edges to test (`.nodes.X.error.code`; 1 to 64 of
 * `a-z 0-9 _ . -`, `task_failed` without one) and `status` is the HTTP status a target answered
 * with (100 to 599). `retryAfterMs` is a 429's `Retry-After` in milliseconds: the node's next
 * attempt waits at least that long, and with `retry.on_429: "respect"` (the default for a node with
 * limits) its limit keys are held as long; it is sent only with `status: 429`, the one status it
 * means something with. Each is checked here, so a bad one is a `RangeError` where the error is made.
 */
export class TaskError extends Error {
  /** Whether the node's retry policy may run the step again (default true). */
  readonly retryable: boolean;
  /** The failure's code, sent as `code` with the failure. */
  readonly code: string | undefined;
  /** The HTTP status of a failure that is one, sent as `status`. */
  readonly status: number | undefined;
  /** A 429's `Retry-After` in milliseconds, sent as `retry_after_ms` with a 429. */
  readonly retryAfterMs: number | undefined;

  constructor(
    message: string,
    options: {
      retryable?: boolean | undefined;
      code?: string | undefined;
      status?: number | undefined;
      retryAfterMs?: number | undefined;
      cause?: unknown;
    } = {},
  ) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    const { code, status, retryAfterMs } = options;
    if (code !== undefined && !ERROR_CODE.test(code)) {
      throw new RangeError(`TaskError code must be 1 to 64 of a-z 0-9 _ . -, got ${JSON.stringify(code)}`);
    }
    if (status !== undefined && !(Number.isInteger(status) && status >= 100 && status <= 599)) {
      throw new RangeError(`TaskError status must be an HTTP status (100 to 599), got ${String(status)}`);
    }
    if (retryAfterMs !== undefined && !(Number.isSafeInteger(retryAfterMs) && retryAfterMs >= 0)) {
      throw new RangeError(`TaskError retryAfterMs must be whole milliseconds, 0 or more, got ${String(retryAfterMs)}`);
    }
    this.name = "TaskError";
    this.retryable = options.retryable ?? true;
    this.code = code;
    this.status = status;
    this.retryAfterMs = retryAfterMs;
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
