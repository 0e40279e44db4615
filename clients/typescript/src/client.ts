import { WaitTimeoutError } from "./errors.js";
import { call, query, segment, sleep, transport, type CallOptions, type Fetch, type Transport } from "./http.js";
import {
  isTerminal,
  type BackfillOverlap,
  type BackfillQueued,
  type BackfillRequest,
  type CreateNamespace,
  type Deleted,
  type EventPage,
  type EventSent,
  type HistoryEntry,
  type HistoryPage,
  type ItemPage,
  type JsonValue,
  type Limit,
  type LimitPage,
  type LimitValues,
  type Namespace,
  type NamespaceList,
  type NamespaceQuotas,
  type RecordedEvent,
  type ResolveTask,
  type Run,
  type RunList,
  type RunStatus,
  type SendEvent,
  type SetPriority,
  type StartRun,
  type UpdateAnswer,
  type UpdateRequest,
  type Webhook,
  type WebhookDefinition,
  type WebhookList,
  type Workflow,
  type WorkflowDefinition,
  type WorkflowList,
} from "./types.js";

export interface ClientOptions {
  /** The coordinator's URL: `http://127.0.0.1:8080`. */
  url: string;
  /** `COMPOSER_API_TOKEN`, when the coordinator has one. */
  token?: string | undefined;
  /**
   * The namespace every call is in, named in its `composer-namespace`
   * header: its workflows, runs, events, schedules, webhooks and limits, and
   * nothing of another's. `default` when undefined or empty. 1 to 63
   * lowercase letters, digits and `-`, starting with a letter: another name
   * is a TypeError here.
   */
  namespace?: string | undefined;
  /** Each call's timeout (default 30 s); a long-poll gets its wait on top. */
  timeoutMs?: number | undefined;
  /** The fetch to call with (default: the global one). */
  fetch?: Fetch | undefined;
}

/** `startRun`'s arguments. */
export interface StartRunOptions {
  workflow: string;
  /** The run's input (default `{}`). */
  input?: JsonValue | undefined;
  /** A version of the workflow (default: the latest). */
  version?: number | undefined;
  /** A second start with the same key returns the first run (`created` false). */
  idempotencyKey?: string | undefined;
  /**
   * A W3C trace context (`00-<trace id>-<span id>-<flags>`), sent as the
   * `traceparent` header: the run's trace continues the caller's. The
   * server ignores one that does not read.
   */
  traceparent?: string | undefined;
  /** 1 (served first) to 5 (last), instead of the definition's (3 by default). */
  priority?: number | undefined;
}

/** `registerWorkflow`'s options. */
export interface RegisterWorkflowOptions {
  /**
   * The version the caller means (`?version=N`): the same definition as N
   * answers N; another definition under N, or an N other than the next, is a
   * `ConflictError` (409). Newer coordinators only.
   */
  version?: number | undefined;
}

/** A registered workflow version; `created` is false when it was identical to a registered version. */
export type RegisteredWorkflow = Workflow & { created: boolean };

/** A started run (a summary); `created` is false for a known idempotency key. */
export type StartedRun = Run & { created: boolean };

/** `listRuns`' filter and page. */
export interface ListRunsOptions {
  workflow?: string | undefined;
  /** One status (any case). */
  status?: RunStatus | Lowercase<RunStatus> | undefined;
  /** The child runs of this run. */
  parentRunId?: string | undefined;
  /** 1 to 1000 (default 50). */
  limit?: number | undefined;
  /** The previous page's `next_cursor`. */
  cursor?: string | null | undefined;
}

/** `sendEvent`'s options. */
export interface SendEventOptions {
  /** The sender's id for the event (1 to 256 characters): sent again with the same name and id, it is recorded once and answers `duplicate`. */
  id?: string | undefined;
  /** A W3C trace context, sent as the `traceparent` header: the runs the event starts continue the caller's trace. */
  traceparent?: string | undefined;
}

/** `updateRun`'s options. */
export interface UpdateRunOptions {
  /** The update's id (1 to 256 characters): sent again with the same id, it is answered the same and applied once. */
  id?: string | undefined;
  /** How long to wait for a step that accepts it (`"10s"` by default, at most `"60s"`). */
  timeout?: string | undefined;
}

/** `listEvents`' filter and page. */
export interface ListEventsOptions {
  /** Only events of this name. */
  name?: string | undefined;
  /** Only events from this source: `api`, or `webhook:NAME`. */
  source?: string | undefined;
  /** The previous page's `next_before` (a seq): the events before it. */
  before?: number | null | undefined;
  /** 1 to 1000 (default 50). */
  limit?: number | undefined;
}

/** `backfillSchedule`'s range: the fire times in `[from, to)`, RFC 3339 text or `Date`s. */
export interface BackfillOptions {
  from: string | Date;
  /** At most now. */
  to: string | Date;
  /** `allow` (the default), `skip` or `buffer_all`. */
  overlap?: BackfillOverlap | undefined;
}

/** `listLimits`' page. */
export interface ListLimitsOptions {
  /** The previous page's `next_after` (a key): the limits after it. */
  after?: string | null | undefined;
  /** 1 to 1000 (default 100). */
  limit?: number | undefined;
}

/** A created webhook; `created` is false when it replaced one of the same name. */
export type CreatedWebhook = Webhook & { created: boolean };

/** A created namespace; `created` is false when it existed already. */
export type CreatedNamespace = Namespace & { created: boolean };

export interface WaitOptions {
  /** Give up after this long (default: wait as long as it takes), throwing a `WaitTimeoutError`. */
  timeoutMs?: number | undefined;
  /** Stop waiting: rejects with the signal's reason. */
  signal?: AbortSignal | undefined;
}

/** Longest wait of one `GET /v1/runs/{id}?wait=`. */
const MAX_WAIT_MS = 30_000;

/** A start's or an event's call options: its `traceparent` header, when it has one. */
function traced(traceparent: string | undefined): CallOptions {
  return traceparent === undefined ? {} : { headers: { traceparent } };
}

/**
 * Composer's REST API: workflows, runs, events, schedules' backfills,
 * webhooks, limits and namespaces. Every method rejects with a `ComposerError` (`NotFoundError`,
 * `InvalidRequestError`, `ConflictError`, `UnauthorizedError`,
 * `UnavailableError`) when the server refuses or no answer comes.
 */
export class Client {
  readonly #t: Transport;

  constructor(options: ClientOptions) {
    this.#t = transport(options, 30_000);
  }

  /** The coordinator's URL. */
  get url(): string {
    return this.#t.base;
  }

  /** The namespace every call names; undefined: `default`. */
  get namespace(): string | undefined {
    return this.#t.namespace;
  }

  #get<T>(path: string, options?: CallOptions): Promise<T> {
    return call<T>(this.#t, "GET", path, undefined, options).then((a) => a.body);
  }

  #post<T>(path: string, body?: unknown): Promise<T> {
    return call<T>(this.#t, "POST", path, body).then((a) => a.body);
  }

  #put<T>(path: string, body: unknown): Promise<T> {
    return call<T>(this.#t, "PUT", path, body).then((a) => a.body);
  }

  #delete<T>(path: string): Promise<T> {
    return call<T>(this.#t, "DELETE", path).then((a) => a.body);
  }

  // -- workflows ------------------------------------------------------------

  /**
   * Registers a definition (or a `Workflow` built in code): a new version
   * when it differs from every registered one (`created`), else the version
   * it is. `version` declares the version meant (`?version=N`).
   */
  async registerWorkflow(
    definition: WorkflowDefinition | { definition(): WorkflowDefinition },
    options: RegisterWorkflowOptions = {},
  ): Promise<RegisteredWorkflow> {
    const def = "definition" in definition && typeof definition.definition === "function" ? definition.definition() : definition;
    const path = `/v1/workflows${query({ version: options.version })}`;
    const { status, body } = await call<Workflow>(this.#t, "POST", path, def);
    return { ...body, created: status === 201 };
  }

  /** The latest version with its spec, and a page of its versions (newest first). */
  getWorkflow(name: string, page: { limit?: number | undefined; before?: number | undefined } = {}): Promise<Workflow> {
    return this.#get(`/v1/workflows/${segment(name)}${query({ limit: page.limit, before: page.before })}`);
  }

  /** One version with its spec. */
  getWorkflowVersion(name: string, version: number): Promise<Workflow> {
    return this.#get(`/v1/workflows/${segment(name)}/versions/${segment(version)}`);
  }

  /** The latest version of every workflow (no specs). */
  async listWorkflows(): Promise<Workflow[]> {
    const list = await this.#get<WorkflowList>("/v1/workflows");
    return list.workflows;
  }

  // -- runs -----------------------------------------------------------------

  /** Starts a run; answers its summary (`getRun` for its tasks). */
  async startRun(options: StartRunOptions): Promise<StartedRun> {
    const body: StartRun = { workflow: options.workflow };
    if (options.version !== undefined) body.version = options.version;
    if (options.input !== undefined) body.input = options.input;
    if (options.idempotencyKey !== undefined) body.idempotency_key = options.idempotencyKey;
    if (options.priority !== undefined) body.priority = options.priority;
    const { status, body: run } = await call<Run>(this.#t, "POST", "/v1/runs", body, traced(options.traceparent));
    return { ...run, created: status === 201 };
  }

  /** A run with its input, output and tasks. */
  getRun(id: string): Promise<Run> {
    return this.#get(`/v1/runs/${segment(id)}`);
  }

  /**
   * The run once it has ended (SUCCEEDED, FAILED or CANCELLED), whatever
   * its status: long-polls `GET /v1/runs/{id}?wait=30s` until then. Past
   * `timeoutMs` it throws a `WaitTimeoutError` holding the run as last seen.
   */
  async waitForRun(id: string, options: WaitOptions = {}): Promise<Run> {
    const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
    for (;;) {
      const left = deadline - Date.now();
      const waitMs = Math.max(1, Math.min(MAX_WAIT_MS, left));
      // Whole seconds when there are some; the server reads both.
      const wait = waitMs >= 1000 ? `${Math.floor(waitMs / 1000)}s` : `${Math.ceil(waitMs)}ms`;
      const began = Date.now();
      const run = await this.#get<Run>(`/v1/runs/${segment(id)}?wait=${wait}`, {
        timeoutMs: this.#t.timeoutMs + waitMs,
        signal: options.signal,
      });
      if (isTerminal(run.status)) return run;
      if (Date.now() >= deadline) {
        throw new WaitTimeoutError(`run ${id} is still ${run.status} after ${options.timeoutMs} ms`, run);
      }
      // Back before its wait without an end: the coordinator is stopping. Not in a busy loop.
      if (Date.now() - began < waitMs / 2) await sleep(Math.min(200, deadline - Date.now()), options.signal);
    }
  }

  /** A page of runs, newest first (summaries: no input, output or tasks). */
  listRuns(options: ListRunsOptions = {}): Promise<RunList> {
    const q = query({
      workflow: options.workflow,
      status: options.status,
      parent_run_id: options.parentRunId,
      limit: options.limit,
      cursor: options.cursor,
    });
    return this.#get(`/v1/runs${q}`);
  }

  /** Every run that matches, newest first, fetching page after page (`limit` is the page size). */
  async *iterateRuns(options: Omit<ListRunsOptions, "cursor"> = {}): AsyncGenerator<Run, void, undefined> {
    let cursor: string | null = null;
    do {
      const page: RunList = await this.listRuns({ ...options, cursor });
      yield* page.runs;
      cursor = page.next_cursor;
    } while (cursor !== null);
  }

  /** A run's whole history, oldest first (every page). */
  async runEvents(id: string): Promise<HistoryEntry[]> {
    const events: HistoryEntry[] = [];
    let after: number | null = null;
    do {
      const page: HistoryPage = await this.runEventsPage(id, { after: after ?? undefined, limit: 1000 });
      events.push(...page.events);
      after = page.next_after;
    } while (after !== null);
    return events;
  }

  /** A page of a run's history: the entries after `after` (a seq). */
  runEventsPage(id: string, page: { after?: number | undefined; limit?: number | undefined } = {}): Promise<HistoryPage> {
    return this.#get(`/v1/runs/${segment(id)}/events${query({ after: page.after, limit: page.limit })}`);
  }

  /** A page of a MAP node's items, by index. */
  mapItems(
    id: string,
    node: string,
    page: { after?: number | undefined; limit?: number | undefined } = {},
  ): Promise<ItemPage> {
    return this.#get(`/v1/runs/${segment(id)}/items${query({ node, after: page.after, limit: page.limit })}`);
  }

  /** Cancels a RUNNING, PAUSED or QUEUED run (a `ConflictError` once it has ended). */
  cancelRun(id: string): Promise<Run> {
    return this.#post(`/v1/runs/${segment(id)}/cancel`);
  }

  /** Runs a FAILED run again from its failed steps. */
  retryRun(id: string): Promise<Run> {
    return this.#post(`/v1/runs/${segment(id)}/retry`);
  }

  /** Pauses a RUNNING run: started steps finish, nothing new starts. */
  pauseRun(id: string): Promise<Run> {
    return this.#post(`/v1/runs/${segment(id)}/pause`);
  }

  /** Resumes a PAUSED run. */
  resumeRun(id: string): Promise<Run> {
    return this.#post(`/v1/runs/${segment(id)}/resume`);
  }

  /**
   * Gives an open run (QUEUED, RUNNING or PAUSED), and the open runs under
   * it, another priority, 1 (served first) to 5 (last): its queued start
   * and its steps not started yet, dispatched ones included, are served at
   * it; the history records it (`PriorityChanged`). Answers the run. A
   * `ConflictError` once the run has ended, an `InvalidRequestError` for a
   * priority outside 1 to 5. Newer coordinators only.
   */
  setRunPriority(id: string, priority: number): Promise<Run> {
    const body: SetPriority = { priority };
    return this.#put(`/v1/runs/${segment(id)}/priority`, body);
  }

  /**
   * Says how an IN_DOUBT step (an `at_most_once` attempt whose outcome is
   * unknown) ended: `completed` with `output`, `failed` with `error`, or
   * `retry` (sent again under the same idempotency key). `node` is the
   * step's node id (a MAP item: `ship_each[3]`). A `ConflictError` when the
   * step is not IN_DOUBT. Newer coordinators only.
   */
  resolveTask(id: string, node: string, resolution: ResolveTask): Promise<Run> {
    return this.#post(`/v1/runs/${segment(id)}/tasks/${segment(node)}/resolve`, resolution);
  }

  // -- events ---------------------------------------------------------------

  /**
   * Sends the event `name`: it starts a run for each trigger of a workflow
   * that listens to it (`started_runs`; `trigger_errors` for those that
   * matched and failed), then completes the steps waiting for `(name, key)`
   * with `payload`, or is kept for one to come (`buffered`). `key` is `""`
   * by default. With `options.id`, an event sent again with the same name
   * and id is recorded once and answers `duplicate`, with the runs the first
   * sending started.
   */
  sendEvent(name: string, key = "", payload: JsonValue = null, options: SendEventOptions = {}): Promise<EventSent> {
    const body: SendEvent = { name, key, payload };
    if (options.id !== undefined) body.id = options.id;
    return call<EventSent>(this.#t, "POST", "/v1/events", body, traced(options.traceparent)).then((a) => a.body);
  }

  /**
   * Sends update `name` to run `id`: the run's waiting step that accepts it
   * validates it, and completes with its output when it accepts. The answer
   * says which (`accepted`, with `output` or `reason`). With `options.id`,
   * the update sent again is answered the same (`duplicate`) and applied
   * once. A 409 (`update_not_accepted`) when no step takes it within
   * `options.timeout` (10s by default, at most 60s).
   */
  updateRun(id: string, name: string, payload: JsonValue = null, options: UpdateRunOptions = {}): Promise<UpdateAnswer> {
    const body: UpdateRequest = { name, payload };
    if (options.id !== undefined) body.id = options.id;
    if (options.timeout !== undefined) body.timeout = options.timeout;
    // The server waits up to 60 s for a step that accepts it: the call's timeout is on top.
    const timeoutMs = this.#t.timeoutMs + 60_000;
    return call<UpdateAnswer>(this.#t, "POST", `/v1/runs/${segment(id)}/update`, body, { timeoutMs }).then((a) => a.body);
  }

  /** A page of the events recorded lately, newest first, each with what its triggers did. */
  listEvents(options: ListEventsOptions = {}): Promise<EventPage> {
    const q = query({ name: options.name, source: options.source, before: options.before, limit: options.limit });
    return this.#get(`/v1/events${q}`);
  }

  /** Every event that matches, newest first, fetching page after page (`limit` is the page size). */
  async *iterateEvents(options: ListEventsOptions = {}): AsyncGenerator<RecordedEvent, void, undefined> {
    let before: number | null = options.before ?? null;
    for (;;) {
      const page: EventPage = await this.listEvents({ ...options, before });
      yield* page.events;
      before = page.next_before;
      if (before === null || page.events.length === 0) return;
    }
  }

  // -- schedules and webhooks -------------------------------------------------

  /**
   * Queues the runs the schedule would have started at its fire times in
   * `[from, to)` (`to` at most now); the coordinator starts them (with
   * `trigger.backfill`) under `overlap`, or holds them while the schedule
   * is paused. A fire time started or queued before is not queued again
   * (`already`). An `InvalidRequestError` (`invalid_schedule`) for a range
   * that is empty, in the future or too long.
   */
  backfillSchedule(id: string, options: BackfillOptions): Promise<BackfillQueued> {
    const time = (t: string | Date) => (t instanceof Date ? t.toISOString() : t);
    const body: BackfillRequest = { from: time(options.from), to: time(options.to) };
    if (options.overlap !== undefined) body.overlap = options.overlap;
    return this.#post(`/v1/schedules/${segment(id)}/backfill`, body);
  }

  /**
   * Creates a webhook, or replaces the one of its name (`created` false):
   * each delivery to its `url` whose signature holds becomes an event.
   * `secret` names the signing secret, which each coordinator reads from
   * `COMPOSER_WEBHOOK_SECRET_<secret>`; `secret_set` says whether this one has it.
   */
  async createWebhook(definition: WebhookDefinition): Promise<CreatedWebhook> {
    const { status, body } = await call<Webhook>(this.#t, "POST", "/v1/webhooks", definition);
    return { ...body, created: status === 201 };
  }

  /** Every webhook, by name. */
  async listWebhooks(): Promise<Webhook[]> {
    const list = await this.#get<WebhookList>("/v1/webhooks");
    return list.webhooks;
  }

  /** A webhook (a `NotFoundError` when there is none of that name). */
  getWebhook(name: string): Promise<Webhook> {
    return this.#get(`/v1/webhooks/${segment(name)}`);
  }

  /** Deletes a webhook: its deliveries are refused from now on; the events it sent stay. */
  deleteWebhook(name: string): Promise<Deleted> {
    return this.#delete(`/v1/webhooks/${segment(name)}`);
  }

  // -- namespaces ---------------------------------------------------------------

  /**
   * Creates the namespace `name` (1 to 63 lowercase letters, digits and
   * `-`, starting with a letter), with its own workflows, runs, events,
   * schedules, webhooks, limits and queues; one that exists is answered as
   * it is (`created` false). Needs a key of every namespace (an
   * `UnauthorizedError` otherwise); a `ConflictError` while one of that
   * name is being deleted. Namespaces are cluster-wide: the client's own
   * `namespace` does not matter here.
   */
  async createNamespace(name: string, description = ""): Promise<CreatedNamespace> {
    const body: CreateNamespace = { name, description };
    const { status, body: namespace } = await call<Namespace>(this.#t, "POST", "/v1/namespaces", body);
    return { ...namespace, created: status === 201 };
  }

  /** Every namespace, `default` first, then by name (those being deleted too); a key bound to one sees that one only. */
  async listNamespaces(): Promise<Namespace[]> {
    const list = await this.#get<NamespaceList>("/v1/namespaces");
    return list.namespaces;
  }

  /** A namespace (a `NotFoundError` when there is none of that name, it is being deleted, or the key is bound to another). */
  getNamespace(name: string): Promise<Namespace> {
    return this.#get(`/v1/namespaces/${segment(name)}`);
  }

  /**
   * Sets every quota of a namespace at once (one left out is none): a
   * start, schedule or limit past one is then an `UnavailableError` (HTTP
   * 429, code `over_quota`, its message naming the quota, `retryAfterMs`
   * set). Needs a key of every namespace with `admin`.
   */
  setNamespaceQuotas(name: string, quotas: NamespaceQuotas): Promise<Namespace> {
    return this.#put(`/v1/namespaces/${segment(name)}/quotas`, quotas);
  }

  /**
   * Deletes a namespace with everything it holds: it is no longer served
   * (calls naming it are a `ConflictError`), and its data is dropped some
   * seconds later. Answers it, `state` `deleting`. `default` cannot be
   * deleted.
   */
  deleteNamespace(name: string): Promise<Namespace> {
    return this.#delete(`/v1/namespaces/${segment(name)}`);
  }

  // -- limits -------------------------------------------------------------------

  /**
   * A page of the limits, in key order: every key a step has waited for or
   * an operator set, with its values, who set them (`set_by`) and its use
   * now (`tokens`, `in_use`, `waiting`, `held_until`).
   */
  listLimits(options: ListLimitsOptions = {}): Promise<LimitPage> {
    return this.#get(`/v1/limits${query({ after: options.after, limit: options.limit })}`);
  }

  /** Every limit (those after the key `after`), in key order, fetching page after page (`limit` is the page size). */
  async *iterateLimits(options: ListLimitsOptions = {}): AsyncGenerator<Limit, void, undefined> {
    let after: string | null = options.after ?? null;
    for (;;) {
      const page: LimitPage = await this.listLimits({ ...options, after });
      yield* page.limits;
      after = page.next_after;
      if (after === null || page.limits.length === 0) return;
    }
  }

  /** A limit and its use now (a `NotFoundError` for a key no step waited for and no operator set). The key is encoded here. */
  getLimit(key: string): Promise<Limit> {
    return this.#get(`/v1/limits/${segment(key)}`);
  }

  /**
   * Sets a key's `rate` (`"N/period"`, with `burst`) and `concurrency` at run
   * time, across every run, item and coordinator; a part left out is not
   * limited. From now on the definitions that use the key no longer change
   * it (`deleteLimit` gives it back to them); steps waiting for it go as
   * soon as the new values let them. An `InvalidRequestError` for a value
   * out of range (`"0/1s"`).
   */
  setLimit(key: string, values: LimitValues = {}): Promise<Limit> {
    const body: LimitValues = {};
    if (values.rate !== undefined && values.rate !== null) body.rate = values.rate;
    if (values.burst !== undefined && values.burst !== null) body.burst = values.burst;
    if (values.concurrency !== undefined && values.concurrency !== null) body.concurrency = values.concurrency;
    return this.#put(`/v1/limits/${segment(key)}`, body);
  }

  /** Forgets the values an operator set: the key goes back to what the definitions that use it say. */
  deleteLimit(key: string): Promise<Deleted> {
    return this.#delete(`/v1/limits/${segment(key)}`);
  }
}
