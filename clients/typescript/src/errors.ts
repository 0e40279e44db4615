import type { ErrorCode, Run } from "./types.js";

/** What an error carries besides its message. */
export interface ComposerErrorOptions {
  /** The HTTP status; 0 when no answer came. */
  status: number;
  /** The server's stable code, or the client's (`http_error`, `unreachable`, `timeout`, `invalid_answer`, `wait_timeout`). */
  code: ErrorCode;
  cause?: unknown;
  /** The server's `Retry-After`, in milliseconds, when it sent one. */
  retryAfterMs?: number | undefined;
}

/**
 * An error of a call to Composer: the server's `{"error": {"code",
 * "message"}}` (with its HTTP status), or no usable answer at all (status 0).
 * `instanceof` one of the subclasses to tell them apart.
 */
export class ComposerError extends Error {
  /** The HTTP status; 0 when no answer came (connection refused, timeout). */
  readonly status: number;
  /** Stable, for programs: `not_found`, `invalid_request`, `conflict`, `lease_lost`... */
  readonly code: ErrorCode;
  /** The server's `Retry-After`, in milliseconds, when it sent one. */
  readonly retryAfterMs: number | undefined;

  constructor(message: string, options: ComposerErrorOptions) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.status = options.status;
    this.code = options.code;
    this.retryAfterMs = options.retryAfterMs;
  }
}

/**
 * 400, and the other refusals of the request itself (405, 413, 414, 415;
 * 422, an idempotency key used before with another input): sending it
 * again will not help. The message names the field.
 */
export class InvalidRequestError extends ComposerError {}

/** 401 or 403: a missing or wrong token (or a refused origin). */
export class UnauthorizedError extends ComposerError {}

/** 404: no such run, workflow or endpoint. */
export class NotFoundError extends ComposerError {}

/** 409: not possible in the current state (cancelling a finished run; `lease_lost` for a worker's task). */
export class ConflictError extends ComposerError {}

/**
 * 5xx, 429, or no answer: the coordinator (or its database) is down, busy
 * or stopping, the connection failed, or the call timed out. Worth retrying.
 */
export class UnavailableError extends ComposerError {}

/** `waitForRun` ran out of time; `run` is the run as last seen. */
export class WaitTimeoutError extends ComposerError {
  readonly run: Run;

  constructor(message: string, run: Run) {
    super(message, { status: 0, code: "wait_timeout" });
    this.run = run;
  }
}

/** The error class of an error answer of `status`. */
export function errorClassFor(status: number): typeof ComposerError {
  if (status >= 500 || status === 429) return UnavailableError;
  if (status === 404) return NotFoundError;
  if (status === 409) return ConflictError;
  if (status === 401 || status === 403) return UnauthorizedError;
  if ([400, 405, 413, 414, 415, 422].includes(status)) return InvalidRequestError;
  return ComposerError;
}
