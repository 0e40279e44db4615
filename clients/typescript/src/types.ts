/**
 * The bodies of Composer's REST API and task API, as the coordinator sends
 * and takes them (`crates/api/src/rest.rs`; `GET /openapi.json`). Field
 * names are the wire's (snake_case); times are RFC 3339 strings in UTC.
 *
 * A field the server always sends, `null` when empty, is typed `T | null`; a
 * field it leaves out when empty is optional (`?:`). Fields added by newer
 * coordinators (failure handling, LOOP, event triggers, limits) are optional,
 * so the types fit older ones too.
 */

/** Any JSON value. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

/** A JSON object. */
export type JsonObject = { [key: string]: JsonValue };

/** A run's status. QUEUED waits for a slot under its workflow's concurrency limit. */
export type RunStatus = "QUEUED" | "RUNNING" | "PAUSED" | "SUCCEEDED" | "FAILED" | "CANCELLED";

/** Every run status, in the server's order. */
export const RUN_STATUSES: readonly RunStatus[] = ["QUEUED", "RUNNING", "PAUSED", "SUCCEEDED", "FAILED", "CANCELLED"];

/** The statuses a run ends in. */
export const TERMINAL_STATUSES: readonly RunStatus[] = ["SUCCEEDED", "FAILED", "CANCELLED"];

/** Whether a run in `status` has ended (SUCCEEDED, FAILED or CANCELLED). */
export function isTerminal(status: RunStatus): boolean {
  return TERMINAL_STATUSES.includes(status);
}

/**
 * A task's state. QUEUED is a MAP item waiting for a slot; IN_DOUBT an
 * `at_most_once` attempt whose outcome is unknown, waiting for `resolveTask`
 * (newer coordinators).
 */
export type TaskState =
  | "QUEUED"
  | "PENDING"
  | "RUNNING"
  | "WAITING"
  | "IN_DOUBT"
  | "COMPLETED"
  | "FAILED"
  | "SKIPPED"
  | "CANCELLED";

/** What a line of a run's history records. */
export type HistoryKind =
  | "RunStarted"
  | "TaskDispatched"
  | "TaskWaiting"
  | "TaskRetryScheduled"
  | "TaskCompleted"
  | "TaskFailed"
  | "TaskSkipped"
  | "TaskCancelled"
  | "RunSucceeded"
  | "RunFailed"
  | "RunCancelled"
  | "RunRetried"
  | "RunPaused"
  | "RunResumed"
  | "EventIgnored"
  | "MapStarted"
  /** An `at_most_once` attempt's outcome is unknown: the step waits IN_DOUBT. */
  | "TaskInDoubt"
  /** An IN_DOUBT step was resolved (`resolveTask`). */
  | "TaskResolved"
  /** A retry went back before the task: it runs again when it becomes ready. */
  | "TaskReset"
  /** The run's end started its failure handler (`run_id`), or could not (`error`). */
  | "HandlerStarted"
  /** An operator ran the run again from some of its steps. */
  | "RunRerun"
  /** An operator gave the run another priority (`setRunPriority`): payload `{priority, from, actor}`. */
  | "PriorityChanged"
  /** An operator moved the run to another version (`migrateRuns`): payload `{from_version, to_version, map, actor, reason?}`. */
  | "RunMigrated"
  | "DeadlinePassed"
  /** A person voted on an APPROVAL step: payload `{vote: {person, answer, via?}, actor}`. */
  | "ApprovalVoted"
  /** An APPROVAL step escalated: payload `{assignees, due_at}`. */
  | "ApprovalEscalated";

// -- workflow definitions ---------------------------------------------------

/** The built-in node types; any other name is a custom type run by a worker. */
export type BuiltinNodeType =
  | "HTTP"
  | "WAIT"
  | "WAIT_FOR_EVENT"
  | "TRANSFORM"
  | "MAP"
  | "SUB_WORKFLOW"
  | "LOOP"
  | "FAIL";

/** A node's type: a built-in one, or a custom type (`resize-image`) a worker handles. */
export type NodeType = BuiltinNodeType | (string & {});

/**
 * What a 429 answer with `Retry-After` does to a node's retries: `respect`
 * (the default for a node with limits) waits that long before the next
 * attempt and holds the node's limit keys as long; `ignore` retries on the
 * backoff.
 */
export type On429 = "respect" | "ignore";

/** A node's retry policy. Durations are text: `"1s"`, `"500ms"`, `"1m"`. */
export interface RetryPolicy {
  max_attempts?: number | null;
  initial_backoff?: string | null;
  multiplier?: number | null;
  max_backoff?: string | null;
  /** Newer coordinators only. */
  on_429?: On429 | null;
}

/**
 * A limit's values, as a node or `setLimit` writes them; a part left out is
 * not limited.
 */
export interface LimitValues {
  /** Steps per period, `"N/period"` (`"25/1s"`, `"1000/1h"`): a token bucket that refills N tokens each period. */
  rate?: string | null;
  /** The most tokens the bucket holds (1 to 1,000,000; the rate's N by default). */
  burst?: number | null;
  /** Steps of the key in flight at once, across runs (1 to 100,000). */
  concurrency?: number | null;
}

/**
 * One of a node's `limits`: its steps wait (PENDING, with `held`) until the
 * limit lets them go, across runs, MAP items and coordinators. Neither a
 * rate nor a concurrency names a limit whose values are set at run time
 * (`setLimit`).
 */
export interface LimitDefinition extends LimitValues {
  /** What the limit is per: text with `${ ... }` over the step's scope (`"stripe:${ .input.account }"`), not `.` or `..`. */
  key: string;
}

/** One node of a definition. */
export interface NodeDefinition {
  /** Unique in the definition: `[A-Za-z0-9_.-]{1,128}`, not `.` or `..` (a URL path cannot carry them). */
  id: string;
  type: NodeType;
  /** The queue a dispatched node goes to (default: its type in lower case). */
  queue?: string | null;
  /** The node's configuration; strings `${ jq }` are evaluated when it starts. */
  config?: JsonObject | null;
  retry?: RetryPolicy | null;
  /** How long one attempt may take (`"30s"`). */
  timeout?: string | null;
  /**
   * `at_least_once` (the default: an attempt whose worker died runs again)
   * or `at_most_once` (HTTP and custom nodes: an attempt whose outcome is
   * unknown waits IN_DOUBT for `resolveTask`). Newer coordinators only.
   */
  delivery?: "at_least_once" | "at_most_once" | null;
  /** Limits on this node's steps across runs (HTTP and custom nodes, at most 4). Newer coordinators only. */
  limits?: LimitDefinition[] | null;
  /** Runs started when the step has not ended some time after it was created (at most 8). */
  deadlines?: DeadlineDefinition[];
  /** The updates this step accepts while it waits (a WAIT_FOR_EVENT, at most 8): `updateRun` sends one. */
  updates?: UpdateDefinition[];
}

/** An update a waiting step accepts: `validate` (jq over `{update: {id, name, payload}, input}`) true accepts it, false refuses it with `refusal`, an error refuses it with its message; `output` (a template over the same) is the step's output, the payload by default. */
export interface UpdateDefinition {
  name: string;
  validate?: string | null;
  refusal?: string | null;
  output?: JsonValue;
}

/** `POST /v1/runs/{id}/update`. */
export interface UpdateRequest {
  name: string;
  payload?: JsonValue;
  /** Sent again with the same id, the update is answered the same and applied once. */
  id?: string;
  /** How long to wait for a step that accepts it (`"10s"` by default, at most `"60s"`). */
  timeout?: string;
}

/** What a run's step answered to an update: accepted with its `output`, or refused with its `reason`. */
export interface UpdateAnswer {
  id: string;
  name: string;
  /** The step that took it. */
  node: string;
  accepted: boolean;
  output?: JsonValue;
  reason?: string;
  /** Answered before (this id): nothing was done again. */
  duplicate: boolean;
}

/** An edge; `when` is a jq expression that must yield a boolean. */
export interface EdgeDefinition {
  from: string;
  to: string;
  when?: string | null;
  /** Which end of its source the edge follows: `success` (the default), `failure` or `always`. */
  on?: "success" | "failure" | "always" | null;
}

/** `on_failure`: a run of another workflow that a run's failed (or cancelled) end starts. */
export interface OnFailureDefinition {
  workflow: string;
  version?: number | null;
  /** A template over `{failed_run: {id, workflow, status, error, nodes}, input}`. */
  input?: JsonValue;
  /** The ends that start it: `["FAILED"]` (the default) or `["FAILED", "CANCELLED"]`. */
  on?: Array<"FAILED" | "CANCELLED"> | null;
}

/** `on_success` and `on_end`: a run of another workflow that a run's end starts. */
export interface HookDefinition {
  workflow: string;
  version?: number | null;
  /** A template over `{run: {id, workflow, status, error, output, nodes}, input}`. */
  input?: JsonValue;
}

/** A run's or a step's deadline: the run it starts when `after` passes with the run (or step) not ended; it changes nothing of the run. */
export interface DeadlineDefinition {
  /** How long after the run's start (or the step's creation): `"2h"`. */
  after: string;
  start: DeadlineStartDefinition;
}

/** What a deadline starts: a run of `workflow`. */
export interface DeadlineStartDefinition {
  workflow: string;
  version?: number | null;
  /** A template over `{run: {id, workflow, version, status}, step, deadline: {after, node}, input}`. */
  input?: JsonValue;
}

/** At most `max` runs open at once, per value of `key` (an expression over `{input}`). */
export interface ConcurrencyLimit {
  max: number;
  key?: string | null;
}

/**
 * A trigger: each event named `event` (sent, or made of a webhook's
 * delivery) whose `when` holds starts a run of the workflow. Newer
 * coordinators only.
 */
export interface TriggerDefinition {
  /** The event's name (`order.created`). */
  event: string;
  /** A jq condition over `{event: {id, name, key, payload}}`; every event of the name without it. */
  when?: string | null;
  /** The run's input, a template over `{event}`; `${ .event.payload }` by default. */
  input?: JsonValue;
  /** The run's idempotency key, text or a template over `{event}`: a second event with the same key finds the first run. */
  idempotency_key?: string | null;
  /** The key its flow control counts by, text or a template over `{event}`; the event's key by default. */
  key?: string | null;
  /** One run per burst of a key's events. */
  debounce?: DebounceSpec | null;
  /** One run per `max_size` events of a key, or `max_wait` after the first: its input is their inputs' list. */
  batch?: BatchSpec | null;
  /** At most `count` runs per `period` for a key; the rest queued (the default) or dropped. */
  throttle?: ThrottleSpec | null;
  /** One running run per key: a new event starts none (`skip`) or cancels it and starts (`cancel`). */
  singleton?: "skip" | "cancel" | null;
}

/** A trigger's `debounce`: its run starts `period` after a burst's last event, with it (or at its first, `leading`). */
export interface DebounceSpec {
  period: string;
  leading?: boolean | null;
  /** The longest a burst that does not end puts the run off. */
  max_wait?: string | null;
}

/** A trigger's `batch`. */
export interface BatchSpec {
  max_size: number;
  max_wait: string;
}

/** A trigger's `throttle`. */
export interface ThrottleSpec {
  count: number;
  period: string;
  excess?: "queue" | "drop" | null;
}

/** A workflow definition as it is registered (`POST /v1/workflows`). */
export interface WorkflowDefinition {
  name: string;
  nodes: NodeDefinition[];
  edges?: EdgeDefinition[] | null;
  /** The run's output, a template over `{input, nodes, run}`. */
  output?: JsonValue;
  /** How long a whole run may take (`"1h"`). */
  timeout?: string | null;
  concurrency?: ConcurrencyLimit | null;
  description?: string | null;
  /** The failure handler run a run that ends FAILED starts. */
  on_failure?: OnFailureDefinition | null;
  /** The run a run that ends SUCCEEDED starts. */
  on_success?: HookDefinition | null;
  /** The run a run starts when it ends, however it ends. */
  on_end?: HookDefinition | null;
  /** Runs started when a run has not ended some time after its start (at most 8). */
  deadlines?: DeadlineDefinition[];
  /** Each run's tags: templates over its input (`{"customer": "${ .input.customer }"}`). */
  tags?: Record<string, string> | null;
  /** Events that start a run of it (at most 16; the latest version's apply). */
  triggers?: TriggerDefinition[] | null;
  /** Its runs' priority, 1 (served first) to 5 (last); 3 by default. A start may give another. Newer coordinators only. */
  priority?: number | null;
  /**
   * Whose work a run is: text or a `${ ... }` expression over `{input}`
   * (`"${ .input.tenant }"`). Runs and steps of different keys take turns.
   * A child run without one has its parent's. Newer coordinators only.
   */
  fairness_key?: string | null;
  /**
   * A JSON Schema (draft 2020-12) of the run's input: checked at every start
   * (a 400 names the JSON Pointer at fault). Newer coordinators only.
   */
  input_schema?: JsonObject | null;
}

/**
 * A version of a workflow. `spec` and `versions` come only where one
 * workflow is asked for (`getWorkflow`, `getWorkflowVersion`).
 */
export interface Workflow {
  id: string;
  name: string;
  version: number;
  created_at: string;
  /** The definition, as the server normalized it. */
  spec?: WorkflowDefinition;
  /** A page of versions, newest first (metadata only). */
  versions?: Workflow[];
  /** More versions: pass it as `before` for the next page. */
  versions_next?: number;
}

/** `GET /v1/workflows`: the latest version of each workflow. */
export interface WorkflowList {
  workflows: Workflow[];
}

// -- runs -------------------------------------------------------------------

/** A MAP task's item counts: `queued + open + completed + failed == total`. */
export interface MapProgress {
  total: number;
  queued: number;
  open: number;
  completed: number;
  failed: number;
  /** Items created so far (a large MAP creates them a chunk at a time); absent on older coordinators. */
  created?: number;
}

/** What a failure edge can test of a task's failure besides its message (`.nodes.X.error`). */
export interface ErrorInfo {
  /** A stable name for what went wrong: `task_failed`, `http_status`, `timeout`, `event_timeout`... */
  code: string;
  /** Whether the last error could have been retried (its retries ran out). */
  retryable: boolean;
  /** The HTTP status a target answered with. */
  status?: number;
}

/**
 * Why a step waits for a limit: `rate` (the bucket is empty), `concurrency`
 * (every slot is taken), `retry_after` (a target asked for a pause) or
 * `queued` (its turn comes at the limiter's next pass).
 */
export type HeldReason = "rate" | "concurrency" | "retry_after" | "queued";

/** Why a PENDING step is held back by its limits (not sent to a worker yet). */
export interface Held {
  /** The limit key that holds it. */
  key: string;
  reason: HeldReason;
  /** When it may go, where that is known (a rate's next token, a pause's end). */
  until?: string | null;
}

/** One task of a run: a node's step (or a MAP's item). */
export interface Task {
  id: string;
  node_id: string;
  node_type: string;
  state: TaskState;
  attempt: number;
  /** The node's evaluated config (`{}` until it starts). */
  input: JsonValue;
  output: JsonValue;
  error: string | null;
  /** What is known of its failure besides `error`. */
  error_info?: ErrorInfo;
  wake_at: string | null;
  started_at: string | null;
  finished_at: string | null;
  /** A MAP item's MAP task. */
  parent_task_id?: string;
  /** A MAP item's position (its `node_id` is `ship_each[3]`). */
  item_index?: number;
  /** A MAP task's item counts. */
  progress?: MapProgress;
  /** A step its limits hold back (newer coordinators). */
  held?: Held;
}

/**
 * A run. Lists (and `startRun`) give summaries: no `input`, `output` or
 * `tasks`; `getRun` gives all of it (`output` once there is one).
 */
export interface Run {
  id: string;
  workflow: string;
  version: number;
  workflow_id: string;
  status: RunStatus;
  input?: JsonValue;
  output?: JsonValue;
  error: string | null;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
  /**
   * What started the run when not an API call: a schedule (`{schedule,
   * fire_time}`, with `backfill: true` for a backfilled fire time) or an
   * event's trigger (`{event, event_id, trigger}`, the trigger's place in
   * the definition's `triggers`).
   */
  trigger?: JsonValue;
  /** A SUB_WORKFLOW's child run: the run and task that started it. */
  parent_run_id?: string;
  parent_task_id?: string;
  /** A LOOP's child run: the iteration it is (from 0). */
  parent_iteration?: number;
  /** A hook's run (a failure handler, `on_success`, `on_end`): the run whose end started it. */
  handles_run_id?: string;
  /** The failure handler runs this run's end started, oldest first (`getRun` of a FAILED or CANCELLED run). */
  failure_handler_run_ids?: string[];
  /** Every hook's run this run's end started (`on_failure`, `on_success`, `on_end`), oldest first (`getRun` of an ended run). */
  hook_runs?: Array<{ hook: "on_failure" | "on_success" | "on_end" | "deadline"; run_id: string }>;
  /** Its tags, `{key: value}`: the definition's, evaluated, and the start's. */
  tags?: Record<string, string> | null;
  tasks?: Task[];
  /** The OpenTelemetry trace its spans go to (32 hex digits): its own id, or its caller's trace. */
  trace_id: string;
  /** 1 (served first) to 5 (last): its start's, else its definition's (3 by default); `setRunPriority` changes it. */
  priority: number;
  /** Whose work it is (its definition's `fairness_key`, evaluated): runs and steps of different keys take turns. Absent when it has none. */
  fairness_key?: string;
}

/** `GET /v1/runs`: a page of runs, newest first; `next_cursor` fetches the next. */
export interface RunList {
  runs: Run[];
  next_cursor: string | null;
}

/** `POST /v1/runs`, as sent. */
export interface StartRun {
  workflow: string;
  version?: number;
  input?: JsonValue;
  idempotency_key?: string;
  /** Tags of this run (at most 16), with the definition's. */
  tags?: Record<string, string>;
  /** 1 (served first) to 5 (last), instead of its definition's. Newer coordinators only. */
  priority?: number;
}

/** `PUT /v1/runs/{id}/priority`, as sent. */
export interface SetPriority {
  /** 1 (served first) to 5 (last). */
  priority: number;
}

/** One line of a run's history. */
export interface HistoryEntry {
  seq: number;
  type: HistoryKind;
  payload: JsonValue;
  created_at: string;
}

/** `GET /v1/runs/{id}/events`: oldest first; `next_after` fetches the next page. */
export interface HistoryPage {
  events: HistoryEntry[];
  next_after: number | null;
}

/** `GET /v1/runs/{id}/items?node=`: a MAP's items by index. */
export interface ItemPage {
  items: Task[];
  next_after: number | null;
}

/** What became of an IN_DOUBT attempt: it took effect, it did not (for good), or send it again. */
export type ResolveOutcome = "completed" | "failed" | "retry";

/** `POST /v1/runs/{id}/tasks/{node}/resolve`, as sent. */
export interface ResolveTask {
  outcome: ResolveOutcome;
  /** With `completed`: the step's output. */
  output?: JsonValue;
  /** With `failed`: the step's error. */
  error?: string;
  /** Why, for the run's history (at most 1,024 characters). */
  reason?: string;
}

/** `POST /v1/events`, as sent. */
export interface SendEvent {
  name: string;
  /** Which waiting steps it is for (`""` by default: an event only for triggers). */
  key?: string;
  payload?: JsonValue;
  /** The sender's id (1 to 256 characters): sent again with the same name and id, the event is recorded once. Newer coordinators only. */
  id?: string;
}

/** A run an event's trigger started. */
export interface TriggeredRun {
  workflow: string;
  /** The trigger's place in the definition's `triggers`. */
  trigger: number;
  run_id: string;
  /** The replay that started it (`POST /v1/events/replay`); absent when the event's sending did. */
  replayed_by?: string;
}

/** A trigger that matched an event but started no run, and why. */
export interface TriggerFailure {
  workflow: string;
  trigger: number;
  error: string;
}

/**
 * What a trigger's flow control (`debounce`, `batch`, `throttle`, `singleton`)
 * did with an event that has no run: held for a later run, replaced by a
 * later event, or dropped, and why.
 */
export interface TriggerHeld {
  workflow: string;
  trigger: number;
  /** `debounce`, `batch`, `throttle` or `singleton`. */
  flow: string;
  note: string;
}

/** What `POST /v1/events` did. The fields after `buffered` come from newer coordinators. */
export interface EventSent {
  /** Waiting tasks the event completed. */
  matched: number;
  /** No task waited: the event is kept for one to come. */
  buffered: boolean;
  /** The event's id: the sender's, or one made for it. */
  id?: string;
  /** Waiting steps the event completed (as `matched`). */
  delivered_to_waiters?: number;
  /** The runs its workflows' triggers started (for a duplicate, those the first sending started). */
  started_runs?: TriggeredRun[];
  /** Triggers that matched but started no run, and why. */
  trigger_errors?: TriggerFailure[];
  /** An event of this name and id was recorded before: nothing was done again. */
  duplicate?: boolean;
  /** Triggers whose flow control took the event without starting a run for it now. */
  held?: TriggerHeld[];
}

/** An event as the coordinator recorded it, with what it did (`GET /v1/events`). */
export interface RecordedEvent {
  seq: number;
  name: string;
  id: string;
  key: string;
  /** `null` when `payload_omitted`. */
  payload: JsonValue;
  /** The payload's size, as JSON text. */
  payload_bytes: number;
  /** The payload is over 64 KiB and left out of lists. */
  payload_omitted: boolean;
  /** `api`, or `webhook:NAME` for a webhook's delivery. */
  source: string;
  delivered_to_waiters: number;
  started_runs: TriggeredRun[];
  trigger_errors: TriggerFailure[];
  /** Triggers whose flow control holds the event, replaced it or dropped it. */
  held?: TriggerHeld[];
  received_at: string;
}

/** `GET /v1/events`: newest first; `next_before` fetches the next page. */
export interface EventPage {
  events: RecordedEvent[];
  next_before: number | null;
}

// -- schedules and webhooks -------------------------------------------------

/**
 * What a backfilled fire time does while a run of the schedule is open:
 * `allow` (all at once, the default), `skip` (it starts none) or
 * `buffer_all` (one at a time, oldest first).
 */
export type BackfillOverlap = "allow" | "skip" | "buffer_all";

/** `POST /v1/schedules/{id}/backfill`, as sent: the fire times in `[from, to)`. */
export interface BackfillRequest {
  from: string;
  /** At most now. */
  to: string;
  overlap?: BackfillOverlap | null;
}

/** What a backfill queued; the coordinator starts the runs unless the schedule is `paused`. */
export interface BackfillQueued {
  schedule: string;
  /** Fire times of the cron in the range. */
  fire_times: number;
  /** Of those, queued now. */
  queued: number;
  /** Of those, started, queued or buffered before: nothing new. */
  already: number;
  first_fire_time: string | null;
  last_fire_time: string | null;
  overlap: BackfillOverlap;
  /** The schedule is paused: the queued fire times start once it is resumed. */
  paused: boolean;
}

/** How a webhook's deliveries are signed (HMAC-SHA256 with its secret). */
export type WebhookScheme = "stripe" | "github";

/** A webhook as it is created (`POST /v1/webhooks`). */
export interface WebhookDefinition {
  name: string;
  scheme: WebhookScheme;
  /** The NAME of the signing secret (`[A-Z0-9_]{1,64}`): each coordinator reads `COMPOSER_WEBHOOK_SECRET_<secret>`. Never the secret itself. */
  secret: string;
  /** How far a `stripe` delivery's signed timestamp may be from now (`"5m"` by default, at most `"1h"`). */
  tolerance?: string | null;
  /** The event, a template over `{body, headers}` yielding `{name, key?, id?, payload?}`. */
  event?: JsonValue;
}

/** A webhook as the API shows it. */
export interface Webhook {
  name: string;
  scheme: WebhookScheme;
  secret: string;
  tolerance?: string | null;
  event?: JsonValue;
  /** Where the other service sends its deliveries (a path on the coordinator). */
  url: string;
  /** Whether this coordinator has `COMPOSER_WEBHOOK_SECRET_<secret>` set (deliveries are refused with 503 until it has). */
  secret_set: boolean;
  created_at: string;
  updated_at: string;
}

/** `GET /v1/webhooks`: every webhook, by name. */
export interface WebhookList {
  webhooks: Webhook[];
}

/** What a delete answers: the name (or limit key) it deleted. */
export interface Deleted {
  deleted: string;
}

// -- namespaces ---------------------------------------------------------------

/** A namespace to create (`POST /v1/namespaces`). */
export interface CreateNamespace {
  /** 1 to 63 lowercase letters, digits and `-`, starting with a letter. */
  name: string;
  /** At most 1,000 characters. */
  description?: string;
}

/**
 * A namespace: its own workflows, runs, schedules, webhooks, limits,
 * events, bulk jobs, queues and audit log.
 */
export interface Namespace {
  name: string;
  description: string;
  /** `active`, or `deleting` (no longer served; its data is being dropped). */
  state: string;
  /** The key (or token) that created it. */
  created_by: string;
  created_at: string;
  /** Its quotas; a quota absent is none. */
  quotas: NamespaceQuotas;
  /** What it uses of them (`getNamespace` only). */
  usage?: NamespaceUsage;
}

/**
 * A namespace's quotas (`PUT /v1/namespaces/{name}/quotas`): a change past
 * one is a 429 `over_quota` naming it, with `Retry-After`.
 */
export interface NamespaceQuotas {
  /** Runs queued, running or paused at once. */
  open_runs?: number;
  /** Runs started from outside a run (the API, schedules, triggers) in one second, across coordinators. */
  starts_per_second?: number;
  schedules?: number;
  /** Limit keys with values. */
  limits?: number;
  /** Bytes the namespace's tables and indexes hold. */
  stored_bytes?: number;
}

/** What a namespace uses of each quota. */
export interface NamespaceUsage {
  open_runs: number;
  schedules: number;
  limits: number;
  stored_bytes: number;
}

/** `GET /v1/namespaces`: `default` first, then by name. */
export interface NamespaceList {
  namespaces: Namespace[];
}

// -- limits -------------------------------------------------------------------

/** Whose values a limit has: the definitions' that use it, or an operator's (`setLimit`). */
export type LimitSetBy = "definition" | "api";

/** A limit on steps across runs, with its use now (`GET /v1/limits/{key}`). */
export interface Limit {
  key: string;
  /** `"N/period"`, when it has a rate. */
  rate?: string | null;
  burst?: number | null;
  concurrency?: number | null;
  /** `definition` (as the nodes that use it say) or `api` (set by `setLimit`, which definitions no longer change). */
  set_by: LimitSetBy;
  /** Tokens in the bucket now (a rate only). */
  tokens?: number | null;
  /** Steps of the key sent and not finished. */
  in_use: number;
  /** Steps waiting for it. */
  waiting: number;
  /** A target's `Retry-After` holds it until then. */
  held_until?: string | null;
  updated_at: string;
}

/** `GET /v1/limits`: limits in key order; `next_after` fetches the next page. */
export interface LimitPage {
  limits: Limit[];
  next_after: string | null;
}

// -- the task API (workers) ------------------------------------------------

/** `POST /v1/tasks/poll`, as sent. */
export interface PollTasks {
  worker_id: string;
  queues: string[];
  /** 1 to 100 (default 1). */
  max?: number;
  /** `"20s"`, `"500ms"`: at most the server's limit (60 s by default). */
  wait?: string;
  /** Only tasks of runs at this priority or a more urgent one (1 to 5; default 5: any). */
  priority_at_most?: number;
}

/** A task leased to a worker. */
export interface LeasedTask {
  id: string;
  run_id: string;
  attempt: number;
  node_id: string;
  node_type: string;
  queue: string;
  /** The node's evaluated config; `${ .secrets.NAME }` references are left for the worker. */
  input: JsonValue;
  /** The lease lasts this long from now: heartbeat well within it. */
  lease_ttl_ms: number;
  /** The W3C `traceparent` of this attempt's span, for the worker to pass on in what it calls; newer coordinators only. */
  traceparent?: string;
  /** The run's priority, 1 (most urgent) to 5; send it back in the result's `composer-priority` header. Newer coordinators only. */
  priority?: number;
  /** When the attempt passed each stage on its way here; send it back in the result's `stages` for its span. */
  stages?: StageTimes;
}

/** When one attempt passed each stage, in microseconds since the Unix epoch (all optional). */
export interface StageTimes {
  dispatched_at_us?: number;
  published_at_us?: number;
  read_at_us?: number;
  leased_at_us?: number;
  started_at_us?: number;
  finished_at_us?: number;
}

/** `POST /v1/tasks/poll`'s answer (no tasks when none came in time). */
export interface TaskBatch {
  tasks: LeasedTask[];
  /** The priorities (1 to 5) at which tasks of the polled queues still wait; absent when the coordinator does not know. */
  waiting?: number[];
}

/** What heartbeats, completions and failures name: whose lease, on which attempt. */
export interface TaskHeartbeat {
  worker_id: string;
  run_id: string;
  attempt: number;
}

/** `POST /v1/tasks/{id}/heartbeat`'s answer. */
export interface LeaseExtended {
  lease_ttl_ms: number;
}

/**
 * Eager dispatch: with a completion or a failure, ask for up to `max` of the
 * tasks the result makes ready on `queues`, leased to the reporting worker in
 * the result's own commit and answered in `ReportAck.next` (instead of
 * through a poll). Newer coordinators only: an older one refuses it with 400.
 */
export interface TakeNext {
  /** 1 to 32 queue names (`[A-Za-z0-9_.-]{1,128}`, not `.` or `..`). */
  queues: string[];
  /** 1 to 16 (default 1). */
  max?: number;
}

/** `POST /v1/tasks/{id}/complete`, as sent. */
export interface CompleteTask extends TaskHeartbeat {
  output?: JsonValue;
  /** Take the tasks this result makes ready with the answer; newer coordinators only. */
  next?: TakeNext;
  /** The leased task's `stages`, with when the handler started and ended, for the attempt's span. */
  stages?: StageTimes;
}

/** `POST /v1/tasks/{id}/fail`, as sent. */
export interface FailTask extends TaskHeartbeat {
  /** At most 65,536 characters. */
  error: string;
  /** Retry under the node's policy (default true); false fails the step for good. */
  retryable?: boolean;
  /** A stable name for what went wrong (`[a-z0-9_.-]{1,64}`), for failure edges; newer coordinators only. */
  code?: string;
  /** The HTTP status a target answered with (100 to 599); newer coordinators only. */
  status?: number;
  /** A 429's `Retry-After`, in milliseconds (with `status` 429 only); newer coordinators only. */
  retry_after_ms?: number;
  /** Take the tasks this result makes ready (an immediate retry of this one among them) with the answer; newer coordinators only. */
  next?: TakeNext;
  /** The leased task's `stages`, with when the handler started and ended, for the attempt's span. */
  stages?: StageTimes;
}

/** The answer to a completion or a failure: `ignored` says why one was not applied. */
export interface ReportAck {
  applied: boolean;
  ignored?: string;
  /**
   * The tasks leased to the reporting worker with this answer, as its `next`
   * asked (absent when none): run each as one a poll leased.
   */
  next?: LeasedTask[];
}

// -- errors -----------------------------------------------------------------

/** The stable error codes the server sends (others may come). */
export type ErrorCode =
  | "invalid_request"
  | "invalid_definition"
  | "invalid_schedule"
  | "not_found"
  | "run_not_found"
  | "conflict"
  | "lease_lost"
  | "idempotency_key_reused"
  | "payload_too_large"
  | "uri_too_long"
  | "unsupported_media_type"
  | "unauthorized"
  | "host_not_allowed"
  | "origin_not_allowed"
  | "method_not_allowed"
  | "unavailable"
  | "draining"
  | "busy"
  | "over_quota"
  | "forbidden"
  | "engine_fault"
  | "internal"
  | (string & {});

/** An error answer's detail. */
export interface ErrorDetail {
  code: ErrorCode;
  message: string;
}

/** Every error answer: `{"error": {"code", "message"}}`. */
export interface ErrorBody {
  error: ErrorDetail;
}
