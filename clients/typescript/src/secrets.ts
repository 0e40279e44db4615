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
 *   (keys too), in any letter case, URL-encoded or JSON-escaped in whole or
 *   in part, or in base64; a value shorter than 4 characters only as it is.
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

/**
 * Secrets shorter than this (in characters) are found only as they are:
 * every encoding of a three-letter value would match ordinary text.
 */
const MIN_ENCODED_CHARS = 4;

/** A character that matches `c` in either letter case. */
function anyCase(c: string): string {
  const forms = new Set([c, c.toLowerCase(), c.toUpperCase()].filter((f) => [...f].length === 1));
  return forms.size === 1 ? escape(c) : `[${[...forms].map(escape).join("")}]`;
}

function escape(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
}

/** Text matched in any letter case, character by character. */
function folded(s: string): string {
  return [...s].map(anyCase).join("");
}

/**
 * What one character of a secret may appear as: itself (in any case),
 * URL-encoded (`%E2%82%AC`, `+` for a space) or JSON-escaped (`\u20ac`,
 * `\"`).
 */
function charForms(c: string): string {
  const bytes = new TextEncoder().encode(c);
  const forms = [anyCase(c), folded([...bytes].map((b) => `%${b.toString(16).padStart(2, "0")}`).join(""))];
  if (c === " ") forms.push("\\+");
  const units = Array.from({ length: c.length }, (_, i) => c.charCodeAt(i));
  forms.push(folded(units.map((u) => `\\u${u.toString(16).padStart(4, "0")}`).join("")));
  if (c === '"' || c === "\\" || c === "/") forms.push(escape(`\\${c}`));
  return `(?:${forms.join("|")})`;
}

/**
 * The secret in base64, standard and URL-safe, in any letter case of the
 * secret, at each of the three alignments it can have inside a longer
 * encoded text (as in `Basic base64(user:password)`): the characters that
 * carry only its bits.
 */
function base64Forms(secret: string): Set<string> {
  const found = new Set<string>();
  for (const kase of new Set([secret, secret.toUpperCase(), secret.toLowerCase()])) {
    const data = new TextEncoder().encode(kase);
    for (let offset = 0; offset < 3; offset++) {
      const padded = new Uint8Array(offset + data.length + 2);
      padded.set(data, offset);
      const encoded = Buffer.from(padded).toString("base64");
      const text = encoded.slice(Math.ceil((8 * offset) / 6), Math.floor((8 * (offset + data.length)) / 6));
      for (const form of [text, text.replaceAll("+", "-").replaceAll("/", "_")]) {
        if (form.length >= MIN_ENCODED_CHARS) found.add(form);
      }
    }
  }
  return found;
}

const byLengthDown = (a: string, b: string): number => [...b].length - [...a].length;

/** One pattern that finds every secret of `secrets`, as `scrubSecrets` says. */
function scrubber(secrets: readonly string[]): RegExp | undefined {
  const parts: string[] = [];
  for (const secret of [...new Set(secrets.filter((s) => s !== ""))].sort(byLengthDown)) {
    if ([...secret].length < MIN_ENCODED_CHARS) {
      parts.push(escape(secret));
      continue;
    }
    parts.push(`(?:${[...secret].map(charForms).join("")})`);
    for (const form of [...base64Forms(secret)].sort(byLengthDown)) parts.push(escape(form));
  }
  return parts.length === 0 ? undefined : new RegExp(parts.join("|"), "gu");
}

/**
 * `value` with every secret of `secrets` replaced by `[secret]`, in keys
 * too: in any letter case, URL-encoded or JSON-escaped in whole or in part,
 * or in base64; a secret shorter than 4 characters only as it is.
 */
export function scrubSecrets<T extends JsonValue>(value: T, secrets: readonly string[]): T;
export function scrubSecrets(value: JsonValue, secrets: readonly string[]): JsonValue {
  const pattern = scrubber(secrets);
  return pattern === undefined ? value : scrub(value, pattern);
}

function scrub(value: JsonValue, pattern: RegExp): JsonValue {
  if (typeof value === "string") return value.replace(pattern, () => REDACTED);
  if (Array.isArray(value)) return value.map((v) => scrub(v, pattern));
  if (value !== null && typeof value === "object") {
    const out: { [key: string]: JsonValue } = {};
    for (const [k, v] of Object.entries(value)) set(out, scrub(k, pattern) as string, scrub(v, pattern));
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
