import { hostname } from "node:os";

import { ComposerError } from "./errors.js";
import { call, segment, sleep, transport, type Fetch, type Transport } from "./http.js";
import { resolveSecrets, scrubSecrets } from "./secrets.js";
import { LeaseLostError, TaskError } from "./task-error.js";
import type {
  CompleteTask,
  FailTask,
  JsonValue,
  LeasedTask,
  PollTasks,
  ReportAck,
  StageTimes,
  TakeNext,
  TaskBatch,
  TaskHeartbeat,
} from "./types.js";

/** A task as a handler gets it: its `input` with secret references resolved, and `signal`. */
export interface WorkerTask<I = JsonValue> {
  readonly id: string;
  readonly run_id: string;
  readonly attempt: number;
  readonly node_id: string;
  readonly node_type: string;
  readonly queue: string;
  /** The node's evaluated config, `${ .secrets.NAME }` resolved. */
  readonly input: I;
  readonly lease_ttl_ms: number;
  /**
   * The W3C trace context of this attempt's span
   * (`00-<trace id>-<span id>-<flags>`): pass it on in what the handler
   * calls (as their `traceparent` header) so that their traces are the
   * run's. Absent from a coordinator that sends none.
   */
  readonly traceparent?: string;
  /**
   * Aborted (with a `LeaseLostError`) when the worker lost the task's lease:
   * another worker has it, or the run was cancelled. Stop: the result is dropped.
   */
  readonly signal: AbortSignal;
}

/**
 * Runs a task: its answer (any JSON value; `undefined` is `null`) is the
 * step's output. Throwing fails the attempt: retried under the node's retry
 * policy, unless it is a `TaskError` with `retryable: false`.
 */
export type Handler<I = JsonValue> = (task: WorkerTask<I>) => unknown;

/**
 * Where the worker writes what happens (default: warnings and errors to the
 * console). No line carries a task's input or a secret's value.
 */
export interface WorkerLogger {
  /**
   * A handler whose type's queue the worker does not poll (at start), a lost
   * lease, a report or heartbeat being retried, a failed poll, a signal, a
   * refused `next` (once).
   */
  warn(message: string): void;
  /** A result no coordinator took, or one it refused. */
  error(message: string): void;
  /** The worker starting and stopping. */
  info?(message: string): void;
  /** Each task starting and ending. */
  debug?(message: string): void;
}

export interface WorkerOptions {
  /** The coordinator's URL: `http://127.0.0.1:8080`. */
  url: string;
  /** `COMPOSER_WORKER_TOKEN` (or the API token when the coordinator has only that). */
  token?: string | undefined;
  /**
   * The namespace whose tasks it works: every call of the task API names it
   * in its `composer-namespace` header. `default`'s when undefined or
   * empty. 1 to 63 lowercase letters, digits and `-`, starting with a
   * letter: another name is a TypeError here.
   */
  namespace?: string | undefined;
  /** Who holds the leases (default `ts-<host>-<pid>`): `[A-Za-z0-9_.-]{1,128}`. */
  workerId?: string | undefined;
  /**
   * The queues to lease tasks from, 1 to 32. By default, those the
   * registered handlers' types go to: a custom node that names no `queue`
   * goes to its type in lower case (`Resize` to `resize`), and the worker
   * polls each such queue once, computed when `run()` starts. With queues
   * given, `run()` warns for each handler whose type's queue is not among
   * them.
   */
  queues?: readonly string[] | undefined;
  /** Most tasks run at once (default 4, at most 10,000). */
  concurrency?: number | undefined;
  /**
   * Slots besides `concurrency` that run only steps of runs of priority 1 or
   * 2, polled for on their own (`priority_at_most: 2`), so such a step does
   * not wait for a backlog's step to end (default 0, at most 10,000).
   */
  urgentSlots?: number | undefined;
  /**
   * How long one poll waits for a task (default 5 s, at most 60 s). A
   * `stop()` lets the poll in flight finish, so this bounds how soon it
   * takes effect.
   */
  pollWaitMs?: number | undefined;
  /** Each call's timeout (default 10 s; a poll gets its wait on top). */
  requestTimeoutMs?: number | undefined;
  logger?: WorkerLogger | undefined;
  /** The fetch to call with (default: the global one). */
  fetch?: Fetch | undefined;
  /** Where `COMPOSER_SECRET_NAME` is read (default `process.env`). */
  env?: Record<string, string | undefined> | undefined;
  /**
   * Eager dispatch (default true): each completion or failure asks for a
   * task it makes ready on this worker's queues, leased in the same commit
   * and run on the slot the finished task frees, without a poll. A
   * coordinator older than it refuses the ask once; then the worker polls
   * only.
   */
  eager?: boolean | undefined;
}

export interface RunOptions {
  /**
   * Stop gracefully on SIGTERM and SIGINT: no new polls, running tasks
   * finish and report, then `run()` resolves. A second signal ends the
   * process at once.
   */
  handleSignals?: boolean | undefined;
}

type Outcome =
  | { kind: "complete"; output: JsonValue }
  | {
      kind: "fail";
      error: string;
      retryable: boolean;
      code?: string | undefined;
      status?: number | undefined;
      retryAfterMs?: number | undefined;
    }
  /** The handler threw a `LeaseLostError`: the result is dropped. */
  | { kind: "lost" };

/** A name the server takes: a worker id, a queue. */
const NAME = /^[A-Za-z0-9_.-]{1,128}$/;
/** Most queues one poll may name (the task API's limit). */
const MAX_QUEUES = 32;

/** A queue name the task API takes: a name, and not `.` or `..` (no URL path can carry those). */
function isQueueName(q: unknown): q is string {
  return typeof q === "string" && NAME.test(q) && q !== "." && q !== "..";
}

/**
 * The queue a node of `nodeType` that names no `queue` goes to: its type in
 * lower case (ASCII letters only, as the coordinator does).
 */
export function defaultQueue(nodeType: string): string {
  return nodeType.replace(/[A-Z]+/g, (letters) => letters.toLowerCase());
}

/** Most tasks one poll may lease. */
const MAX_POLL = 100;
/** Most slots of each kind (the Rust worker's limit too). */
const MAX_SLOTS = 10_000;
/** The least urgent priority an urgent slot takes: those served before the default, 3. */
const URGENT = 2;

/** Slots and the poll that fills them. */
interface Lane {
  readonly size: number;
  running: number;
  /** Only tasks this urgent (the urgent slots); any when undefined. */
  readonly priorityAtMost?: number | undefined;
}
/** Longest error the server takes, in characters. */
const MAX_ERROR_CHARS = 65_536;

const consoleLogger: WorkerLogger = {
  warn: (m) => console.warn(`composer worker: ${m}`),
  error: (m) => console.error(`composer worker: ${m}`),
};

/**
 * Serves node types on queues of a Composer coordinator through the task
 * API (`POST /v1/tasks/poll`, `heartbeat`, `complete`, `fail`): with only the
 * coordinator's URL and the worker token.
 *
 * ```ts
 * const worker = new Worker({ url, token, queues: ["images"], concurrency: 4 })
 *   .handle("resize-image", async (task) => ({ width: task.input.width }));
 * await worker.run({ handleSignals: true });
 * ```
 *
 * Without `queues` it polls the queue each handler's type goes to when its
 * node names no `queue`: the type in lower case (`resize-image` here). With
 * `namespace`, it works that namespace's tasks only.
 */
export class Worker {
  readonly workerId: string;
  readonly concurrency: number;
  readonly urgentSlots: number;
  readonly #t: Transport;
  readonly #pollWaitMs: number;
  readonly #log: WorkerLogger;
  readonly #env: Record<string, string | undefined>;
  readonly #handlers = new Map<string, Handler<any>>();
  /** The queues given; undefined: those of the handlers' types. */
  readonly #queues: readonly string[] | undefined;
  /** The queues polled, fixed when `run()` starts. */
  #polled: readonly string[] = [];
  readonly #inFlight = new Set<Promise<void>>();
  readonly #lanes: readonly Lane[];
  #wakers: Array<() => void> = [];
  #stopping = false;
  #stopped = new AbortController();
  #running: Promise<void> | undefined;
  /** Whether reports ask for the next task: off by option, or for good once the coordinator refused it. */
  #eager: boolean;

  constructor(options: WorkerOptions) {
    this.#t = transport({ ...options, timeoutMs: options.requestTimeoutMs }, 10_000);
    const concurrency = options.concurrency ?? 4;
    if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > MAX_SLOTS) {
      throw new RangeError(`concurrency: expected a whole number from 1 to ${MAX_SLOTS}, got ${concurrency}`);
    }
    this.concurrency = concurrency;
    const urgentSlots = options.urgentSlots ?? 0;
    if (!Number.isInteger(urgentSlots) || urgentSlots < 0 || urgentSlots > MAX_SLOTS) {
      throw new RangeError(`urgentSlots: expected a whole number from 0 to ${MAX_SLOTS}, got ${urgentSlots}`);
    }
    this.urgentSlots = urgentSlots;
    const lanes: Lane[] = [{ size: concurrency, running: 0 }];
    if (urgentSlots > 0) lanes.push({ size: urgentSlots, running: 0, priorityAtMost: URGENT });
    this.#lanes = lanes;
    if (options.queues !== undefined) {
      const queues = [...options.queues];
      if (queues.length < 1 || queues.length > MAX_QUEUES) throw new RangeError(`queues: name 1 to ${MAX_QUEUES} queues`);
      for (const q of queues) {
        if (!isQueueName(q)) {
          throw new TypeError(`queues: ${JSON.stringify(q)} is not a queue name ([A-Za-z0-9_.-]{1,128}, not . or ..)`);
        }
      }
      this.#queues = queues;
    }
    const id = options.workerId ?? `ts-${hostname()}-${process.pid}`.replace(/[^A-Za-z0-9_.-]/g, "-").slice(0, 128);
    if (!NAME.test(id)) throw new TypeError(`workerId: ${JSON.stringify(id)} is not a name ([A-Za-z0-9_.-]{1,128})`);
    this.workerId = id;
    const pollWaitMs = options.pollWaitMs ?? 5_000;
    if (!(pollWaitMs >= 0)) throw new RangeError(`pollWaitMs: expected 0 or more, got ${pollWaitMs}`);
    this.#pollWaitMs = Math.min(Math.floor(pollWaitMs), 60_000);
    this.#log = options.logger ?? consoleLogger;
    this.#env = options.env ?? process.env;
    this.#eager = options.eager ?? true;
  }

  /** The namespace whose tasks it works; undefined: `default`'s. */
  get namespace(): string | undefined {
    return this.#t.namespace;
  }

  /**
   * The queues it polls: those given, else the queue each handler's type
   * goes to by default (the type in lower case), each once.
   */
  get queues(): readonly string[] {
    return this.#queues ?? [...new Set([...this.#handlers.keys()].map(defaultQueue))].sort();
  }

  /**
   * Runs `handler` for tasks of `nodeType`; returns the worker. `I` is the
   * input's type (not checked). A worker given no `queues` polls the type's
   * queue (its name in lower case).
   */
  handle<I = JsonValue>(nodeType: string, handler: Handler<I>): this {
    if (typeof handler !== "function") throw new TypeError(`handle(${JSON.stringify(nodeType)}): not a function`);
    this.#handlers.set(nodeType, handler);
    return this;
  }

  /** How many tasks are running now. */
  get activeTasks(): number {
    return this.#inFlight.size;
  }

  /**
   * Polls and runs tasks until `stop()` (or SIGTERM/SIGINT with
   * `handleSignals`); then resolves once the running tasks have reported.
   */
  run(options: RunOptions = {}): Promise<void> {
    if (this.#running !== undefined) return Promise.reject(new Error("this worker is already running"));
    if (this.#handlers.size === 0) {
      return Promise.reject(new Error("no handlers: call handle(nodeType, handler) first"));
    }
    try {
      this.#polled = this.#queuesToPoll();
    } catch (e) {
      return Promise.reject(e);
    }
    const running = this.#loop(options).finally(() => {
      this.#running = undefined;
      this.#stopping = false;
      this.#stopped = new AbortController();
    });
    this.#running = running;
    return running;
  }

  /**
   * Stops polling: the poll in flight ends (its tasks still run), running
   * tasks finish and report, then `run()` resolves, and so does this.
   */
  stop(): Promise<void> {
    this.#stopping = true;
    this.#stopped.abort();
    this.#wake();
    return this.#running ?? Promise.resolve();
  }

  /**
   * The queues `run()` polls. Derived from the handlers' types, they are
   * checked as the task API takes them (it would refuse every poll
   * otherwise); given, each handler whose type's default queue is not
   * among them is warned of.
   */
  #queuesToPoll(): readonly string[] {
    const types = [...this.#handlers.keys()].sort();
    if (this.#queues === undefined) {
      for (const t of types) {
        if (!isQueueName(defaultQueue(t))) {
          throw new TypeError(
            `handler for type '${t}': not a node type's name ([A-Za-z0-9_.-]{1,128}, not . or ..), ` +
              "so it has no default queue to poll: pass queues",
          );
        }
      }
      const queues = this.queues;
      if (queues.length > MAX_QUEUES) {
        throw new RangeError(`queues: ${queues.length} (one per handler type): a worker may poll at most ${MAX_QUEUES}`);
      }
      return queues;
    }
    const queues = this.#queues;
    for (const t of types) {
      const queue = defaultQueue(t);
      if (!queues.includes(queue)) {
        this.#log.warn(
          `worker ${this.workerId}: handler for type '${t}': a node of this type without a \`queue\` goes to ` +
            `queue '${queue}', which this worker does not poll (it polls ${queues.join(", ")})`,
        );
      }
    }
    return queues;
  }

  async #loop(options: RunOptions): Promise<void> {
    const unlisten = options.handleSignals ? this.#listenForSignals() : () => {};
    this.#log.info?.(
      `worker ${this.workerId} started: serving ${[...this.#handlers.keys()].sort().join(", ")} ` +
        `on queues ${this.#polled.join(", ")} of ${this.#t.base} (namespace ${this.#t.namespace ?? "default"}), ` +
        `${this.concurrency} at once` +
        (this.urgentSlots > 0 ? ` (and ${this.urgentSlots} urgent)` : ""),
    );
    try {
      await Promise.all(this.#lanes.map((lane) => this.#poll(lane)));
      if (this.#inFlight.size > 0) {
        this.#log.info?.(`worker ${this.workerId} stopping: waiting for ${this.#inFlight.size} running tasks to report`);
      }
      while (this.#inFlight.size > 0) await Promise.all([...this.#inFlight]);
    } finally {
      unlisten();
    }
    this.#log.info?.(`worker ${this.workerId} stopped`);
  }

  /** Polls for as many tasks as `lane` has free slots, until stopped. */
  async #poll(lane: Lane): Promise<void> {
    let backoff = 100;
    while (!this.#stopping) {
      await this.#freeSlot(lane);
      if (this.#stopping) break;
      const free = Math.min(lane.size - lane.running, MAX_POLL);
      let tasks: LeasedTask[];
      try {
        const body: PollTasks = {
          worker_id: this.workerId,
          queues: [...this.#polled],
          max: free,
          wait: `${this.#pollWaitMs}ms`,
        };
        if (lane.priorityAtMost !== undefined) body.priority_at_most = lane.priorityAtMost;
        const answer = await call<TaskBatch>(this.#t, "POST", "/v1/tasks/poll", body, {
          timeoutMs: this.#t.timeoutMs + this.#pollWaitMs,
        });
        tasks = answer.body.tasks ?? [];
        backoff = 100;
      } catch (e) {
        this.#log.warn(`worker ${this.workerId}: poll failed (${describe(e)}); retrying`);
        await sleep(backoff * (0.5 + Math.random()), this.#stopped.signal);
        backoff = Math.min(backoff * 2, 5_000);
        continue;
      }
      for (const task of tasks) this.#start(task, lane);
    }
  }

  /** Resolves when `lane` has a free slot, or on stop (a slot of another lane that frees wakes it too). */
  async #freeSlot(lane: Lane): Promise<void> {
    while (!this.#stopping && lane.running >= lane.size) {
      await new Promise<void>((resolve) => this.#wakers.push(resolve));
    }
  }

  #wake(): void {
    const wakers = this.#wakers;
    this.#wakers = [];
    for (const w of wakers) w();
  }

  #listenForSignals(): () => void {
    const signals = ["SIGTERM", "SIGINT"] as const;
    const onSignal = (signal: NodeJS.Signals) => {
      if (this.#stopping) {
        // A second signal: the default action (the process ends).
        unlisten();
        process.kill(process.pid, signal);
        return;
      }
      this.#log.warn(
        `worker ${this.workerId}: ${signal} received; stopping once its ${this.#inFlight.size} running tasks reported`,
      );
      void this.stop();
    };
    const unlisten = () => {
      for (const s of signals) process.off(s, onSignal);
    };
    for (const s of signals) process.on(s, onSignal);
    return unlisten;
  }

  #start(leased: LeasedTask, lane: Lane): void {
    lane.running += 1;
    const done: Promise<void> = this.#occupy(leased, lane).finally(() => {
      this.#inFlight.delete(done);
      lane.running -= 1;
      this.#wake();
    });
    this.#inFlight.add(done);
  }

  /**
   * Runs `leased` on a slot, then on the same slot each task its report
   * took with the answer (eager dispatch), until a report brings none.
   */
  async #occupy(leased: LeasedTask, lane: Lane): Promise<void> {
    let task: LeasedTask | undefined = leased;
    while (task !== undefined) {
      const current: LeasedTask = task;
      const taken = await this.#execute(current, lane).catch((e: unknown): LeasedTask[] => {
        this.#log.error(`task ${current.id}: ${describe(e)}`);
        return [];
      });
      task = taken[0];
      // More than the one asked for (a coordinator that does not keep to
      // `max`): leased to this worker all the same, so each runs now on a slot
      // of its own rather than let its lease lapse.
      for (const extra of taken.slice(1)) this.#start(extra, lane);
    }
  }

  /** Runs a leased task and reports it; answers the tasks the report took with it. */
  async #execute(leased: LeasedTask, lane: Lane): Promise<LeasedTask[]> {
    const lease = new AbortController();
    const finished = new AbortController();
    let lost = false;
    const beat = this.#heartbeat(leased, finished.signal, (why) => {
      lost = true;
      lease.abort(new LeaseLostError(leased.id, why));
    });
    this.#log.debug?.(
      `task ${leased.id} started: ${leased.node_type} (node ${leased.node_id}, attempt ${leased.attempt}) of run ${leased.run_id}`,
    );
    const began = performance.now();
    const startedAtUs = nowUs();
    let outcome: Outcome;
    try {
      outcome = await this.#call(leased, lease.signal);
    } finally {
      finished.abort();
      await beat;
    }
    const stages = echoedStages(leased.stages, startedAtUs, nowUs());
    const took = ((performance.now() - began) / 1000).toFixed(3);
    if (outcome.kind === "fail") {
      // The error's text goes to the run (scrubbed), not to the log: it may quote the input.
      this.#log.debug?.(`task ${leased.id} failed in ${took}s (retryable: ${outcome.retryable})`);
    } else {
      this.#log.debug?.(`task ${leased.id} ${outcome.kind === "lost" ? "gave up its lost lease" : "completed"} in ${took}s`);
    }
    if (lost || outcome.kind === "lost") {
      this.#log.warn(`task ${leased.id}: the lease was lost while it ran; its result is dropped`);
      return [];
    }
    return this.#report(leased, outcome, stages, lane);
  }

  async #call(leased: LeasedTask, signal: AbortSignal): Promise<Outcome> {
    const handler = this.#handlers.get(leased.node_type);
    if (handler === undefined) {
      return {
        kind: "fail",
        error: `no handler for type ${leased.node_type} on queue ${leased.queue} (worker ${this.workerId})`,
        retryable: false,
      };
    }
    const used: string[] = [];
    try {
      const input = resolveSecrets(leased.input, used, this.#env);
      const task: WorkerTask = { ...leased, input, signal };
      const result: unknown = await handler(task);
      // Fails here, not at the report, if it is not JSON.
      const text = JSON.stringify(result === undefined ? null : result, finiteNumbers);
      if (text === undefined) throw new TypeError(`the handler's answer is not JSON (a ${typeof result})`);
      return { kind: "complete", output: scrubSecrets(JSON.parse(text) as JsonValue, used) };
    } catch (e) {
      if (e instanceof TaskError) {
        const { retryable, code, status, retryAfterMs } = e;
        return { kind: "fail", error: scrubSecrets(e.message, used), retryable, code, status, retryAfterMs };
      }
      // A handler that saw its signal and gave up.
      if (e instanceof LeaseLostError) return { kind: "lost" };
      return { kind: "fail", error: scrubSecrets(describe(e), used), retryable: true };
    }
  }

  #lease(leased: LeasedTask): TaskHeartbeat {
    return { worker_id: this.workerId, run_id: leased.run_id, attempt: leased.attempt };
  }

  /** Renews the lease every third of its length until `finished`; a 409 (or no renewal for a whole lease) loses it. */
  async #heartbeat(leased: LeasedTask, finished: AbortSignal, lose: (why: string) => void): Promise<void> {
    const ttl = leased.lease_ttl_ms;
    let lastOk = performance.now();
    for (;;) {
      await sleep(Math.max(ttl / 3, 10), finished);
      if (finished.aborted) return;
      try {
        await call(this.#t, "POST", `/v1/tasks/${segment(leased.id)}/heartbeat`, this.#lease(leased), {
          timeoutMs: Math.min(this.#t.timeoutMs, Math.max(ttl, 100)),
        });
        lastOk = performance.now();
      } catch (e) {
        if (e instanceof ComposerError && e.status === 409) {
          this.#log.warn(`task ${leased.id}: lease lost (${e.message}); its result will be dropped`);
          lose(`task ${leased.id}: ${e.message}`);
          return;
        }
        this.#log.warn(`task ${leased.id}: heartbeat failed (${describe(e)})`);
      }
      if (performance.now() - lastOk >= ttl) {
        this.#log.warn(`task ${leased.id}: lease lost (no renewal for ${ttl} ms); its result will be dropped`);
        lose(`task ${leased.id}: the lease was not renewed for ${ttl} ms`);
        return;
      }
    }
  }

  /**
   * What a report asks to take with its answer: one task, for the slot the
   * reported task frees (the poll in flight did not count that slot, so the
   * worker never runs more than `concurrency`). None while stopping: a
   * stopping worker takes no new work.
   */
  #takeNext(leased: LeasedTask, lane: Lane): TakeNext | undefined {
    if (!this.#eager || this.#stopping) return undefined;
    // An urgent slot asks only after an urgent task (one that is not came from a run lowered after its step was sent).
    if (lane.priorityAtMost !== undefined && (leased.priority ?? 3) > lane.priorityAtMost) return undefined;
    return { queues: [...this.#polled], max: 1 };
  }

  /**
   * A coordinator older than eager dispatch refuses `next` as an unknown
   * field (400, nothing applied): no report asks it again.
   */
  #stopAskingForNext(refusal: unknown): void {
    if (!this.#eager) return;
    this.#eager = false;
    this.#log.warn(
      `worker ${this.workerId}: the coordinator refused next (${describe(refusal)}); ` +
        `reporting without it from now on, every task comes by a poll`,
    );
  }

  /**
   * Completes or fails the task, retrying connection errors and 5xx for a
   * lease's length; answers the tasks leased to this worker with the answer.
   */
  async #report(
    leased: LeasedTask,
    outcome: Outcome & { kind: "complete" | "fail" },
    stages: StageTimes | undefined,
    lane: Lane,
  ): Promise<LeasedTask[]> {
    const id = segment(leased.id);
    const kind = outcome.kind;
    let body: CompleteTask | FailTask;
    if (outcome.kind === "complete") {
      body = { ...this.#lease(leased), output: outcome.output };
    } else {
      const failed: FailTask = { ...this.#lease(leased), error: fit(outcome.error), retryable: outcome.retryable };
      // Sent only when set: a coordinator without them sees the failure as before.
      if (outcome.code !== undefined) failed.code = outcome.code;
      if (outcome.status !== undefined) failed.status = outcome.status;
      // The API takes a Retry-After with a 429 only.
      if (outcome.status === 429 && outcome.retryAfterMs !== undefined) failed.retry_after_ms = outcome.retryAfterMs;
      body = failed;
    }
    if (stages !== undefined) body.stages = stages;
    const next = this.#takeNext(leased, lane);
    if (next !== undefined) body.next = next;
    // The run's priority: the coordinator applies urgent runs' results first.
    const headers = { "composer-priority": String(priorityOf(leased.priority)) };
    // Past the lease the task belongs to another worker.
    const giveUpAt = performance.now() + leased.lease_ttl_ms;
    let delay = 100;
    for (let tries = 1; ; tries++) {
      let ack: ReportAck;
      try {
        ack = (await call<ReportAck>(this.#t, "POST", `/v1/tasks/${id}/${kind}`, body, { headers })).body;
      } catch (e) {
        const status = e instanceof ComposerError ? e.status : 0;
        if (status === 400 && body.next !== undefined) {
          // A 400 applies nothing: the same result again, without the ask, once.
          this.#stopAskingForNext(e);
          delete body.next;
          continue;
        }
        if (status === 409) {
          this.#log.warn(`task ${leased.id}: lease lost before the result landed (${describe(e)}); dropped`);
          return [];
        }
        if (status === 404 && e instanceof ComposerError && e.code === "run_not_found") {
          this.#log.warn(`task ${leased.id}: its run is gone; result dropped`);
          return [];
        }
        if (status > 0 && status < 500 && status !== 429) {
          this.#log.error(`task ${leased.id}: the coordinator refused the result: ${describe(e)}`);
          return [];
        }
        if (performance.now() >= giveUpAt) {
          // The lease expires and the task goes to another worker.
          this.#log.error(`task ${leased.id}: no coordinator took the result: ${describe(e)}`);
          return [];
        }
        const pause = delay * (0.5 + Math.random());
        this.#log.warn(
          `task ${leased.id}: reporting ${kind} failed (try ${tries}: ${describe(e)}); retrying in ${(pause / 1000).toFixed(1)}s`,
        );
        await sleep(pause);
        delay = Math.min(delay * 2, 2_000);
        continue;
      }
      if (ack.applied === false) this.#log.debug?.(`task ${leased.id}: the result was ignored: ${ack.ignored ?? ""}`);
      return ack.next ?? [];
    }
  }
}

/** The stages a result may send back: those the task API knows (it refuses others). */
const STAGES = ["dispatched_at_us", "published_at_us", "read_at_us", "leased_at_us"] as const;

/**
 * A lease's known stages (whole microseconds only) with when the handler
 * started and ended; none when the lease had none it knows (every
 * coordinator that knows stages sends them).
 */
export function echoedStages(leased: unknown, startedAtUs: number, finishedAtUs: number): StageTimes | undefined {
  if (typeof leased !== "object" || leased === null || Array.isArray(leased)) return undefined;
  const given = leased as Record<string, unknown>;
  const stages: StageTimes = {};
  for (const name of STAGES) {
    const v = given[name];
    if (typeof v === "number" && Number.isSafeInteger(v)) stages[name] = v;
  }
  if (Object.keys(stages).length === 0) return undefined;
  return { ...stages, started_at_us: startedAtUs, finished_at_us: finishedAtUs };
}

/** A leased task's priority, 3 (the default) when missing or not one. */
export function priorityOf(p: unknown): number {
  return typeof p === "number" && Number.isInteger(p) && p >= 1 && p <= 5 ? p : 3;
}

function nowUs(): number {
  return Math.round((performance.timeOrigin + performance.now()) * 1000);
}

/** A thrown value as a failed attempt's error: `TypeError: x is not a function`. */
function describe(e: unknown): string {
  if (e instanceof Error) return `${e.name}: ${e.message}`;
  return String(e);
}

/** Refuses NaN and Infinity, which JSON.stringify would quietly make null (Python's `allow_nan=False`). */
function finiteNumbers(_key: string, value: unknown): unknown {
  if (typeof value === "number" && !Number.isFinite(value)) {
    throw new RangeError(`the output holds ${value}, which JSON cannot hold`);
  }
  return value;
}

/** An error as the server takes it: no NUL character, at most 65,536 characters. */
function fit(error: string): string {
  const clean = error.replaceAll("\u0000", "\ufffd");
  const chars = [...clean];
  return chars.length <= MAX_ERROR_CHARS ? clean : chars.slice(0, MAX_ERROR_CHARS).join("");
}
