/**
 * The fields of each type, checked by the compiler against the types
 * (`satisfies Shape<T>`: every field, none more, and which are optional), so
 * that the tests can compare the types with the OpenAPI document and with
 * what a live server answers.
 */

import assert from "node:assert/strict";

import type {
  BackfillOverlap,
  BackfillQueued,
  BackfillRequest,
  CompleteTask,
  ConcurrencyLimit,
  CreateNamespace,
  Deleted,
  EdgeDefinition,
  ErrorBody,
  ErrorInfo,
  ErrorDetail,
  EventPage,
  EventSent,
  FailTask,
  Held,
  HeldReason,
  HistoryEntry,
  HistoryKind,
  HistoryPage,
  ItemPage,
  LeasedTask,
  LeaseExtended,
  Limit,
  LimitDefinition,
  LimitPage,
  LimitSetBy,
  LimitValues,
  MapProgress,
  Namespace,
  NamespaceList,
  NamespaceQuotas,
  NamespaceUsage,
  NodeDefinition,
  On429,
  OnFailureDefinition,
  HookDefinition,
  DeadlineDefinition,
  DeadlineStartDefinition,
  PollTasks,
  RecordedEvent,
  ReportAck,
  ResolveOutcome,
  ResolveTask,
  RetryPolicy,
  Run,
  RunList,
  RunStatus,
  SendEvent,
  SetPriority,
  StartRun,
  TakeNext,
  Task,
  TaskBatch,
  StageTimes,
  TaskHeartbeat,
  TaskState,
  TriggerDefinition,
  DebounceSpec,
  BatchSpec,
  ThrottleSpec,
  TriggeredRun,
  UpdateAnswer,
  UpdateDefinition,
  UpdateRequest,
  TriggerFailure,
  TriggerHeld,
  Webhook,
  WebhookDefinition,
  WebhookList,
  WebhookScheme,
  Workflow,
  WorkflowDefinition,
  WorkflowList,
} from "../src/index.js";

type Presence = "required" | "optional";
type IsOptional<T, K extends keyof T> = {} extends Pick<T, K> ? true : false;
/** Each field of `T`, and whether it may be missing. */
export type Shape<T> = { readonly [K in keyof T]-?: IsOptional<T, K> extends true ? "optional" : "required" };
export type AnyShape = Readonly<Record<string, Presence>>;

export const runShape = {
  id: "required",
  workflow: "required",
  version: "required",
  workflow_id: "required",
  status: "required",
  input: "optional",
  output: "optional",
  error: "required",
  created_at: "required",
  updated_at: "required",
  finished_at: "required",
  trigger: "optional",
  parent_run_id: "optional",
  parent_task_id: "optional",
  parent_iteration: "optional",
  handles_run_id: "optional",
  failure_handler_run_ids: "optional",
  hook_runs: "optional",
  tags: "optional",
  tasks: "optional",
  trace_id: "required",
  priority: "required",
  fairness_key: "optional",
} as const satisfies Shape<Run>;

export const taskShape = {
  id: "required",
  node_id: "required",
  node_type: "required",
  state: "required",
  attempt: "required",
  input: "required",
  output: "required",
  error: "required",
  error_info: "optional",
  wake_at: "required",
  started_at: "required",
  finished_at: "required",
  parent_task_id: "optional",
  item_index: "optional",
  progress: "optional",
  held: "optional",
} as const satisfies Shape<Task>;

export const heldShape = { key: "required", reason: "required", until: "optional" } as const satisfies Shape<Held>;

export const errorInfoShape = { code: "required", retryable: "required", status: "optional" } as const satisfies Shape<ErrorInfo>;

export const mapProgressShape = {
  total: "required",
  queued: "required",
  open: "required",
  completed: "required",
  failed: "required",
  created: "optional",
} as const satisfies Shape<MapProgress>;

export const runListShape = { runs: "required", next_cursor: "required" } as const satisfies Shape<RunList>;
export const historyEntryShape = {
  seq: "required",
  type: "required",
  payload: "required",
  created_at: "required",
} as const satisfies Shape<HistoryEntry>;
export const historyPageShape = { events: "required", next_after: "required" } as const satisfies Shape<HistoryPage>;
export const itemPageShape = { items: "required", next_after: "required" } as const satisfies Shape<ItemPage>;
export const workflowShape = {
  id: "required",
  name: "required",
  version: "required",
  created_at: "required",
  spec: "optional",
  versions: "optional",
  versions_next: "optional",
} as const satisfies Shape<Workflow>;
export const workflowListShape = { workflows: "required" } as const satisfies Shape<WorkflowList>;
export const eventSentShape = {
  matched: "required",
  buffered: "required",
  id: "optional",
  delivered_to_waiters: "optional",
  started_runs: "optional",
  trigger_errors: "optional",
  duplicate: "optional",
  held: "optional",
} as const satisfies Shape<EventSent>;
export const triggeredRunShape = { workflow: "required", trigger: "required", run_id: "required", replayed_by: "optional" } as const satisfies Shape<TriggeredRun>;
export const triggerFailureShape = { workflow: "required", trigger: "required", error: "required" } as const satisfies Shape<TriggerFailure>;
export const triggerHeldShape = { workflow: "required", trigger: "required", flow: "required", note: "required" } as const satisfies Shape<TriggerHeld>;
export const recordedEventShape = {
  seq: "required",
  name: "required",
  id: "required",
  key: "required",
  payload: "required",
  payload_bytes: "required",
  payload_omitted: "required",
  source: "required",
  delivered_to_waiters: "required",
  started_runs: "required",
  trigger_errors: "required",
  held: "optional",
  received_at: "required",
} as const satisfies Shape<RecordedEvent>;
export const eventPageShape = { events: "required", next_before: "required" } as const satisfies Shape<EventPage>;
export const backfillQueuedShape = {
  schedule: "required",
  fire_times: "required",
  queued: "required",
  already: "required",
  first_fire_time: "required",
  last_fire_time: "required",
  overlap: "required",
  paused: "required",
} as const satisfies Shape<BackfillQueued>;
export const webhookShape = {
  name: "required",
  scheme: "required",
  secret: "required",
  tolerance: "optional",
  event: "optional",
  url: "required",
  secret_set: "required",
  created_at: "required",
  updated_at: "required",
} as const satisfies Shape<Webhook>;
export const webhookListShape = { webhooks: "required" } as const satisfies Shape<WebhookList>;
export const deletedShape = { deleted: "required" } as const satisfies Shape<Deleted>;
export const namespaceShape = {
  name: "required",
  description: "required",
  state: "required",
  created_by: "required",
  created_at: "required",
  quotas: "required",
  usage: "optional",
} as const satisfies Shape<Namespace>;
export const namespaceQuotasShape = {
  open_runs: "optional",
  starts_per_second: "optional",
  schedules: "optional",
  limits: "optional",
  stored_bytes: "optional",
} as const satisfies Shape<NamespaceQuotas>;
export const namespaceUsageShape = {
  open_runs: "required",
  schedules: "required",
  limits: "required",
  stored_bytes: "required",
} as const satisfies Shape<NamespaceUsage>;
export const namespaceListShape = { namespaces: "required" } as const satisfies Shape<NamespaceList>;
export const limitShape = {
  key: "required",
  rate: "optional",
  burst: "optional",
  concurrency: "optional",
  set_by: "required",
  tokens: "optional",
  in_use: "required",
  waiting: "required",
  held_until: "optional",
  updated_at: "required",
} as const satisfies Shape<Limit>;
export const limitPageShape = { limits: "required", next_after: "required" } as const satisfies Shape<LimitPage>;
export const leasedTaskShape = {
  id: "required",
  run_id: "required",
  attempt: "required",
  node_id: "required",
  node_type: "required",
  queue: "required",
  input: "required",
  lease_ttl_ms: "required",
  traceparent: "optional",
  priority: "optional",
  stages: "optional",
} as const satisfies Shape<LeasedTask>;
export const stageTimesShape = {
  dispatched_at_us: "optional",
  published_at_us: "optional",
  read_at_us: "optional",
  leased_at_us: "optional",
  started_at_us: "optional",
  finished_at_us: "optional",
} as const satisfies Shape<StageTimes>;
export const taskBatchShape = { tasks: "required", waiting: "optional" } as const satisfies Shape<TaskBatch>;
export const leaseExtendedShape = { lease_ttl_ms: "required" } as const satisfies Shape<LeaseExtended>;
export const reportAckShape = { applied: "required", ignored: "optional", next: "optional" } as const satisfies Shape<ReportAck>;
export const errorBodyShape = { error: "required" } as const satisfies Shape<ErrorBody>;
export const errorDetailShape = { code: "required", message: "required" } as const satisfies Shape<ErrorDetail>;

// What the client sends.
export const startRunShape = {
  workflow: "required",
  version: "optional",
  input: "optional",
  idempotency_key: "optional",
  tags: "optional",
  priority: "optional",
} as const satisfies Shape<StartRun>;
export const setPriorityShape = { priority: "required" } as const satisfies Shape<SetPriority>;
export const sendEventShape = { name: "required", key: "optional", payload: "optional", id: "optional" } as const satisfies Shape<SendEvent>;
export const triggerShape = {
  event: "required",
  when: "optional",
  input: "optional",
  idempotency_key: "optional",
  key: "optional",
  debounce: "optional",
  batch: "optional",
  throttle: "optional",
  singleton: "optional",
} as const satisfies Shape<TriggerDefinition>;
export const debounceShape = { period: "required", leading: "optional", max_wait: "optional" } as const satisfies Shape<DebounceSpec>;
export const batchShape = { max_size: "required", max_wait: "required" } as const satisfies Shape<BatchSpec>;
export const throttleShape = { count: "required", period: "required", excess: "optional" } as const satisfies Shape<ThrottleSpec>;
export const backfillShape = { from: "required", to: "required", overlap: "optional" } as const satisfies Shape<BackfillRequest>;
export const webhookDefinitionShape = {
  name: "required",
  scheme: "required",
  secret: "required",
  tolerance: "optional",
  event: "optional",
} as const satisfies Shape<WebhookDefinition>;
export const createNamespaceShape = { name: "required", description: "optional" } as const satisfies Shape<CreateNamespace>;
export const pollTasksShape = {
  worker_id: "required",
  queues: "required",
  max: "optional",
  wait: "optional",
  priority_at_most: "optional",
} as const satisfies Shape<PollTasks>;
export const heartbeatShape = { worker_id: "required", run_id: "required", attempt: "required" } as const satisfies Shape<TaskHeartbeat>;
export const takeNextShape = { queues: "required", max: "optional" } as const satisfies Shape<TakeNext>;
export const completeShape = {
  ...heartbeatShape,
  output: "optional",
  next: "optional",
  stages: "optional",
} as const satisfies Shape<CompleteTask>;
export const failShape = {
  ...heartbeatShape,
  error: "required",
  retryable: "optional",
  code: "optional",
  status: "optional",
  retry_after_ms: "optional",
  next: "optional",
  stages: "optional",
} as const satisfies Shape<FailTask>;
export const definitionShape = {
  name: "required",
  nodes: "required",
  edges: "optional",
  output: "optional",
  timeout: "optional",
  concurrency: "optional",
  description: "optional",
  on_failure: "optional",
  on_success: "optional",
  on_end: "optional",
  deadlines: "optional",
  tags: "optional",
  triggers: "optional",
  priority: "optional",
  fairness_key: "optional",
  input_schema: "optional",
} as const satisfies Shape<WorkflowDefinition>;
export const onFailureShape = {
  workflow: "required",
  version: "optional",
  input: "optional",
  on: "optional",
} as const satisfies Shape<OnFailureDefinition>;
export const hookShape = {
  workflow: "required",
  version: "optional",
  input: "optional",
} as const satisfies Shape<HookDefinition>;
export const nodeShape = {
  id: "required",
  type: "required",
  queue: "optional",
  config: "optional",
  retry: "optional",
  timeout: "optional",
  delivery: "optional",
  limits: "optional",
  deadlines: "optional",
  updates: "optional",
} as const satisfies Shape<NodeDefinition>;
export const updateDefinitionShape = {
  name: "required",
  validate: "optional",
  refusal: "optional",
  output: "optional",
} as const satisfies Shape<UpdateDefinition>;
export const updateRequestShape = {
  name: "required",
  payload: "optional",
  id: "optional",
  timeout: "optional",
} as const satisfies Shape<UpdateRequest>;
export const updateAnswerShape = {
  id: "required",
  name: "required",
  node: "required",
  accepted: "required",
  output: "optional",
  reason: "optional",
  duplicate: "required",
} as const satisfies Shape<UpdateAnswer>;
export const deadlineShape = { after: "required", start: "required" } as const satisfies Shape<DeadlineDefinition>;
export const deadlineStartShape = {
  workflow: "required",
  version: "optional",
  input: "optional",
} as const satisfies Shape<DeadlineStartDefinition>;
export const limitValuesShape = { rate: "optional", burst: "optional", concurrency: "optional" } as const satisfies Shape<LimitValues>;
export const limitDefinitionShape = { key: "required", ...limitValuesShape } as const satisfies Shape<LimitDefinition>;
export const resolveShape = {
  outcome: "required",
  output: "optional",
  error: "optional",
  reason: "optional",
} as const satisfies Shape<ResolveTask>;
export const edgeShape = { from: "required", to: "required", when: "optional", on: "optional" } as const satisfies Shape<EdgeDefinition>;
export const retryShape = {
  max_attempts: "optional",
  initial_backoff: "optional",
  multiplier: "optional",
  max_backoff: "optional",
  on_429: "optional",
} as const satisfies Shape<RetryPolicy>;
export const concurrencyShape = { max: "required", key: "optional" } as const satisfies Shape<ConcurrencyLimit>;

/** The OpenAPI schema each answer's type stands for. */
export const answers: Record<string, AnyShape> = {
  RunView: runShape,
  TaskView: taskShape,
  ErrorInfo: errorInfoShape,
  MapProgress: mapProgressShape,
  RunPage: runListShape,
  HistoryEntryView: historyEntryShape,
  HistoryPage: historyPageShape,
  ItemPage: itemPageShape,
  DefinitionView: workflowShape,
  WorkflowList: workflowListShape,
  EventSent: eventSentShape,
  UpdateAnswer: updateAnswerShape,
  TriggeredRun: triggeredRunShape,
  TriggerFailure: triggerFailureShape,
  TriggerHeld: triggerHeldShape,
  EventView: recordedEventShape,
  EventPage: eventPageShape,
  BackfillQueued: backfillQueuedShape,
  WebhookView: webhookShape,
  WebhookList: webhookListShape,
  Deleted: deletedShape,
  NamespaceView: namespaceShape,
  NamespaceQuotas: namespaceQuotasShape,
  NamespaceUsage: namespaceUsageShape,
  NamespaceList: namespaceListShape,
  HeldView: heldShape,
  LimitView: limitShape,
  LimitPage: limitPageShape,
  LeasedTask: leasedTaskShape,
  StageTimes: stageTimesShape,
  TaskBatch: taskBatchShape,
  LeaseExtended: leaseExtendedShape,
  ReportAck: reportAckShape,
  ErrorBody: errorBodyShape,
  ErrorDetail: errorDetailShape,
};

/** The OpenAPI schema each request's type stands for. */
export const requests: Record<string, AnyShape> = {
  StartRun: startRunShape,
  SetPriority: setPriorityShape,
  SendEvent: sendEventShape,
  PollTasks: pollTasksShape,
  TaskHeartbeat: heartbeatShape,
  CompleteTask: completeShape,
  FailTask: failShape,
  TakeNext: takeNextShape,
  WorkflowSpec: definitionShape,
  TriggerSpec: triggerShape,
  DebounceSpec: debounceShape,
  BatchSpec: batchShape,
  ThrottleSpec: throttleShape,
  BackfillRequest: backfillShape,
  WebhookSpec: webhookDefinitionShape,
  CreateNamespace: createNamespaceShape,
  OnFailureSpec: onFailureShape,
  HookSpec: hookShape,
  DeadlineSpec: deadlineShape,
  DeadlineStartSpec: deadlineStartShape,
  UpdateSpec: updateDefinitionShape,
  UpdateRequest: updateRequestShape,
  ResolveTask: resolveShape,
  NodeSpec: nodeShape,
  EdgeSpec: edgeShape,
  RetrySpec: retryShape,
  ConcurrencySpec: concurrencyShape,
  LimitValuesSpec: limitValuesShape,
  LimitSpec: limitDefinitionShape,
};

/** Every value of each enumeration (the compiler checks there are all and no more). */
export const runStatuses: Record<RunStatus, true> = {
  QUEUED: true,
  RUNNING: true,
  PAUSED: true,
  SUCCEEDED: true,
  FAILED: true,
  CANCELLED: true,
};
export const taskStates: Record<TaskState, true> = {
  QUEUED: true,
  PENDING: true,
  RUNNING: true,
  WAITING: true,
  IN_DOUBT: true,
  COMPLETED: true,
  FAILED: true,
  SKIPPED: true,
  CANCELLED: true,
};
export const historyKinds: Record<HistoryKind, true> = {
  RunStarted: true,
  TaskDispatched: true,
  TaskWaiting: true,
  TaskRetryScheduled: true,
  TaskCompleted: true,
  TaskFailed: true,
  TaskSkipped: true,
  TaskCancelled: true,
  RunSucceeded: true,
  RunFailed: true,
  RunCancelled: true,
  RunRetried: true,
  RunPaused: true,
  RunResumed: true,
  EventIgnored: true,
  MapStarted: true,
  TaskInDoubt: true,
  TaskResolved: true,
  TaskReset: true,
  HandlerStarted: true,
  RunRerun: true,
  PriorityChanged: true,
  RunMigrated: true,
  DeadlinePassed: true,
  ApprovalVoted: true,
  ApprovalEscalated: true,
};

export const resolveOutcomes: Record<ResolveOutcome, true> = { completed: true, failed: true, retry: true };
export const backfillOverlaps: Record<BackfillOverlap, true> = { allow: true, skip: true, buffer_all: true };
export const webhookSchemes: Record<WebhookScheme, true> = { stripe: true, github: true };
export const on429s: Record<On429, true> = { respect: true, ignore: true };
export const heldReasons: Record<HeldReason, true> = { rate: true, concurrency: true, retry_after: true, queued: true };
export const limitSetBys: Record<LimitSetBy, true> = { definition: true, api: true };

/** Asserts `value` has every required field of `shape` and no field it lacks. */
export function conforms(value: unknown, shape: AnyShape, what: string): void {
  assert.ok(value !== null && typeof value === "object" && !Array.isArray(value), `${what}: not an object`);
  for (const key of Object.keys(value)) {
    assert.ok(key in shape, `${what}: the server sent ${JSON.stringify(key)}, which the type lacks`);
  }
  for (const [key, presence] of Object.entries(shape)) {
    if (presence === "required") assert.ok(key in value, `${what}: the server left out the required ${key}`);
  }
}

/** A run as the server sent it, its tasks included. */
export function checkRun(run: unknown, what = "run"): void {
  const { created: _, ...raw } = run as Run & { created?: boolean };
  conforms(raw, runShape, what);
  assert.ok(raw.status in runStatuses, `${what}: unknown status ${raw.status}`);
  for (const t of raw.tasks ?? []) checkTask(t, `${what}.tasks[${t.node_id}]`);
}

export function checkTask(task: Task, what = "task"): void {
  conforms(task, taskShape, what);
  assert.ok(task.state in taskStates, `${what}: unknown state ${task.state}`);
  if (task.progress !== undefined) conforms(task.progress, mapProgressShape, `${what}.progress`);
  if (task.error_info !== undefined) conforms(task.error_info, errorInfoShape, `${what}.error_info`);
  if (task.held !== undefined) {
    conforms(task.held, heldShape, `${what}.held`);
    assert.ok(task.held.reason in heldReasons, `${what}.held: unknown reason ${task.held.reason}`);
  }
}

/** A limit as the server sent it. */
export function checkLimit(limit: Limit, what = "limit"): void {
  conforms(limit, limitShape, what);
  assert.ok(limit.set_by in limitSetBys, `${what}: unknown set_by ${limit.set_by}`);
}

export function checkWorkflow(wf: unknown, what = "workflow"): void {
  const { created: _, ...raw } = wf as Workflow & { created?: boolean };
  conforms(raw, workflowShape, what);
  for (const v of raw.versions ?? []) conforms(v, workflowShape, `${what}.versions[]`);
}

/** An event as `POST /v1/events` answered it, its started runs and trigger errors included. */
export function checkEventSent(sent: EventSent, what = "event sent"): void {
  conforms(sent, eventSentShape, what);
  for (const r of sent.started_runs ?? []) conforms(r, triggeredRunShape, `${what}.started_runs[]`);
  for (const f of sent.trigger_errors ?? []) conforms(f, triggerFailureShape, `${what}.trigger_errors[]`);
}

/** A page of the event log as the server sent it. */
export function checkEventPage(page: EventPage, what = "event page"): void {
  conforms(page, eventPageShape, what);
  for (const e of page.events) {
    conforms(e, recordedEventShape, `${what}.events[]`);
    e.started_runs.forEach((r) => conforms(r, triggeredRunShape, `${what}.events[].started_runs[]`));
    e.trigger_errors.forEach((f) => conforms(f, triggerFailureShape, `${what}.events[].trigger_errors[]`));
  }
}

export function checkWebhook(hook: unknown, what = "webhook"): void {
  const { created: _, ...raw } = hook as Webhook & { created?: boolean };
  conforms(raw, webhookShape, what);
  assert.ok(raw.scheme in webhookSchemes, `${what}: unknown scheme ${raw.scheme}`);
}

/** A namespace as the server sent it (`created` aside). */
export function checkNamespace(namespace: unknown, what = "namespace"): void {
  const { created: _, ...raw } = namespace as Namespace & { created?: boolean };
  conforms(raw, namespaceShape, what);
}

export function checkHistory(entry: HistoryEntry, what = "history entry"): void {
  conforms(entry, historyEntryShape, what);
  assert.ok(entry.type in historyKinds, `${what}: unknown type ${entry.type}`);
}
