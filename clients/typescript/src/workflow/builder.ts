/**
 * Workflows in code: a builder whose `definition()` is the JSON definition
 * the server takes, and whose typed steps' handlers a worker runs.
 */

import { TaskError } from "../task-error.js";
import type { BatchSpec, DebounceSpec, JsonObject, ThrottleSpec, UpdateDefinition, WorkflowDefinition } from "../types.js";
import type { WorkerTask } from "../worker.js";
import {
  Expr,
  REF,
  VALUE,
  readsOf,
  ref,
  refInfo,
  toJson,
  type NodeError,
  type NodeState,
  type Ref,
  type RefInfo,
  type RefLike,
  type ValueOf,
} from "./refs.js";
import type { JsonSchema, Schema } from "./schema.js";


/** A value that may be, or hold, references and expressions: evaluated when the node starts. */
export type Template<T = unknown> = T | RefLike<unknown> | Expr<unknown>;

/** Any value of a template (a JSON value that may hold references and expressions). */
export type TemplateValue = string | number | boolean | null | readonly unknown[] | { readonly [key: string]: unknown };

/** A jq condition: text, or a `jq` expression. */
export type Condition = string | Expr<unknown>;

/** Which end of its source an edge follows. */
export type EdgeOn = "success" | "failure" | "always";

/** A node's retry policy, as the language writes it. */
export interface RetrySpec {
  /** Attempts in all, the first included (1 to 1000; 3 by default). */
  max_attempts?: number;
  initial_backoff?: string;
  multiplier?: number;
  max_backoff?: string;
  on_429?: "respect" | "ignore";
}

/** One of a node's `limits`. */
export interface LimitSpec {
  key: Template<string>;
  rate?: string;
  burst?: number;
  concurrency?: number;
}

/** What a node comes after: a node (its success), or an edge from one. */
export type After =
  | AnyNode
  | string
  | { node: AnyNode | string; on?: EdgeOn | undefined; when?: Condition | undefined };

/** What every node kind takes besides its config. */
export interface NodeOptions {
  /** Edges into the node, besides those from the nodes whose output it reads. */
  after?: After | readonly After[] | undefined;
  retry?: RetrySpec | undefined;
  /** How long one attempt may take (`"30s"`): HTTP, custom types, SUB_WORKFLOW. */
  timeout?: string | undefined;
  /** The queue of a dispatched node (default: its type in lower case). */
  queue?: string | undefined;
  delivery?: "at_least_once" | "at_most_once" | undefined;
  /** At most 4 (HTTP and custom types). */
  limits?: readonly LimitSpec[] | undefined;
  /** Runs started when the step has not ended `after` it was created (at most 8; not on a MAP's item). */
  deadlines?: readonly Deadline[] | undefined;
  /** The updates a WAIT_FOR_EVENT step accepts while it waits (at most 8): `Client.updateRun` sends one. */
  updates?: readonly UpdateDefinition[] | undefined;
}

/** A run's or a step's deadline: the run it starts when `after` passes with the run (or step) not ended. */
export interface Deadline {
  after: string;
  start: {
    workflow: WorkflowRef;
    version?: number;
    /** A template over `{run, step, deadline, input}`. */
    input?: unknown;
  };
}

/** A deadline as the definition writes it. */
function deadlineJson(d: Deadline): Record<string, unknown> {
  const { workflow, ...rest } = d.start;
  return { after: d.after, start: { workflow: typeof workflow === "string" ? workflow : workflow.name, ...rest } };
}

/** A typed step's handler: the values it reads, and the task. */
export type StepHandler<I, O> = (input: I, task: WorkerTask<I>) => O | Promise<O>;

/** A handler a worker runs, with what it needs to check it. */
export interface StepRegistration {
  readonly handler: StepHandler<any, unknown>;
  readonly output?: Schema<unknown> | undefined;
  readonly input?: Schema<unknown> | undefined;
}

/**
 * A node without its id: what `wf.add(id, spec)` adds, or a MAP's `node`.
 * Made by `http()`, `transform()`, `step()`... or `wf.http(id, ...)`.
 */
export interface Spec<O = unknown> {
  readonly [VALUE]?: O;
  readonly type: string | undefined;
  readonly config?: unknown;
  readonly options: NodeOptions;
  /** A typed step's handler (its type is set when it is added). */
  readonly step?: StepRegistration | undefined;
  /** A MAP's item node. */
  readonly item?: Spec<unknown> | undefined;
}

/** A node of a workflow: `.out` is its output, `.error` its error, `.state` its state. As a reference it is its output. */
export class Node<O = unknown> {
  declare readonly [VALUE]: O;
  readonly id: string;
  readonly type: string;
  /** `.nodes.<id>.output`. */
  readonly out: Ref<O>;
  /** `.nodes.<id>.error`: `{message, code, status?}` once it failed. */
  readonly error: Ref<NodeError>;
  /** `.nodes.<id>.state`. */
  readonly state: Ref<NodeState>;
  constructor(id: string, type: string) {
    this.id = id;
    this.type = type;
    this.out = ref<O>(`.nodes${seg(id)}.output`, id);
    this.error = ref<NodeError>(`.nodes${seg(id)}.error`);
    this.state = ref<NodeState>(`.nodes${seg(id)}.state`);
  }
  /** As a reference: the node's output. */
  get [REF](): RefInfo {
    return { path: `.nodes${seg(this.id)}.output`, node: this.id };
  }
  toString(): string {
    return String(this.out);
  }
  toJSON(): string {
    return String(this.out);
  }
}

/** Any node's handle (as `after` and `edge` take it). */
export interface AnyNode {
  readonly id: string;
  readonly type: string;
}

function seg(id: string): string {
  return /^[A-Za-z_][A-Za-z0-9_]*$/.test(id) ? `.${id}` : `[${JSON.stringify(id)}]`;
}

/** What a template stands for once evaluated: references become their values. */
export type Resolved<V> =
  V extends RefLike<infer T>
    ? T
    : V extends Expr<infer T>
      ? T
      : V extends readonly unknown[]
        ? { -readonly [K in keyof V]: Resolved<V[K]> }
        : V extends object
          ? { -readonly [K in keyof V]: Resolved<V[K]> }
          : V;

/** The values a step's reads stand for: `{order: wf.input}` is `{order: Order}`. */
export type ReadValues<R> = { -readonly [K in keyof R]: R[K] extends RefLike<infer T> ? T : never };

/** A step's reads, each a reference (`wf.input`, a node, `charge.out.id`). */
export type Reads = { readonly [name: string]: RefLike<any> };

interface StepBase extends NodeOptions {
  /** The node's type (default `<workflow>.<id>`): the worker registers the handler under it. */
  type?: string | undefined;
}

/** A typed step whose input type comes from its reads. */
export interface StepOptions<R extends Reads, O> extends StepBase {
  reads: R;
  /** The output's schema: checked on each result (a mismatch fails the attempt for good). */
  output?: Schema<O> | undefined;
  handler: StepHandler<ReadValues<R>, O>;
}

/**
 * A step's declared input (`input: s.object({...})`): what its reads give
 * must be of that type (tsc refuses the step otherwise, naming both), and
 * the worker checks each task's input against it.
 */
export type DeclaredInput<R, I> = {
  input?:
    | (Schema<I> &
        ([ReadValues<R>] extends [I]
          ? unknown
          : { readonly "the reads do not give the declared input; they give": { [K in keyof R]: ValueOf<R[K]> } }))
    | undefined;
};

function asArray<T>(v: T | readonly T[] | undefined): readonly T[] {
  if (v === undefined) return [];
  return Array.isArray(v) ? (v as readonly T[]) : [v as T];
}

function spec<O>(type: string | undefined, config: unknown, options: NodeOptions = {}, extra: Partial<Spec> = {}): Spec<O> {
  return { type, config, options, ...extra } as Spec<O>;
}

// -- node kinds, without ids (a MAP's `node`, or `wf.add(id, spec)`) ---------

/** An HTTP call's config. */
export interface HttpConfig {
  url: Template<string>;
  method?: Template<"GET" | "POST" | "PUT" | "PATCH" | "DELETE" | "HEAD" | "OPTIONS">;
  headers?: Template<Record<string, Template<string>>>;
  body?: unknown;
  /** The request's own timeout (30s by default). */
  timeout?: Template<string>;
  accept?: number[];
  retry_statuses?: number[];
  idempotency_key?: Template<string>;
  follow_redirects?: Template<boolean>;
}

/** An HTTP node's output; `B` is the body's type. */
export interface HttpOutput<B = unknown> {
  status: number;
  headers: Record<string, string>;
  body: B;
}

export function http<B = unknown>(config: HttpConfig, options?: NodeOptions): Spec<HttpOutput<B>> {
  return spec("HTTP", config, options);
}

/** A TRANSFORM: its output is `output` evaluated. */
export function transform<V>(output: V, options?: NodeOptions): Spec<Resolved<V>> {
  return spec("TRANSFORM", { output }, options);
}

export type WaitConfig = { duration: string } | { until: Template<string | number> };

export function wait(config: WaitConfig, options?: NodeOptions): Spec<Record<string, never>> {
  return spec("WAIT", config, options);
}

export interface WaitForEventConfig {
  event: string;
  key: Template<string | number>;
  timeout?: string;
  default_output?: unknown;
}

/** Waits for the event `(event, key)`; its output is the event's payload `P`. */
export function waitForEvent<P = unknown>(config: WaitForEventConfig, options?: NodeOptions): Spec<P> {
  return spec("WAIT_FOR_EVENT", config, options);
}

/** A workflow, or its name. */
export type WorkflowRef<I = any, O = unknown> = string | WorkflowBuilder<I, O>;
type OutputOf<W> = W extends WorkflowBuilder<any, infer O> ? O : unknown;

export interface SubWorkflowConfig<W extends WorkflowRef> {
  workflow: W;
  version?: number;
  input?: unknown;
  on_parent_close?: "cancel" | "abandon";
}

/** A child run of `workflow`; its output is the child's. */
export function subWorkflow<W extends WorkflowRef, O = OutputOf<W>>(config: SubWorkflowConfig<W>, options?: NodeOptions): Spec<O> {
  const { workflow, ...rest } = config;
  return spec("SUB_WORKFLOW", { workflow: typeof workflow === "string" ? workflow : workflow.name, ...rest }, options);
}

export interface LoopConfig<W extends WorkflowRef, O> {
  workflow: W;
  version?: number;
  /** An iteration's input; a function gets `.iteration` and `.previous` (the last output). */
  input?: ((iteration: Ref<{ index: number }>, previous: Ref<O | null>) => unknown) | TemplateValue;
  /** jq over `{input, iteration: {index, output}}`; a function gets `.iteration`. */
  until: Condition | ((iteration: Ref<{ index: number; output: O }>) => Condition);
  max_iterations: number;
  delay?: string;
  on_parent_close?: "cancel" | "abandon";
}

/** A LOOP's output: the last iteration's and how many ran. */
export interface LoopOutput<O> {
  output: O;
  iterations: number;
}

/** A child run of `workflow` per iteration until `until` holds. */
export function loop<W extends WorkflowRef, O = OutputOf<W>>(config: LoopConfig<W, O>, options?: NodeOptions): Spec<LoopOutput<O>> {
  const { workflow, input, until, ...rest } = config;
  const iteration = ref<{ index: number; output: O }>(".iteration");
  return spec(
    "LOOP",
    {
      workflow: typeof workflow === "string" ? workflow : workflow.name,
      ...(input === undefined ? {} : { input: typeof input === "function" ? input(iteration, ref<O | null>(".previous")) : input }),
      until: condition(typeof until === "function" ? until(iteration) : until),
      ...rest,
    },
    options,
  );
}

export interface MapConfig<T, O> {
  /** A list, or a reference or expression yielding one. */
  items: readonly T[] | RefLike<readonly T[]> | RefLike<T[]> | Expr<unknown> | string;
  /** The node each item runs; a function gets `.item` and `.index`. */
  node: Spec<O> | ((item: Ref<T>, index: Ref<number>) => Spec<O>);
  max_concurrency?: number;
  on_item_failure?: "fail" | "continue";
  tolerated_failures?: number | string;
  collect?: "all" | "none" | { reduce: Condition; init?: unknown };
}

/** Runs `node` once per item. Its output (with `collect: "all"`) is the items' outputs. */
export function map<T, O, R = O[]>(config: MapConfig<T, O>, options?: NodeOptions): Spec<R> {
  const { node, collect, ...rest } = config;
  const item = typeof node === "function" ? node(ref<T>(".item"), ref<number>(".index")) : node;
  if (item.options.after !== undefined) throw new TypeError("a MAP's node has no edges: give `after` to the MAP");
  const c = typeof collect === "object" ? { ...collect, reduce: condition(collect.reduce) } : collect;
  return spec("MAP", { ...rest, ...(c === undefined ? {} : { collect: c }) }, options, { item });
}

export interface FailConfig {
  message?: Template<string>;
  code?: string;
}

/** Ends the run FAILED with `message`. */
export function fail(config: FailConfig = {}, options?: NodeOptions): Spec<never> {
  return spec("FAIL", config, options);
}

/** A node of your own type, run by a worker that handles `type` (elsewhere); `O` is its output. */
export function task<O = unknown>(type: string, config?: unknown, options?: NodeOptions): Spec<O> {
  return spec(type, config, options);
}

/** A typed step: a node of its own type whose handler this process's worker runs. */
export function step<R extends Reads, O, I = ReadValues<R>>(options: StepOptions<R, O> & DeclaredInput<R, I>): Spec<O>;
export function step(options: StepOptions<Reads, unknown> & { input?: unknown }): Spec<unknown> {
  const { reads, output, handler, type, input, ...nodeOptions } = options as StepOptions<Reads, unknown> & { input?: Schema<unknown> };
  if (typeof handler !== "function") throw new TypeError("step(): handler is not a function");
  for (const [k, v] of Object.entries(reads)) {
    if (refInfo(v) === undefined) throw new TypeError(`step(): reads.${k} is not a reference (wf.input, a node, or a field of one)`);
  }
  return spec(type, { ...reads }, nodeOptions, { step: { handler, output, input } });
}

function condition(c: Condition): string {
  return typeof c === "string" ? c : c.text;
}

// -- the workflow ------------------------------------------------------------

/** A definition's `on_failure`. */
export interface OnFailure {
  workflow: WorkflowRef;
  version?: number;
  /** A template over `{failed_run, input}` (`refs.failedRun`). */
  input?: unknown;
  on?: Array<"FAILED" | "CANCELLED">;
}

/** A definition's `on_success` or `on_end`. */
export interface Hook {
  workflow: WorkflowRef;
  version?: number;
  /** A template over `{run, input}`. */
  input?: unknown;
}

/** A definition's trigger. */
export interface Trigger {
  event: string;
  when?: Condition;
  /** A template over `{event}` (`refs.event()`). */
  input?: unknown;
  idempotency_key?: Template<string>;
  /** The key its flow control counts by; the event's key by default. */
  key?: Template<string>;
  /** One run per burst of a key's events, `period` after its last (or at its first, `leading`). */
  debounce?: DebounceSpec;
  /** One run per `max_size` events of a key, or `max_wait` after the first: its input is their list. */
  batch?: BatchSpec;
  /** At most `count` runs per `period` for a key; the rest queued (the default) or dropped. */
  throttle?: ThrottleSpec;
  /** One running run per key: a new event starts none (`skip`) or cancels it (`cancel`). */
  singleton?: "skip" | "cancel";
}

/** A workflow's settings: camelCase here, the language's names in the definition. */
export interface WorkflowOptions<I = unknown> {
  /** The run's input's schema: the definition's `input_schema`, and `wf.input`'s type. */
  input?: Schema<I> | undefined;
  description?: string | undefined;
  /** How long a run may take (`"1h"`). */
  timeout?: string | undefined;
  /** The run's output (a template over `{input, nodes, run}`); `wf.returns(...)` types it. */
  output?: unknown;
  concurrency?: { max: number; key?: Template<string> | undefined } | undefined;
  onFailure?: OnFailure | undefined;
  /** The run a run's SUCCEEDED end starts. */
  onSuccess?: Hook | undefined;
  /** The run a run's every end (SUCCEEDED, FAILED, CANCELLED) starts. */
  onEnd?: Hook | undefined;
  /** Runs started when a run has not ended `after` its start (at most 8). */
  deadlines?: readonly Deadline[] | undefined;
  tags?: Record<string, Template<string | number | boolean>> | undefined;
  triggers?: Trigger[] | undefined;
  /** 1 (served first) to 5 (last). */
  priority?: number | undefined;
  fairnessKey?: Template<string> | undefined;
  /** The queue of the typed steps that name none (not in the definition as such: each step gets `queue`). */
  queue?: string | undefined;
}

/** A typed step's handler as a worker registers it: its type and queue. */
export interface WorkflowHandler {
  readonly workflow: string;
  readonly node: string;
  readonly type: string;
  readonly queue: string;
  readonly registration: StepRegistration;
}

interface Added {
  id: string;
  type: string;
  spec: Spec<unknown>;
  /** The item node's type, for a MAP. */
  itemType?: string | undefined;
}

interface EdgeSpec {
  from: string;
  to: string;
  on?: EdgeOn | undefined;
  when?: Condition | undefined;
}

const NAME = /^(\.{0,2}[A-Za-z0-9_-]|\.{3})[A-Za-z0-9_.-]*$/;

function checkName(what: string, name: string): void {
  if (typeof name !== "string" || name.length < 1 || name.length > 128 || !NAME.test(name)) {
    throw new TypeError(`${what} ${JSON.stringify(name)}: expected 1 to 128 of A-Z a-z 0-9 _ . -, not . or ..`);
  }
}

/**
 * A workflow being built: `wf.input` is the run's input, each method adds a
 * node and answers its handle, `definition()` is the JSON definition.
 */
export class WorkflowBuilder<I = unknown, O = unknown> {
  declare readonly [VALUE]: O;
  readonly name: string;
  /** `.input`: the run's input. */
  readonly input: Ref<I>;
  #options: WorkflowOptions<I>;
  readonly #nodes: Added[] = [];
  readonly #edges: EdgeSpec[] = [];

  constructor(name: string, options: WorkflowOptions<I> = {}) {
    checkName("workflow", name);
    this.name = name;
    this.#options = { ...options };
    this.input = ref<I>(".input");
  }

  /** Changes settings (those that refer to nodes are set once the nodes exist). */
  set(options: Omit<WorkflowOptions<I>, "input">): this {
    this.#options = { ...this.#options, ...options };
    return this;
  }

  /** Sets the run's output, a template over `{input, nodes, run}`, and types it. */
  returns<V>(output: V): WorkflowBuilder<I, Resolved<V>> {
    this.#options.output = output;
    return this as unknown as WorkflowBuilder<I, Resolved<V>>;
  }

  /** Adds a node made by `http()`, `step()`, ... under `id`. */
  add<T>(id: string, s: Spec<T>): Node<T> {
    checkName("node", id);
    if (this.#nodes.some((n) => n.id === id)) throw new TypeError(`workflow ${this.name}: node ${id} is already defined`);
    const type = s.type ?? this.#stepType(id);
    checkName(`node ${id}: type`, type);
    let itemType: string | undefined;
    if (s.item !== undefined) {
      if (s.item.item !== undefined) throw new TypeError(`node ${id}: a MAP inside a MAP is refused`);
      itemType = s.item.type ?? this.#stepType(id);
      checkName(`node ${id}: item type`, itemType);
    }
    this.#nodes.push({ id, type, spec: s as Spec<unknown>, itemType });
    for (const a of asArray(s.options.after)) this.#edges.push(this.#edge(a, id));
    return new Node<T>(id, type);
  }

  #stepType(id: string): string {
    return `${this.name}.${id}`;
  }

  #edge(a: After, to: string): EdgeSpec {
    if (typeof a === "string") return { from: a, to };
    if (!("node" in a)) return { from: a.id, to };
    const e = a as { node: AnyNode | string; on?: EdgeOn | undefined; when?: Condition | undefined };
    return { from: typeof e.node === "string" ? e.node : e.node.id, to, on: e.on, when: e.when };
  }

  /** An edge from `from` to `to` (`on` and `when` as in the language). */
  edge(from: AnyNode | string, to: AnyNode | string, options: { on?: EdgeOn; when?: Condition } = {}): this {
    this.#edges.push({ from: typeof from === "string" ? from : from.id, to: typeof to === "string" ? to : to.id, ...options });
    return this;
  }

  /**
   * A typed step: `reads` names what it reads (its input is
   * `{name: "${ ref }"}`, with an edge from each node read), `handler` runs
   * in this process's worker (`workerFor`, `serve`), `output` checks and
   * types what it answers.
   */
  step<R extends Reads, T, I = ReadValues<R>>(id: string, options: StepOptions<R, T> & DeclaredInput<R, I>): Node<T>;
  step(id: string, options: StepOptions<Reads, unknown> & { input?: unknown }): Node<unknown> {
    return this.add(id, step(options as StepOptions<Reads, unknown>));
  }

  http<B = unknown>(id: string, config: HttpConfig, options?: NodeOptions): Node<HttpOutput<B>> {
    return this.add(id, http<B>(config, options));
  }
  transform<V>(id: string, output: V, options?: NodeOptions): Node<Resolved<V>> {
    return this.add(id, transform(output, options));
  }
  wait(id: string, config: WaitConfig, options?: NodeOptions): Node<Record<string, never>> {
    return this.add(id, wait(config, options));
  }
  waitForEvent<P = unknown>(id: string, config: WaitForEventConfig, options?: NodeOptions): Node<P> {
    return this.add(id, waitForEvent<P>(config, options));
  }
  subWorkflow<W extends WorkflowRef, T = OutputOf<W>>(id: string, config: SubWorkflowConfig<W>, options?: NodeOptions): Node<T> {
    return this.add(id, subWorkflow<W, T>(config, options));
  }
  loop<W extends WorkflowRef, T = OutputOf<W>>(id: string, config: LoopConfig<W, T>, options?: NodeOptions): Node<LoopOutput<T>> {
    return this.add(id, loop<W, T>(config, options));
  }
  map<T, U, R = U[]>(id: string, config: MapConfig<T, U>, options?: NodeOptions): Node<R> {
    return this.add(id, map<T, U, R>(config, options));
  }
  fail(id: string, config?: FailConfig, options?: NodeOptions): Node<never> {
    return this.add(id, fail(config, options));
  }
  /** A node of your own type whose worker is elsewhere. */
  task<T = unknown>(id: string, type: string, config?: unknown, options?: NodeOptions): Node<T> {
    return this.add(id, task<T>(type, config, options));
  }

  /** The queue a typed step goes to. */
  #queueOf(s: Spec<unknown>): string | undefined {
    return s.options.queue ?? (s.step !== undefined ? this.#options.queue : undefined);
  }

  #nodeJson(s: Spec<unknown>, type: string, itemType?: string): JsonObject {
    const o = s.options;
    const out: Record<string, unknown> = { type };
    const queue = this.#queueOf(s);
    if (queue !== undefined) out["queue"] = queue;
    if (o.timeout !== undefined) out["timeout"] = o.timeout;
    if (o.retry !== undefined) out["retry"] = o.retry;
    if (o.delivery !== undefined) out["delivery"] = o.delivery;
    if (o.limits !== undefined) out["limits"] = o.limits;
    if (o.deadlines !== undefined) out["deadlines"] = o.deadlines.map(deadlineJson);
    if (o.updates !== undefined) out["updates"] = o.updates;
    let config = s.config;
    if (s.item !== undefined && itemType !== undefined) {
      config = { ...(config as object), node: this.#nodeJson(s.item, itemType) };
    }
    if (config !== undefined) out["config"] = config;
    return toJson(out) as JsonObject;
  }

  /** The definition as the server takes it (`POST /v1/workflows`, `composer workflow apply`). */
  definition(): WorkflowDefinition {
    const o = this.#options;
    const def: Record<string, unknown> = { name: this.name };
    if (o.description !== undefined) def["description"] = o.description;
    if (o.input !== undefined) def["input_schema"] = o.input.jsonSchema() satisfies JsonSchema;
    if (o.timeout !== undefined) def["timeout"] = o.timeout;
    if (o.priority !== undefined) def["priority"] = o.priority;
    if (o.fairnessKey !== undefined) def["fairness_key"] = o.fairnessKey;
    if (o.concurrency !== undefined) def["concurrency"] = o.concurrency;
    if (o.tags !== undefined) def["tags"] = o.tags;
    for (const [field, hook] of [
      ["on_failure", o.onFailure],
      ["on_success", o.onSuccess],
      ["on_end", o.onEnd],
    ] as const) {
      if (hook === undefined) continue;
      const { workflow, ...rest } = hook;
      def[field] = { workflow: typeof workflow === "string" ? workflow : workflow.name, ...rest };
    }
    if (o.deadlines !== undefined) def["deadlines"] = o.deadlines.map(deadlineJson);
    if (o.triggers !== undefined) {
      def["triggers"] = o.triggers.map((t) => ({ ...t, ...(t.when === undefined ? {} : { when: condition(t.when) }) }));
    }
    if (this.#nodes.length === 0) throw new TypeError(`workflow ${this.name}: no nodes`);
    def["nodes"] = this.#nodes.map((n) => ({ id: n.id, ...this.#nodeJson(n.spec, n.type, n.itemType) }));
    const edges = this.#allEdges();
    if (edges.length > 0) {
      def["edges"] = edges.map((e) => ({
        from: e.from,
        to: e.to,
        ...(e.on === undefined ? {} : { on: e.on }),
        ...(e.when === undefined ? {} : { when: condition(e.when) }),
      }));
    }
    if (o.output !== undefined) def["output"] = o.output;
    return toJson(def) as WorkflowDefinition;
  }

  /**
   * The explicit edges and those from what each node reads, in the order of
   * their sources, then of their targets. A node gets an edge from each node
   * whose output it reads, unless that node already leads to it through
   * unconditional success edges (the edge would change nothing).
   */
  #allEdges(): EdgeSpec[] {
    const ids = new Map(this.#nodes.map((n, i) => [n.id, i]));
    for (const e of this.#edges) {
      for (const end of [e.from, e.to]) {
        if (!ids.has(end)) throw new TypeError(`workflow ${this.name}: an edge names ${end}, which is no node of it`);
      }
    }
    const derived = new Map<string, EdgeSpec[]>();
    const reach = new Map<string, Set<string>>(); // nodes that lead to a node through unconditional success edges
    const visiting = new Set<string>();
    const plain = (e: EdgeSpec) => (e.on === undefined || e.on === "success") && e.when === undefined;
    const reachOf = (id: string): Set<string> => {
      const known = reach.get(id);
      if (known !== undefined) return known;
      if (visiting.has(id)) throw new TypeError(`workflow ${this.name}: the edges make a cycle through ${id}`);
      visiting.add(id);
      const node = this.#nodes[ids.get(id)!]!;
      const explicit = this.#edges.filter((e) => e.to === id);
      const base = new Set<string>();
      for (const e of explicit) if (plain(e)) for (const x of [e.from, ...reachOf(e.from)]) base.add(x);
      const read = [...new Set(readsOf([node.spec.config, node.spec.item?.config, node.spec.item?.options.limits, node.spec.options.limits]))]
        .filter((r) => r !== id && !explicit.some((e) => e.from === r));
      for (const r of read) if (!ids.has(r)) throw new TypeError(`node ${id} reads node ${r}, which is no node of ${this.name}`);
      const kept = read.filter((r) => !base.has(r) && !read.some((other) => other !== r && reachOf(other).has(r)));
      const all = new Set(base);
      for (const r of kept) for (const x of [r, ...reachOf(r)]) all.add(x);
      derived.set(id, kept.map((from) => ({ from, to: id })));
      visiting.delete(id);
      reach.set(id, all);
      return all;
    };
    for (const n of this.#nodes) reachOf(n.id);
    const edges = [...this.#edges, ...[...derived.values()].flat()];
    const order = (e: EdgeSpec) => [ids.get(e.from)!, ids.get(e.to)!] as const;
    return edges
      .map((e, i) => ({ e, i }))
      .sort((a, b) => {
        const [af, at] = order(a.e);
        const [bf, bt] = order(b.e);
        return af - bf || at - bt || a.i - b.i;
      })
      .map(({ e }) => e);
  }

  /** The typed steps' handlers, with the type and queue each goes to. */
  handlers(): WorkflowHandler[] {
    const out: WorkflowHandler[] = [];
    for (const n of this.#nodes) {
      for (const [s, type] of [[n.spec, n.type], [n.spec.item, n.itemType]] as const) {
        if (s?.step === undefined || type === undefined) continue;
        const queue = this.#queueOf(s) ?? type.replace(/[A-Z]+/g, (l) => l.toLowerCase());
        out.push({ workflow: this.name, node: n.id, type, queue, registration: s.step });
      }
    }
    return out;
  }
}

/**
 * A workflow named `name`. With `input` (a schema) the definition has its
 * `input_schema` and `wf.input` its type; `workflow<T>(name)` types the input
 * without a schema.
 */
export function workflow<I = unknown>(name: string, options: WorkflowOptions<I> = {}): WorkflowBuilder<I> {
  return new WorkflowBuilder<I>(name, options);
}

/**
 * Runs a typed step's handler on a task: the output is checked against the
 * step's `output` schema (a mismatch fails the attempt for good).
 */
export async function runStep(registration: StepRegistration, task: WorkerTask<any>): Promise<unknown> {
  if (registration.input !== undefined) {
    const [bad] = registration.input.check(task.input);
    if (bad !== undefined) {
      throw new TaskError(`the step's input does not match its schema at ${bad.path || "/"}: ${bad.message}`, { retryable: false });
    }
  }
  const output = await registration.handler(task.input, task);
  if (registration.output !== undefined) {
    const [bad] = registration.output.check(output === undefined ? null : output);
    if (bad !== undefined) {
      throw new TaskError(`the handler's output does not match its schema at ${bad.path || "/"}: ${bad.message}`, { retryable: false });
    }
  }
  return output;
}
