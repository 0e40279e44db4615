/**
 * A small runtime schema library: each schema is a TypeScript type
 * (`Infer<typeof S>`), a JSON Schema (2020-12, `S.jsonSchema()`) and a
 * check of a value (`S.check(v)`, `S.parse(v)`).
 *
 * ```ts
 * const Order = s.object({ id: s.string(), amount: s.number({ minimum: 0 }), note: s.optional(s.string()) });
 * type Order = Infer<typeof Order>; // { id: string; amount: number; note?: string }
 * ```
 */

/** A JSON Schema object. */
export type JsonSchema = { [keyword: string]: unknown };

/** What a value breaks: where (a JSON Pointer, `""` for the whole) and why. */
export interface Issue {
  path: string;
  message: string;
}

declare const INFER: unique symbol;
const OPTIONAL = Symbol("composer.optional");

/** A schema of values of type `T`. */
export interface Schema<T> {
  /** Type-only: the type of the values (never present at run time). */
  readonly [INFER]: T;
  /** The JSON Schema (draft 2020-12) of the values. */
  jsonSchema(): JsonSchema;
  /** What `value` breaks; empty when it fits. */
  check(value: unknown, path?: string): Issue[];
  /** `value` as a `T`, or a `TypeError` naming the first thing it breaks. */
  parse(value: unknown): T;
  /** The same schema with a `description`. */
  describe(description: string): Schema<T>;
}

/** A property that may be missing (`s.optional(x)`): only in `s.object`. */
export interface OptionalSchema<T> extends Schema<T | undefined> {
  readonly [OPTIONAL]: true;
  readonly inner: Schema<T>;
}

/** The type of a schema's values: `Infer<typeof Order>`. */
export type Infer<S> = S extends Schema<infer T> ? T : never;

type Simplify<T> = { [K in keyof T]: T[K] } & {};
type RequiredKeys<S> = { [K in keyof S]: S[K] extends OptionalSchema<any> ? never : K }[keyof S];
type OptionalKeys<S> = { [K in keyof S]: S[K] extends OptionalSchema<any> ? K : never }[keyof S];
/** The type `s.object(shape)` describes. */
export type ObjectOf<S extends Record<string, Schema<any>>> = Simplify<
  { [K in RequiredKeys<S>]: Infer<S[K]> } & {
    [K in OptionalKeys<S>]?: S[K] extends OptionalSchema<infer T> ? T : never;
  }
>;

type Primitive = string | number | boolean | null;

function pointer(path: string, key: string | number): string {
  return `${path}/${String(key).replaceAll("~", "~0").replaceAll("/", "~1")}`;
}

function describeValue(v: unknown): string {
  if (v === null) return "null";
  if (Array.isArray(v)) return "an array";
  if (typeof v === "number" && Number.isInteger(v)) return `the integer ${v}`;
  if (typeof v === "object") return "an object";
  return `${typeof v} ${JSON.stringify(v)}`;
}

function make<T>(json: () => JsonSchema, check: (v: unknown, path: string) => Issue[]): Schema<T> {
  const schema: Schema<T> = {
    jsonSchema: json,
    check: (v, path = "") => check(v, path),
    parse(value: unknown): T {
      const [first] = check(value, "");
      if (first !== undefined) throw new TypeError(`${first.path === "" ? "the value" : first.path}: ${first.message}`);
      return value as T;
    },
    describe: (description) => make<T>(() => ({ ...json(), description }), check),
  } as Schema<T>;
  return schema;
}

export interface StringOptions {
  minLength?: number;
  maxLength?: number;
  /** A regular expression (ECMA 262, as JSON Schema's `pattern`), not anchored. */
  pattern?: string;
  /** An annotation (`date-time`, `email`): not checked. */
  format?: string;
}

export interface NumberOptions {
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  exclusiveMaximum?: number;
  multipleOf?: number;
}

export interface ArrayOptions {
  minItems?: number;
  maxItems?: number;
  uniqueItems?: boolean;
}

export interface ObjectOptions {
  /** Refuse properties the shape does not name (`additionalProperties: false`); they are allowed by default. */
  strict?: boolean;
}

function defined<T extends object>(o: T): Partial<T> {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as Partial<T>;
}

function numberChecks(o: NumberOptions, v: number, path: string): Issue[] {
  const out: Issue[] = [];
  if (o.minimum !== undefined && v < o.minimum) out.push({ path, message: `${v} is less than ${o.minimum}` });
  if (o.maximum !== undefined && v > o.maximum) out.push({ path, message: `${v} is more than ${o.maximum}` });
  if (o.exclusiveMinimum !== undefined && v <= o.exclusiveMinimum) out.push({ path, message: `${v} is not more than ${o.exclusiveMinimum}` });
  if (o.exclusiveMaximum !== undefined && v >= o.exclusiveMaximum) out.push({ path, message: `${v} is not less than ${o.exclusiveMaximum}` });
  if (o.multipleOf !== undefined && !Number.isInteger(v / o.multipleOf)) out.push({ path, message: `${v} is not a multiple of ${o.multipleOf}` });
  return out;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function same(a: unknown, b: unknown): boolean {
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

function canonical(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(canonical);
  if (isObject(v)) return Object.fromEntries(Object.keys(v).sort().map((k) => [k, canonical(v[k])]));
  return v;
}

/** The schema constructors. */
export const s = {
  string(options: StringOptions = {}): Schema<string> {
    const re = options.pattern === undefined ? undefined : new RegExp(options.pattern, "u");
    return make(
      () => ({ type: "string", ...defined(options) }),
      (v, path) => {
        if (typeof v !== "string") return [{ path, message: `expected a string, got ${describeValue(v)}` }];
        const out: Issue[] = [];
        const n = [...v].length;
        if (options.minLength !== undefined && n < options.minLength) out.push({ path, message: `shorter than ${options.minLength}` });
        if (options.maxLength !== undefined && n > options.maxLength) out.push({ path, message: `longer than ${options.maxLength}` });
        if (re !== undefined && !re.test(v)) out.push({ path, message: `does not match ${options.pattern}` });
        return out;
      },
    );
  },

  number(options: NumberOptions = {}): Schema<number> {
    return make(
      () => ({ type: "number", ...defined(options) }),
      (v, path) =>
        typeof v === "number" && Number.isFinite(v)
          ? numberChecks(options, v, path)
          : [{ path, message: `expected a number, got ${describeValue(v)}` }],
    );
  },

  integer(options: NumberOptions = {}): Schema<number> {
    return make(
      () => ({ type: "integer", ...defined(options) }),
      (v, path) =>
        typeof v === "number" && Number.isInteger(v)
          ? numberChecks(options, v, path)
          : [{ path, message: `expected an integer, got ${describeValue(v)}` }],
    );
  },

  boolean(): Schema<boolean> {
    return make(
      () => ({ type: "boolean" }),
      (v, path) => (typeof v === "boolean" ? [] : [{ path, message: `expected a boolean, got ${describeValue(v)}` }]),
    );
  },

  null(): Schema<null> {
    return make(
      () => ({ type: "null" }),
      (v, path) => (v === null ? [] : [{ path, message: `expected null, got ${describeValue(v)}` }]),
    );
  },

  /** Any JSON value. */
  unknown(): Schema<unknown> {
    return make(
      () => ({}),
      () => [],
    );
  },

  literal<const V extends Primitive>(value: V): Schema<V> {
    return make(
      () => ({ const: value }),
      (v, path) => (v === value ? [] : [{ path, message: `expected ${JSON.stringify(value)}, got ${describeValue(v)}` }]),
    );
  },

  enum<const V extends readonly [Primitive, ...Primitive[]]>(values: V): Schema<V[number]> {
    return make(
      () => ({ enum: [...values] }),
      (v, path) =>
        (values as readonly unknown[]).includes(v)
          ? []
          : [{ path, message: `expected one of ${values.map((x) => JSON.stringify(x)).join(", ")}, got ${describeValue(v)}` }],
    );
  },

  array<T>(items: Schema<T>, options: ArrayOptions = {}): Schema<T[]> {
    return make(
      () => ({ type: "array", items: items.jsonSchema(), ...defined(options) }),
      (v, path) => {
        if (!Array.isArray(v)) return [{ path, message: `expected an array, got ${describeValue(v)}` }];
        const out: Issue[] = [];
        if (options.minItems !== undefined && v.length < options.minItems) out.push({ path, message: `fewer than ${options.minItems} items` });
        if (options.maxItems !== undefined && v.length > options.maxItems) out.push({ path, message: `more than ${options.maxItems} items` });
        if (options.uniqueItems && v.some((x, i) => v.findIndex((y) => same(x, y)) !== i)) out.push({ path, message: "items are not unique" });
        v.forEach((x, i) => out.push(...items.check(x, pointer(path, i))));
        return out;
      },
    );
  },

  /** A property that may be missing (in an `s.object` shape). */
  optional<T>(inner: Schema<T>): OptionalSchema<T> {
    const base = make<T | undefined>(
      () => inner.jsonSchema(),
      (v, path) => (v === undefined ? [] : inner.check(v, path)),
    );
    return Object.assign(base, {
      [OPTIONAL]: true as const,
      inner,
      describe: (description: string) => s.optional(inner.describe(description)),
    });
  },

  nullable<T>(inner: Schema<T>): Schema<T | null> {
    return make(
      () => ({ anyOf: [inner.jsonSchema(), { type: "null" }] }),
      (v, path) => (v === null ? [] : inner.check(v, path)),
    );
  },

  union<const S extends readonly [Schema<any>, ...Schema<any>[]]>(...options: S): Schema<Infer<S[number]>> {
    return make(
      () => ({ anyOf: options.map((o) => o.jsonSchema()) }),
      (v, path) => {
        const issues = options.map((o) => o.check(v, path));
        if (issues.some((i) => i.length === 0)) return [];
        return [{ path, message: `fits none of the ${options.length} options (${issues.map((i) => i[0]?.message).join("; ")})` }];
      },
    );
  },

  /** An object of any keys, each value of `values`. */
  record<T>(values: Schema<T>): Schema<Record<string, T>> {
    return make(
      () => ({ type: "object", additionalProperties: values.jsonSchema() }),
      (v, path) => {
        if (!isObject(v)) return [{ path, message: `expected an object, got ${describeValue(v)}` }];
        return Object.entries(v).flatMap(([k, x]) => values.check(x, pointer(path, k)));
      },
    );
  },

  object<const S extends Record<string, Schema<any>>>(shape: S, options: ObjectOptions = {}): Schema<ObjectOf<S>> {
    const isOptional = (x: Schema<any>) => OPTIONAL in x;
    return make(
      () => {
        const properties = Object.fromEntries(Object.entries(shape).map(([k, x]) => [k, x.jsonSchema()]));
        const required = Object.entries(shape)
          .filter(([, x]) => !isOptional(x))
          .map(([k]) => k);
        const out: JsonSchema = { type: "object", properties };
        if (required.length > 0) out["required"] = required;
        if (options.strict) out["additionalProperties"] = false;
        return out;
      },
      (v, path) => {
        if (!isObject(v)) return [{ path, message: `expected an object, got ${describeValue(v)}` }];
        const out: Issue[] = [];
        for (const [k, x] of Object.entries(shape)) {
          if (!(k in v)) {
            if (!isOptional(x)) out.push({ path: pointer(path, k), message: "is required" });
            continue;
          }
          out.push(...x.check(v[k], pointer(path, k)));
        }
        if (options.strict) {
          for (const k of Object.keys(v)) if (!(k in shape)) out.push({ path: pointer(path, k), message: "is not allowed" });
        }
        return out;
      },
    );
  },
};
