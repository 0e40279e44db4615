/**
 * Secret references in a task's input, by the rules of the Python worker
 * (`clients/python/composer_client/worker.py`, `_resolve` and `_scrub`):
 *
 * - in every string that holds `${`, `${ .secrets.NAME }` (NAME
 *   `[A-Za-z_][A-Za-z0-9_]*`, blanks around it allowed) becomes the value of
 *   the environment variable `COMPOSER_SECRET_NAME`; `$${` becomes the text
 *   `${`; an unset variable fails the attempt for good;
 * - object keys are not resolved, only unescaped (`$${` to `${`);
 * - the values used are replaced by `[secret]` in the output and the error
 *   (keys too), except values shorter than 3 characters.
 */

import { TaskError } from "./task-error.js";
import type { JsonValue } from "./types.js";

/** Python's `\s` (a `str` pattern), spelled out: JavaScript's differs. */
const BLANK = "[\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]";
const SECRET = new RegExp(`\\$\\$\\{|\\$\\{${BLANK}*\\.secrets\\.([A-Za-z_][A-Za-z0-9_]*)${BLANK}*\\}`, "g");

/** What replaces a secret's value. */
export const REDACTED = "[secret]";

type Env = Record<string, string | undefined>;

/**
 * `value` with its secret references resolved from `env`; each value used
 * is added to `used` (once). Throws a non-retryable `TaskError` naming an
 * unset secret.
 */
export function resolveSecrets(value: JsonValue, used: string[], env: Env = process.env): JsonValue {
  if (typeof value === "string") {
    if (!value.includes("${")) return value;
    return value.replace(SECRET, (whole: string, name: string | undefined) => {
      if (whole === "$${" || name === undefined) return "${";
      const secret = env[`COMPOSER_SECRET_${name}`];
      if (secret === undefined) {
        throw new TaskError(`unknown secret ${name}: set COMPOSER_SECRET_${name} in the worker's environment`, {
          retryable: false,
        });
      }
      if (!used.includes(secret)) used.push(secret);
      return secret;
    });
  }
  if (Array.isArray(value)) return value.map((v) => resolveSecrets(v, used, env));
  if (value !== null && typeof value === "object") {
    const out: { [key: string]: JsonValue } = {};
    for (const [k, v] of Object.entries(value)) set(out, k.replaceAll("$${", () => "${"), resolveSecrets(v, used, env));
    return out;
  }
  return value;
}

/** `value` with every secret of `secrets` (3 characters or more) replaced by `[secret]`, in keys too. */
export function scrubSecrets<T extends JsonValue>(value: T, secrets: readonly string[]): T;
export function scrubSecrets(value: JsonValue, secrets: readonly string[]): JsonValue {
  const long = secrets.filter((s) => [...s].length >= 3);
  if (long.length === 0) return value;
  return scrub(value, long);
}

function scrub(value: JsonValue, secrets: readonly string[]): JsonValue {
  if (typeof value === "string") {
    let s = value;
    for (const secret of secrets) s = s.replaceAll(secret, () => REDACTED);
    return s;
  }
  if (Array.isArray(value)) return value.map((v) => scrub(v, secrets));
  if (value !== null && typeof value === "object") {
    const out: { [key: string]: JsonValue } = {};
    for (const [k, v] of Object.entries(value)) set(out, scrub(k, secrets) as string, scrub(v, secrets));
    return out;
  }
  return value;
}

/** `out[key] = value`, a `__proto__` key included (as JSON.parse makes it). */
function set(out: { [key: string]: JsonValue }, key: string, value: JsonValue): void {
  if (key === "__proto__") {
    Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
  } else {
    out[key] = value;
  }
}
