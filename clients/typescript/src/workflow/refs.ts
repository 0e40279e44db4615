/**
 * References to values of a run: `wf.input.order.id`, `charge.out.id`. A
 * reference is a jq path with a type; in a definition it becomes the
 * template `"${ .nodes.charge.output.id }"`.
 */

/** Type-only: the type a reference, node or expression stands for (never set at run time). */
export const VALUE: unique symbol = Symbol("composer.value");
/** Where a reference keeps its path (internal). */
export const REF = Symbol.for("composer.ref");

/** A reference's path and the node whose output it reads (if any). */
export interface RefInfo {
  /** The jq path: `.nodes.charge.output.id`. */
  readonly path: string;
  /** The node whose output it reads, when it reads one (`charge`). */
  readonly node?: string | undefined;
}

/**
 * What every reference is: a value of type `T` somewhere in a run. Used in
 * a template string (`` `order-${wf.input.id}` ``) it is `${ .input.id }`.
 */
export interface RefBase<T> {
  /** Type-only: the value's type (never present at run time). */
  readonly [VALUE]: T;
  /** `${ <path> }`. */
  toString(): string;
  toJSON(): string;
}

type Fields<T> = 0 extends 1 & T
  ? any
  : unknown extends T
  ? { readonly [key: string]: Ref<unknown> }
  : [NonNullable<T>] extends [readonly unknown[]]
    ? {}
    : [NonNullable<T>] extends [object]
      ? { readonly [K in keyof NonNullable<T> & string]-?: Ref<NonNullable<T>[K]> }
      : {};

/**
 * A reference to a value of type `T`. A field of an object's reference is
 * the reference of that field: `Ref<{ id: string }>` has `.id: Ref<string>`.
 * A field whose name a reference has itself (`toString`, `toJSON`, `then`)
 * is reached with `at(ref, "then")`, and an array's element with `at(ref, 0)`.
 */
export type Ref<T> = RefBase<T> & Fields<T>;

/** The type a reference stands for: `ValueOf<Ref<string>>` is `string`. */
export type ValueOf<R> = R extends { readonly [VALUE]: infer T } ? T : never;

/** A reference to any value of type `T`: a `Ref<T>`, or a node's handle (its output). */
export type RefLike<T> = { readonly [VALUE]: T };

const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** A jq path step: `.id`, `["a-b"]`, `[0]`. */
export function pathStep(key: string | number): string {
  if (typeof key === "number") return `[${key}]`;
  return IDENT.test(key) ? `.${key}` : `[${JSON.stringify(key)}]`;
}

/** A reference to the value at `path` (reading `node`'s output when set). */
export function ref<T = unknown>(path: string, node?: string): Ref<T> {
  const info: RefInfo = { path, node };
  const text = `\${ ${path} }`;
  const target = Object.create(null) as object;
  return new Proxy(target, {
    get(_t, prop) {
      if (prop === REF) return info;
      if (prop === Symbol.toPrimitive) return () => text;
      if (prop === Symbol.for("nodejs.util.inspect.custom")) return () => `Ref(${path})`;
      if (typeof prop === "symbol") return undefined;
      if (prop === "toString" || prop === "toJSON") return () => text;
      // Not a promise, whatever `await` or a test framework asks.
      if (prop === "then") return undefined;
      return ref(`${path}${pathStep(prop)}`, node);
    },
    has(_t, prop) {
      return prop === REF;
    },
    ownKeys() {
      return [];
    },
    set() {
      throw new TypeError(`a reference (${path}) is read only`);
    },
  }) as Ref<T>;
}

/** The reference's path and node, or undefined for anything else. */
export function refInfo(v: unknown): RefInfo | undefined {
  if ((typeof v === "object" || typeof v === "function") && v !== null) {
    const info = (v as { [REF]?: RefInfo })[REF];
    if (info !== undefined && typeof info === "object" && typeof info.path === "string") return info;
  }
  return undefined;
}

/** The reference at `keys` under `r`: `at(order.items, 0, "sku")` is `.input.items[0].sku`. */
export function at<T = unknown>(r: RefLike<any>, ...keys: Array<string | number>): Ref<T> {
  const info = refInfo(r);
  if (info === undefined) throw new TypeError("at(): not a reference");
  return ref<T>(info.path + keys.map(pathStep).join(""), info.node);
}

/**
 * A jq expression or a template, with the nodes whose outputs it reads. Made
 * by the `jq` and `tpl` tags; in a definition it is its text.
 */
export class Expr<T = unknown> {
  declare readonly [VALUE]: T;
  /** The text as it goes into the definition. */
  readonly text: string;
  /** The nodes whose outputs it reads. */
  readonly nodes: readonly string[];
  /** Whether it is bare jq (`when`, `until`, `reduce`), not a template. */
  readonly bare: boolean;
  constructor(text: string, nodes: readonly string[], bare: boolean) {
    this.text = text;
    this.nodes = nodes;
    this.bare = bare;
  }
  /** Always the template (`${ jq }` for bare jq), as a config value. */
  toString(): string {
    return this.bare ? `\${ ${this.text} }` : this.text;
  }
  toJSON(): string {
    return this.toString();
  }
}

function isExpr(v: unknown): v is Expr<unknown> {
  return v instanceof Expr;
}

function nodesOf(values: readonly unknown[]): string[] {
  const out: string[] = [];
  for (const v of values) {
    const info = refInfo(v);
    if (info?.node !== undefined) out.push(info.node);
    if (isExpr(v)) out.push(...v.nodes);
  }
  return out;
}

/**
 * A jq expression (for `when`, `until`, `reduce`, or as a config value,
 * where it becomes `${ jq }`): references are put in as their paths.
 *
 * ```ts
 * jq`${start.out.big} | not`          // .nodes.start.output.big | not
 * jq`[${wf.input.items}[].price] | add`
 * ```
 */
export function jq<T = unknown>(strings: TemplateStringsArray, ...values: unknown[]): Expr<T> {
  let text = strings[0] ?? "";
  values.forEach((v, i) => {
    const info = refInfo(v);
    const part = info !== undefined ? info.path : isExpr(v) ? (v.bare ? `(${v.text})` : JSON.stringify(v.text)) : String(v);
    text += part + (strings[i + 1] ?? "");
  });
  return new Expr<T>(text, nodesOf(values), true);
}

/**
 * A template string (text with `${ jq }` parts): references are put in as
 * `${ path }`, and `jq` expressions as `${ jq }`, keeping which nodes it reads.
 *
 * ```ts
 * tpl`${wf.input.target}/pay/charge`  // "${ .input.target }/pay/charge"
 * ```
 */
export function tpl(strings: TemplateStringsArray, ...values: unknown[]): Expr<string> {
  let text = strings[0] ?? "";
  values.forEach((v, i) => {
    text += String(v) + (strings[i + 1] ?? "");
  });
  return new Expr<string>(text, nodesOf(values), false);
}

/** The value with every reference and expression made its text (a definition's JSON). */
export function toJson(v: unknown): unknown {
  if (refInfo(v) !== undefined) return String(v);
  if (isExpr(v)) return v.toString();
  if (Array.isArray(v)) return v.map(toJson);
  if (typeof v === "object" && v !== null) {
    const out: Record<string, unknown> = {};
    for (const [k, x] of Object.entries(v)) if (x !== undefined) out[k] = toJson(x);
    return out;
  }
  return v;
}

/** The nodes whose outputs anything in `v` reads, in order of appearance. */
export function readsOf(v: unknown, into: string[] = []): string[] {
  const info = refInfo(v);
  if (info !== undefined) {
    if (info.node !== undefined) into.push(info.node);
    return into;
  }
  if (isExpr(v)) {
    into.push(...v.nodes);
    return into;
  }
  if (Array.isArray(v)) for (const x of v) readsOf(x, into);
  else if (typeof v === "object" && v !== null) for (const x of Object.values(v)) readsOf(x, into);
  return into;
}

/** A step's error, as `.nodes.X.error` holds it. */
export interface NodeError {
  message: string;
  code: string;
  status?: number;
  retryable?: boolean;
}

/** A node's state, as `.nodes.X.state` holds it. */
export type NodeState = "PENDING" | "RUNNING" | "COMPLETED" | "FAILED" | "SKIPPED" | "CANCELLED" | "IN_DOUBT";

/** The run, as `.run` holds it in expressions. */
export interface RunInfo {
  id: string;
  workflow: string;
  version: number;
}

/** A failed run, as a failure handler's `input` sees it (`.failed_run`). */
export interface FailedRun {
  id: string;
  workflow: string;
  status: string;
  error: string | null;
  nodes: { [node: string]: { state: NodeState; output?: unknown; error?: NodeError } };
}

/** An event, as a trigger's `when`, `input` and `idempotency_key` see it (`.event`). */
export interface EventInfo<P = unknown> {
  id: string;
  name: string;
  key: string;
  payload: P;
}

/** References to what expressions see besides `.input` and `.nodes`. */
export const refs = {
  /** `.run`: the run's id, workflow and version. */
  run: ref<RunInfo>(".run"),
  /** `.item`: a MAP item (the `node` of `map` gets it typed). */
  item: <T = unknown>() => ref<T>(".item"),
  /** `.index`: a MAP item's index. */
  index: ref<number>(".index"),
  /** `.iteration`: a LOOP's iteration (`index`; in `until`, `output` too). */
  iteration: <T = unknown>() => ref<{ index: number; output: T }>(".iteration"),
  /** `.previous`: a LOOP's last iteration's output (null in the first). */
  previous: <T = unknown>() => ref<T | null>(".previous"),
  /** `.event`: in a trigger. */
  event: <P = unknown>() => ref<EventInfo<P>>(".event"),
  /** `.failed_run`: in a failure handler's input. */
  failedRun: ref<FailedRun>(".failed_run"),
  /** `.secrets.NAME`: resolved by the worker that runs the step, never by the coordinator. */
  secret: (name: string) => ref<string>(`.secrets${pathStep(name)}`),
  /** `.input`, untyped. */
  input: <T = unknown>() => ref<T>(".input"),
};
