/** The one HTTP call of the client and the worker: JSON in and out, the
 * bearer token, a timeout, and errors as `ComposerError`s. */

import { ComposerError, errorClassFor, UnavailableError } from "./errors.js";
import type { JsonValue } from "./types.js";

export type Fetch = typeof globalThis.fetch;

/** Where and how to call. */
export interface Transport {
  /** The coordinator's URL, without a trailing slash. */
  readonly base: string;
  readonly token: string | undefined;
  /** The namespace every call names (the `composer-namespace` header); `default` when undefined. */
  readonly namespace: string | undefined;
  /** Per call, unless the call says otherwise. */
  readonly timeoutMs: number;
  readonly fetch: Fetch;
}

export interface CallOptions {
  /** This call's timeout (a long-poll's wait plus a margin). */
  timeoutMs?: number | undefined;
  /** Aborts the call; it then rejects with the signal's reason. */
  signal?: AbortSignal | undefined;
  /** Headers besides the call's own (a `traceparent`), by lower-case name. */
  headers?: Record<string, string> | undefined;
}

/** What a successful call answered. */
export interface Answer<T> {
  status: number;
  body: T;
}

/** The header naming the namespace a call is in (`default` without it). */
export const NAMESPACE_HEADER = "composer-namespace";

/** What a namespace's name may be: the API's pattern. */
const NAMESPACE = /^[a-z][a-z0-9-]{0,62}$/;

/**
 * A transport for `url`; throws a TypeError for a URL that is not http(s),
 * or a namespace the server would refuse in every call.
 */
export function transport(options: {
  url: string;
  token?: string | undefined;
  namespace?: string | undefined;
  timeoutMs?: number | undefined;
  fetch?: Fetch | undefined;
}, defaultTimeoutMs: number): Transport {
  const base = String(options.url ?? "").trim().replace(/\/+$/, "");
  let parsed: URL;
  try {
    parsed = new URL(base);
  } catch {
    throw new TypeError(`url: expected the coordinator's http(s) URL, got ${JSON.stringify(options.url)}`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
    throw new TypeError(`url: expected an http or https URL, got ${JSON.stringify(options.url)}`);
  }
  const timeoutMs = options.timeoutMs ?? defaultTimeoutMs;
  if (!(timeoutMs > 0)) throw new RangeError(`timeoutMs: expected a positive number, got ${timeoutMs}`);
  const fetch = options.fetch ?? globalThis.fetch;
  if (typeof fetch !== "function") throw new TypeError("no fetch: Node 20 or later is needed");
  const token = options.token === undefined || options.token === "" ? undefined : options.token;
  const namespace = options.namespace === undefined || options.namespace === "" ? undefined : options.namespace;
  if (namespace !== undefined && (typeof namespace !== "string" || !NAMESPACE.test(namespace))) {
    throw new TypeError(
      `namespace: expected 1 to 63 lowercase letters, digits and '-', starting with a letter, got ${JSON.stringify(namespace)}`,
    );
  }
  return { base, token, namespace, timeoutMs, fetch };
}

/**
 * Encodes one path segment (a run id, a workflow name, a limit key such as
 * `stripe:acct_1/eu`): every reserved character, `/` included, and
 * `! ' ( ) *`, which `encodeURIComponent` leaves, so that a value can never
 * reach another route.
 */
export function segment(value: string | number): string {
  const text = String(value);
  // A URL resolves `.` and `..` (and their %2e spellings) away: such a name
  // would reach another route. The server refuses to register one.
  if (text === "." || text === "..") {
    throw new RangeError(`the name ${JSON.stringify(text)} cannot be used: a URL cannot carry . or .. as a path segment`);
  }
  return encodeURIComponent(String(value)).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

/** A query string (with its `?`) of the parameters that are set. */
export function query(params: Record<string, string | number | undefined | null>): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null) q.set(k, String(v));
  }
  const text = q.toString();
  return text === "" ? "" : `?${text}`;
}

/** The reason a call's own timer aborted it. */
class CallTimeout extends Error {}

/** Calls `method path` with `body` as JSON; an error answer (or none) throws a `ComposerError`. */
/** The header every answer of a Composer coordinator carries, naming its version. */
export const VERSION_HEADER = "composer-version";

export async function call<T>(
  t: Transport,
  method: "GET" | "POST" | "PUT" | "DELETE",
  path: string,
  body?: unknown,
  options: CallOptions = {},
): Promise<Answer<T>> {
  const headers: Record<string, string> = { ...options.headers, accept: "application/json" };
  let payload: string | undefined;
  if (body !== undefined) {
    headers["content-type"] = "application/json";
    payload = JSON.stringify(body);
  }
  if (t.token !== undefined) headers["authorization"] = `Bearer ${t.token}`;
  if (t.namespace !== undefined) headers[NAMESPACE_HEADER] = t.namespace;

  const timeoutMs = options.timeoutMs ?? t.timeoutMs;
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(new CallTimeout()), timeoutMs);
  const outer = options.signal;
  const onAbort = () => controller.abort(outer?.reason);
  if (outer?.aborted) onAbort();
  else outer?.addEventListener("abort", onAbort, { once: true });

  const what = `${method} ${path}`;
  let status: number;
  let text: string;
  let retryAfter: string | null;
  let composer: boolean;
  try {
    const init: RequestInit = { method, headers, signal: controller.signal };
    if (payload !== undefined) init.body = payload;
    const resp = await t.fetch(t.base + path, init);
    status = resp.status;
    retryAfter = resp.headers.get("retry-after");
    composer = resp.headers.get(VERSION_HEADER) !== null;
    text = await resp.text();
  } catch (e) {
    if (outer?.aborted) throw outer.reason;
    if (controller.signal.reason instanceof CallTimeout) {
      throw new UnavailableError(`${what}: no answer from ${t.base} within ${timeoutMs} ms`, {
        status: 0,
        code: "timeout",
        cause: e,
      });
    }
    throw new UnavailableError(`${what}: cannot reach the coordinator at ${t.base}: ${describeCause(e)}`, {
      status: 0,
      code: "unreachable",
      cause: e,
    });
  } finally {
    clearTimeout(timer);
    outer?.removeEventListener("abort", onAbort);
  }

  // Every answer of a coordinator names its version; another server's JSON
  // is not the API's. A 5xx without it may be a proxy before a coordinator
  // that is down: unavailable, below.
  if (!composer && status < 500) {
    throw new ComposerError(
      `${what}: ${t.base} answered HTTP ${status} without a ${VERSION_HEADER} header: it is not a Composer coordinator (check the client's URL)`,
      { status, code: "not_composer" },
    );
  }
  if (status < 200 || status > 299) {
    let code = "http_error"; // not the API's error body (a proxy's page), as the Python client says
    let message = text.trim().slice(0, 1000) || `HTTP ${status}`;
    try {
      const parsed = JSON.parse(text) as { error?: { code?: unknown; message?: unknown } };
      if (parsed && typeof parsed.error === "object" && parsed.error !== null) {
        if (typeof parsed.error.code === "string") code = parsed.error.code;
        if (typeof parsed.error.message === "string") message = parsed.error.message;
      }
    } catch {
      // not JSON: keep the text
    }
    const seconds = retryAfter === null ? NaN : Number(retryAfter);
    const Class = errorClassFor(status);
    throw new Class(message, {
      status,
      code,
      retryAfterMs: Number.isFinite(seconds) && seconds >= 0 ? seconds * 1000 : undefined,
    });
  }
  let parsed: JsonValue;
  try {
    parsed = JSON.parse(text) as JsonValue;
  } catch (e) {
    throw new UnavailableError(`${what}: the answer (${status}) is not JSON: ${text.slice(0, 200)}`, {
      status,
      code: "invalid_answer",
      cause: e,
    });
  }
  return { status, body: parsed as T };
}

/** A fetch failure's reason: undici hides it in `cause` (ECONNREFUSED ...). */
function describeCause(e: unknown): string {
  const parts: string[] = [];
  let cur: unknown = e;
  for (let i = 0; i < 4 && cur !== undefined && cur !== null; i++) {
    if (cur instanceof Error) {
      const code = (cur as { code?: unknown }).code;
      parts.push(typeof code === "string" && !cur.message.includes(code) ? `${cur.message} (${code})` : cur.message);
      cur = cur.cause;
    } else {
      parts.push(String(cur));
      break;
    }
  }
  return parts.join(": ") || "unknown error";
}

/** Resolves after `ms`, or at once when `signal` aborts (never rejects). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, Math.max(0, ms));
    signal?.addEventListener("abort", done, { once: true });
  });
}
