/**
 * The client and the worker against a real `composer dev` (its embedded
 * PostgreSQL and Redis), started once for this file with an API token and a
 * 2 s task lease. COMPOSER_BIN names the binary (default
 * ../../target/debug/composer from the package).
 */

import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { after, before, describe, it } from "node:test";

import {
  Client,
  ComposerError,
  ConflictError,
  InvalidRequestError,
  LeaseLostError,
  NotFoundError,
  RUN_STATUSES,
  s,
  serve,
  TaskError,
  UnauthorizedError,
  UnavailableError,
  WaitTimeoutError,
  Worker,
  workflow,
  type JsonValue,
  type NodeDefinition,
  type ReportAck,
  type Run,
  type TaskBatch,
  type WorkerOptions,
  type WorkflowDefinition,
} from "../src/index.js";
import { PACKAGE_DIR, startDev, type Dev } from "./dev.js";
import { eventually, fakeServer, json, memoryLogger, spyFetch } from "./helpers.js";
import {
  answers,
  backfillOverlaps,
  backfillQueuedShape,
  checkEventPage,
  checkEventSent,
  checkHistory,
  checkLimit,
  checkNamespace,
  checkRun,
  checkTask,
  checkWebhook,
  checkWorkflow,
  conforms,
  deletedShape,
  errorBodyShape,
  historyKinds,
  itemPageShape,
  leasedTaskShape,
  leaseExtendedShape,
  limitPageShape,
  on429s,
  reportAckShape,
  requests,
  runListShape,
  resolveOutcomes,
  runStatuses,
  taskBatchShape,
  taskStates,
  updateAnswerShape,
  webhookSchemes,
  type AnyShape,
} from "./shapes.js";

let dev: Dev;
let client: Client;
let operations: Promise<Set<string>> | undefined;

/** Whether the server's API document has this operation (a newer coordinator's). */
async function hasOperation(id: string): Promise<boolean> {
  operations ??= fetch(`${dev.url}/openapi.json`)
    .then((r) => r.json() as Promise<{ paths: Record<string, Record<string, { operationId?: string }>> }>)
    .then((doc) => new Set(Object.values(doc.paths).flatMap((p) => Object.values(p).map((o) => o.operationId ?? ""))));
  return (await operations).has(id);
}

/** A call the client has no method for (a schedule's): its answer, or a thrown error naming the status. */
async function api(method: "GET" | "POST", path: string, body?: unknown): Promise<Record<string, unknown>> {
  const init: RequestInit = { method, headers: { "content-type": "application/json", authorization: `Bearer ${dev.token}` } };
  if (body !== undefined) init.body = JSON.stringify(body);
  const r = await fetch(`${dev.url}${path}`, init);
  const text = await r.text();
  assert.ok(r.ok, `${method} ${path}: ${r.status} ${text}`);
  return JSON.parse(text) as Record<string, unknown>;
}

/** A node of a custom type on `queue`, retried fast. */
function custom(id: string, type: string, queue: string, config: Record<string, JsonValue> = {}): NodeDefinition {
  return { id, type, queue, config, retry: { max_attempts: 3, initial_backoff: "50ms" } };
}

/** A W3C traceparent (version 00), its trace id in group 1. */
const W3C = /^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$/;

/** A new trace id (32 hex digits). */
function traceId(): string {
  return randomBytes(16).toString("hex");
}

/** A W3C traceparent of a span of ours in the trace `id`. */
function traceparent(id: string): string {
  return `00-${id}-${randomBytes(8).toString("hex")}-01`;
}

/** Registers `definition` and starts a run of it with `input`. */
async function start(definition: WorkflowDefinition, input: JsonValue = {}): Promise<string> {
  await client.registerWorkflow(definition);
  const run = await client.startRun({ workflow: definition.name, input });
  assert.equal(run.created, true);
  return run.id;
}

function waitFor(id: string, timeoutMs = 60_000): Promise<Run> {
  return client.waitForRun(id, { timeoutMs });
}

/** A worker of the test server with quick polls and a logger the test can read. */
function worker(options: Partial<WorkerOptions> = {}) {
  const logger = memoryLogger();
  const w = new Worker({ url: dev.url, token: dev.token, pollWaitMs: 500, logger, ...options });
  return Object.assign(w, { logger });
}

/**
 * What `w` logged besides the warnings at start for handlers whose type's
 * default queue it does not poll (every worker here polls queues of its own,
 * which its nodes name).
 */
function linesAfterStart(w: { logger: { lines: string[] } }): string[] {
  return w.logger.lines.filter((l) => !/^warn: worker \S+: handler for type '[^']*': .* which this worker does not poll/.test(l));
}

/** Runs `body` while `w` runs; then stops it, which must take less than 30 s. */
async function whileRunning<T>(w: Worker, body: () => Promise<T>): Promise<T> {
  const running = w.run();
  let failed: unknown;
  running.catch((e: unknown) => (failed = e));
  try {
    return await body();
  } finally {
    const stopped = await Promise.race([w.stop().then(() => true), delay(30_000).then(() => false)]);
    assert.ok(stopped, "the worker did not stop");
    assert.equal(failed, undefined, `run() failed: ${String(failed)}`);
  }
}

/** The run once its task of `node` is in `state`. */
function taskState(id: string, node: string, state: string): Promise<Run> {
  return eventually(`${node} ${state}`, async () => {
    const run = await client.getRun(id);
    return run.tasks?.find((t) => t.node_id === node)?.state === state ? run : undefined;
  });
}

/** A deferred promise. */
function signal<T = void>() {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/** The example worker in a child process (build/examples/resize_worker.js). */
function exampleWorker(env: Record<string, string>): { child: ChildProcess; stderr: () => string; exit: Promise<number | null> } {
  let stderr = "";
  const child = spawn(process.execPath, [join(PACKAGE_DIR, "build", "examples", "resize_worker.js")], {
    env: { ...process.env, COMPOSER_URL: dev.url, COMPOSER_WORKER_TOKEN: dev.token, ...env },
    stdio: ["ignore", "ignore", "pipe"],
  });
  child.stderr?.setEncoding("utf8").on("data", (c: string) => (stderr += c));
  const exit = new Promise<number | null>((res) => child.once("exit", (code) => res(code)));
  return { child, stderr: () => stderr, exit };
}

async function rejection(p: Promise<unknown>): Promise<ComposerError> {
  const e = await p.then(
    () => assert.fail("expected an error"),
    (e: unknown) => e,
  );
  assert.ok(e instanceof ComposerError, `not a ComposerError: ${String(e)}`);
  return e;
}

const waitForEvent = (name: string, timeout?: string): WorkflowDefinition => ({
  name,
  nodes: [
    { id: "w", type: "WAIT_FOR_EVENT", config: { event: `${name}.go`, key: "${ .input.key }", ...(timeout ? { timeout } : {}) } },
    { id: "t", type: "TRANSFORM", config: { output: { got: "${ .nodes.w.output }" } } },
  ],
  edges: [{ from: "w", to: "t" }],
});

describe("against composer dev", { timeout: 600_000 }, () => {
  before(async () => {
    dev = await startDev();
    client = new Client({ url: dev.url, token: dev.token });
  });
  after(async () => {
    await dev?.stop();
  });

  describe("Client", () => {
    it("registers a workflow: a new version when it changed, the latest when identical", async () => {
      const def: WorkflowDefinition = {
        name: "ts-register",
        nodes: [{ id: "greet", type: "TRANSFORM", config: { output: { hello: "${ .input.name }" } } }],
      };
      const v1 = await client.registerWorkflow(def);
      checkWorkflow(v1);
      assert.equal(v1.created, true);
      assert.equal(v1.version, 1);
      const again = await client.registerWorkflow(def);
      assert.equal(again.created, false);
      assert.equal(again.id, v1.id);
      const v2 = await client.registerWorkflow({ ...def, description: "now described" });
      assert.equal(v2.created, true);
      assert.equal(v2.version, 2);

      const got = await client.getWorkflow("ts-register");
      checkWorkflow(got);
      assert.equal(got.version, 2);
      assert.equal(got.spec?.description, "now described");
      assert.deepEqual(got.spec?.nodes, def.nodes);
      assert.deepEqual(got.versions?.map((v) => v.version), [2, 1]);
      const paged = await client.getWorkflow("ts-register", { limit: 1 });
      assert.deepEqual(paged.versions?.map((v) => v.version), [2]);
      assert.equal(paged.versions_next, 2);
      const older = await client.getWorkflow("ts-register", { limit: 1, before: 2 });
      assert.deepEqual(older.versions?.map((v) => v.version), [1]);
      const first = await client.getWorkflowVersion("ts-register", 1);
      assert.equal(first.spec?.description, undefined);
      const all = await client.listWorkflows();
      all.forEach((w) => checkWorkflow(w));
      assert.equal(all.find((w) => w.name === "ts-register")?.version, 2);

      const bad = await rejection(client.registerWorkflow({ name: "ts-bad", nodes: [] }));
      assert.ok(bad instanceof InvalidRequestError);
      assert.equal(bad.status, 400);
      assert.equal(bad.code, "invalid_definition");
      assert.match(bad.message, /at least one node/);
    });

    it("starts a run with its input (which arrives), pinned to a version, once per idempotency key", async () => {
      const def: WorkflowDefinition = {
        name: "ts-echo",
        nodes: [{ id: "echo", type: "TRANSFORM", config: { output: { got: "${ .input }", v: 1 } } }],
      };
      await client.registerWorkflow(def);
      const input = { order: 42, items: ["a", "b"], nested: { ok: true, none: null }, text: "ünïcode ✓" };
      const started = await client.startRun({ workflow: "ts-echo", input });
      checkRun(started);
      assert.equal(started.created, true);
      assert.equal(started.workflow, "ts-echo");
      assert.equal(started.input, undefined, "a summary");
      const run = await waitFor(started.id);
      checkRun(run);
      assert.equal(run.status, "SUCCEEDED");
      assert.deepEqual(run.input, input);
      assert.deepEqual(run.output, { echo: { got: input, v: 1 } });
      assert.deepEqual((await client.getRun(started.id)).input, input);

      await client.registerWorkflow({ ...def, nodes: [{ ...def.nodes[0]!, config: { output: { v: 2 } } }] });
      const pinned = await waitFor((await client.startRun({ workflow: "ts-echo", input, version: 1 })).id);
      assert.equal(pinned.version, 1);
      assert.deepEqual(pinned.output, { echo: { got: input, v: 1 } });
      const latest = await waitFor((await client.startRun({ workflow: "ts-echo" })).id);
      assert.equal(latest.version, 2);
      assert.deepEqual(latest.input, {}, "the input defaults to {}");

      const once = await client.startRun({ workflow: "ts-echo", input: { n: 1 }, idempotencyKey: "ts-key-1" });
      const twice = await client.startRun({ workflow: "ts-echo", input: { n: 1 }, idempotencyKey: "ts-key-1" });
      assert.equal(once.created, true);
      assert.equal(twice.created, false);
      assert.equal(twice.id, once.id);
      const reused = await rejection(client.startRun({ workflow: "ts-echo", input: { n: 2 }, idempotencyKey: "ts-key-1" }));
      assert.ok(reused instanceof InvalidRequestError);
      assert.equal(reused.status, 422);
      assert.equal(reused.code, "idempotency_key_reused");
    });

    it("sends a traceparent with a start or an event: the run's steps are in the caller's trace", async () => {
      const name = "ts-trace";
      const event = `${name}.go`;
      await client.registerWorkflow({ name, nodes: [custom("step", "traced", name)], triggers: [{ event }] });
      // Leases the run's task by the task API (as a worker would), completes it, answers its trace id.
      const leasedTrace = async (runId: string): Promise<string> => {
        const poll = { worker_id: "ts-trace", queues: [name], max: 1, wait: "1s" };
        const batch = await eventually(`a task of ${runId}`, async () => {
          const b = (await api("POST", "/v1/tasks/poll", poll)) as unknown as TaskBatch;
          return b.tasks.length > 0 ? b : undefined;
        });
        const task = batch.tasks[0]!;
        assert.equal(task.run_id, runId);
        await api("POST", `/v1/tasks/${task.id}/complete`, { worker_id: "ts-trace", run_id: runId, attempt: task.attempt, output: {} });
        const match = W3C.exec(task.traceparent ?? "");
        assert.ok(match, JSON.stringify(task));
        return match[1]!;
      };

      // The header as the API takes it: accepted (201), and the run's step is in its trace.
      let trace = traceId();
      const r = await fetch(`${dev.url}/v1/runs`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${dev.token}`, traceparent: traceparent(trace) },
        body: JSON.stringify({ workflow: name }),
      });
      assert.equal(r.status, 201);
      assert.equal(await leasedTrace(((await r.json()) as Run).id), trace);

      // startRun and sendEvent send it.
      trace = traceId();
      const started = await client.startRun({ workflow: name, traceparent: traceparent(trace) });
      assert.equal(started.created, true, "201");
      assert.equal(await leasedTrace(started.id), trace);
      trace = traceId();
      const sent = await client.sendEvent(event, "", null, { traceparent: traceparent(trace) });
      assert.deepEqual(sent.started_runs?.map((s) => s.workflow), [name]);
      assert.equal(await leasedTrace(sent.started_runs![0]!.run_id), trace);

      // Without one, or with one that does not read, a run's trace id is its id.
      for (const given of [undefined, "00-not-a-trace-context"]) {
        const run = await client.startRun({ workflow: name, traceparent: given });
        assert.equal(await leasedTrace(run.id), run.id.replaceAll("-", ""));
      }
    });

    it("waits for a run to end, and gives up at its timeout with the run as last seen", async () => {
      const id = await start({ name: "ts-wait", nodes: [{ id: "nap", type: "WAIT", config: { duration: "1s" } }] });
      const began = Date.now();
      const run = await waitFor(id);
      assert.equal(run.status, "SUCCEEDED");
      assert.ok(Date.now() - began >= 500, "it waited for the timer");
      assert.equal(run.tasks?.[0]?.state, "COMPLETED");

      const waiting = await start(waitForEvent("ts-wait-event"), { key: "never" });
      const t0 = Date.now();
      const e = await rejection(client.waitForRun(waiting, { timeoutMs: 1500 }));
      assert.ok(e instanceof WaitTimeoutError);
      assert.equal(e.run.id, waiting);
      assert.equal(e.run.status, "RUNNING");
      assert.ok(Date.now() - t0 >= 1400 && Date.now() - t0 < 10_000, `${Date.now() - t0} ms`);
      await client.cancelRun(waiting);
    });

    it("lists runs newest first, page by page, filtered, and iterates over every page", async () => {
      await client.registerWorkflow({ name: "ts-list", nodes: [{ id: "x", type: "TRANSFORM", config: { output: 1 } }] });
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) {
        const run = await client.startRun({ workflow: "ts-list", input: { i } });
        ids.push(run.id);
        await waitFor(run.id);
      }
      const newestFirst = [...ids].reverse();
      const p1 = await client.listRuns({ workflow: "ts-list", limit: 2 });
      conforms(p1, runListShape, "run list");
      p1.runs.forEach((r) => checkRun(r, "listed run"));
      assert.deepEqual(p1.runs.map((r) => r.id), newestFirst.slice(0, 2));
      assert.ok(p1.runs.every((r) => r.input === undefined && r.output === undefined && r.tasks === undefined), "summaries");
      assert.ok(p1.next_cursor);
      const p2 = await client.listRuns({ workflow: "ts-list", limit: 2, cursor: p1.next_cursor });
      assert.deepEqual(p2.runs.map((r) => r.id), newestFirst.slice(2, 4));
      const p3 = await client.listRuns({ workflow: "ts-list", limit: 2, cursor: p2.next_cursor });
      assert.deepEqual(p3.runs.map((r) => r.id), newestFirst.slice(4));
      assert.equal(p3.next_cursor, null);

      const iterated: string[] = [];
      for await (const run of client.iterateRuns({ workflow: "ts-list", limit: 2 })) iterated.push(run.id);
      assert.deepEqual(iterated, newestFirst);
      const exact: string[] = [];
      for await (const run of client.iterateRuns({ workflow: "ts-list", limit: 5 })) exact.push(run.id);
      assert.deepEqual(exact, newestFirst, "a last page that is full, then an empty one");

      assert.equal((await client.listRuns({ workflow: "ts-list", status: "succeeded" })).runs.length, 5);
      assert.deepEqual((await client.listRuns({ workflow: "ts-list", status: "FAILED" })).runs, []);
      assert.ok((await client.listRuns()).runs.length >= 5);
    });

    it("reads a run's history, whole or by page", async () => {
      const run = await waitFor((await client.startRun({ workflow: "ts-list" })).id);
      const events = await client.runEvents(run.id);
      events.forEach((e) => checkHistory(e));
      assert.deepEqual(events.map((e) => e.type), ["RunStarted", "TaskCompleted", "RunSucceeded"]);
      const first = await client.runEventsPage(run.id, { limit: 1 });
      assert.deepEqual(first.events, events.slice(0, 1));
      assert.equal(first.next_after, events[0]?.seq);
      const second = await client.runEventsPage(run.id, { after: first.next_after ?? undefined, limit: 1 });
      assert.deepEqual(second.events, events.slice(1, 2));
    });

    it("sends an event that completes a WAIT_FOR_EVENT run with its payload", async () => {
      const id = await start(waitForEvent("ts-event"), { key: "order-7" });
      await taskState(id, "w", "WAITING");
      const sent = await client.sendEvent("ts-event.go", "order-7", { carrier: "ups", n: 1 });
      checkEventSent(sent);
      assert.deepEqual([sent.matched, sent.buffered], [1, false]);
      const run = await waitFor(id);
      assert.equal(run.status, "SUCCEEDED");
      assert.deepEqual(run.output, { t: { got: { carrier: "ups", n: 1 } } });
      const nobody = await client.sendEvent("ts-event.go", "nobody-waits");
      assert.deepEqual([nobody.matched, nobody.buffered], [0, true]);
    });

    it("sends an update a waiting step validates, answered with its output once per id", async (t) => {
      if (!(await hasOperation("updateRun"))) {
        t.skip("this coordinator is older than updates");
        return;
      }
      const definition = waitForEvent("ts-update");
      definition.nodes[0]!.updates = [{ name: "approve", validate: ".update.payload.amount <= 100", refusal: "too much" }];
      const id = await start(definition, { key: "k" });
      await taskState(id, "w", "WAITING");
      const refused = await client.updateRun(id, "approve", { amount: 500 }, { id: "ts-u1" });
      conforms(refused, updateAnswerShape, "refused update");
      assert.deepEqual([refused.accepted, refused.reason, refused.node], [false, "too much", "w"]);
      const accepted = await client.updateRun(id, "approve", { amount: 5 }, { id: "ts-u2" });
      assert.deepEqual([accepted.accepted, accepted.output, accepted.duplicate], [true, { amount: 5 }, false]);
      const again = await client.updateRun(id, "approve", { amount: 5 }, { id: "ts-u2" });
      assert.deepEqual([again.accepted, again.duplicate], [true, true]);
      const run = await waitFor(id);
      assert.deepEqual(run.output, { t: { got: { amount: 5 } } });
      const late = await rejection(client.updateRun(id, "approve", { amount: 1 }, { timeout: "0s" }));
      assert.equal(late.status, 409);
    });

    it("starts the runs of an event's triggers, once per event id", async (t) => {
      if (!(await hasOperation("listEvents"))) {
        t.skip("this coordinator is older than event triggers");
        return;
      }
      const event = "ts-trigger.created";
      await client.registerWorkflow({
        name: "ts-trigger",
        nodes: [{ id: "echo", type: "TRANSFORM", config: { output: "${ .input }" } }],
        triggers: [
          { event, when: ".event.payload.total > 10", input: { order: "${ .event.payload.id }" } },
          { event, when: ".event.payload.total > 100", input: "${ .event.payload.id.deep }" },
        ],
      });
      assert.equal((await client.getWorkflow("ts-trigger")).spec?.triggers?.length, 2);

      const sent = await client.sendEvent(event, undefined, { id: "o-1", total: 20 }, { id: "ts-evt-1" });
      checkEventSent(sent);
      assert.deepEqual([sent.id, sent.duplicate, sent.trigger_errors], ["ts-evt-1", false, []]);
      assert.deepEqual(sent.started_runs?.map((r) => [r.workflow, r.trigger]), [["ts-trigger", 0]]);
      const runId = sent.started_runs?.[0]?.run_id ?? "";
      const run = await waitFor(runId);
      checkRun(run);
      assert.equal(run.status, "SUCCEEDED");
      assert.deepEqual(run.input, { order: "o-1" });
      assert.deepEqual(run.trigger, { event, event_id: "ts-evt-1", trigger: 0 });

      // The same name and id again: recorded once, answered with the first sending's run.
      const again = await client.sendEvent(event, "", { id: "o-1", total: 20 }, { id: "ts-evt-1" });
      checkEventSent(again);
      assert.deepEqual([again.id, again.duplicate], ["ts-evt-1", true]);
      assert.deepEqual(again.started_runs?.map((r) => r.run_id), [runId]);
      assert.deepEqual((await client.listRuns({ workflow: "ts-trigger" })).runs.map((r) => r.id), [runId]);

      // A `when` that does not hold starts nothing; a trigger whose input fails says why.
      const small = await client.sendEvent(event, "", { id: "o-2", total: 5 });
      assert.deepEqual([small.started_runs, small.duplicate], [[], false]);
      assert.ok(small.id && small.id !== "ts-evt-1", "an id is made for an event sent without one");
      const big = await client.sendEvent(event, "", { id: "o-3", total: 500 }, { id: "ts-evt-3" });
      checkEventSent(big);
      assert.deepEqual(big.started_runs?.map((r) => r.trigger), [0]);
      assert.deepEqual(big.trigger_errors?.map((f) => [f.workflow, f.trigger]), [["ts-trigger", 1]]);
      assert.match(big.trigger_errors?.[0]?.error ?? "", /input/);
      assert.equal((await client.listRuns({ workflow: "ts-trigger" })).runs.length, 2);

      const recorded = [];
      for await (const e of client.iterateEvents({ name: event })) recorded.push(e);
      assert.deepEqual(recorded.map((e) => e.id), ["ts-evt-3", small.id, "ts-evt-1"]);
      assert.deepEqual(recorded[2]?.started_runs, sent.started_runs);
      assert.deepEqual(recorded[0]?.trigger_errors, big.trigger_errors);
      assert.deepEqual([recorded[2]?.key, recorded[2]?.source], ["", "api"]);
    });

    it("lists the event log newest first, page by page, and iterates over every page", async (t) => {
      if (!(await hasOperation("listEvents"))) {
        t.skip("this coordinator is older than GET /v1/events");
        return;
      }
      const name = "ts-log";
      const ids: Array<string | undefined> = [];
      for (let i = 0; i < 5; i++) ids.push((await client.sendEvent(name, `k-${i}`, { i }, { id: `ts-log-${i}` })).id);
      assert.deepEqual(ids, [0, 1, 2, 3, 4].map((i) => `ts-log-${i}`));
      const newestFirst = [...ids].reverse();
      const p1 = await client.listEvents({ name, limit: 2 });
      checkEventPage(p1);
      assert.deepEqual(p1.events.map((e) => e.id), newestFirst.slice(0, 2));
      assert.ok(p1.next_before !== null);
      const p2 = await client.listEvents({ name, limit: 2, before: p1.next_before });
      assert.deepEqual(p2.events.map((e) => e.id), newestFirst.slice(2, 4));
      const p3 = await client.listEvents({ name, limit: 2, before: p2.next_before });
      assert.deepEqual(p3.events.map((e) => e.id), newestFirst.slice(4));
      assert.equal(p3.next_before, null);

      const iterated: string[] = [];
      for await (const e of client.iterateEvents({ name, limit: 2 })) iterated.push(e.id);
      assert.deepEqual(iterated, newestFirst);
      const exact: string[] = [];
      for await (const e of client.iterateEvents({ name, limit: 5 })) exact.push(e.id);
      assert.deepEqual(exact, newestFirst, "a last page that is full, then maybe an empty one");
      const older: string[] = [];
      for await (const e of client.iterateEvents({ name, before: p1.next_before, limit: 1 })) older.push(e.id);
      assert.deepEqual(older, newestFirst.slice(2));

      const oldest = p3.events[0];
      assert.deepEqual(
        [oldest?.name, oldest?.key, oldest?.payload, oldest?.source, oldest?.delivered_to_waiters, oldest?.started_runs, oldest?.trigger_errors],
        [name, "k-0", { i: 0 }, "api", 0, [], []],
      );
      assert.ok(Math.abs(Date.now() - Date.parse(oldest?.received_at ?? "")) < 300_000);
      assert.equal((await client.listEvents({ name, source: "api" })).events.length, 5);
      assert.deepEqual((await client.listEvents({ name, source: "webhook:nobody" })).events, []);
      const badLimit = await rejection(client.listEvents({ limit: 0 }));
      assert.ok(badLimit instanceof InvalidRequestError);
      assert.match(badLimit.message, /limit/);
      const badId = await rejection(client.sendEvent(name, "", null, { id: "" }));
      assert.ok(badId instanceof InvalidRequestError);
      assert.match(badId.message, /id/);
    });

    it("backfills a schedule: its past fire times are queued once and their runs start", async (t) => {
      if (!(await hasOperation("backfillSchedule"))) {
        t.skip("this coordinator is older than POST /v1/schedules/{id}/backfill");
        return;
      }
      await client.registerWorkflow({ name: "ts-hourly", nodes: [{ id: "x", type: "TRANSFORM", config: { output: "${ .input }" } }] });
      await api("POST", "/v1/schedules", { id: "ts-hourly", workflow: "ts-hourly", cron: "0 * * * *", input: { n: 1 } });
      const hour = new Date();
      hour.setUTCMinutes(0, 0, 0);
      const HOUR = 3_600_000;
      const from = new Date(hour.getTime() - 3 * HOUR);
      const queued = await client.backfillSchedule("ts-hourly", { from, to: hour });
      conforms(queued, backfillQueuedShape, "backfill queued");
      assert.deepEqual(
        [queued.schedule, queued.fire_times, queued.queued, queued.already, queued.overlap, queued.paused],
        ["ts-hourly", 3, 3, 0, "allow", false],
      );
      assert.equal(Date.parse(queued.first_fire_time ?? ""), from.getTime());
      assert.equal(Date.parse(queued.last_fire_time ?? ""), hour.getTime() - HOUR);

      type Fired = { schedule?: string; fire_time?: string; backfill?: boolean } | undefined;
      const runs = await eventually("3 backfilled runs", async () => {
        const backfilled = (await client.listRuns({ workflow: "ts-hourly" })).runs.filter((r) => (r.trigger as Fired)?.backfill === true);
        return backfilled.length >= 3 ? backfilled : undefined;
      });
      const fireTimes = runs.map((r) => Date.parse((r.trigger as Fired)?.fire_time ?? "")).sort((a, b) => a - b);
      assert.deepEqual(fireTimes, [0, 1, 2].map((i) => from.getTime() + i * HOUR));
      for (const r of runs) {
        checkRun(r);
        assert.equal((r.trigger as Fired)?.schedule, "ts-hourly");
        const done = await waitFor(r.id);
        assert.equal(done.status, "SUCCEEDED");
        assert.deepEqual(done.input, { n: 1 });
      }

      // Asked again (as RFC 3339 text), nothing is queued twice.
      const again = await client.backfillSchedule("ts-hourly", { from: from.toISOString(), to: hour.toISOString(), overlap: "skip" });
      assert.deepEqual([again.fire_times, again.queued, again.already, again.overlap], [3, 0, 3, "skip"]);
      const view = await api("GET", "/v1/schedules/ts-hourly");
      assert.equal(typeof view["backfill_queued"], "number");
      const future = await rejection(client.backfillSchedule("ts-hourly", { from: hour, to: new Date(hour.getTime() + 2 * HOUR) }));
      assert.ok(future instanceof InvalidRequestError);
      assert.deepEqual([future.status, future.code], [400, "invalid_schedule"]);
      assert.match(future.message, /future/);
      assert.ok((await rejection(client.backfillSchedule("ts-hourly", { from: hour, to: from }))) instanceof InvalidRequestError);
      assert.ok((await rejection(client.backfillSchedule("ts-no-such-schedule", { from, to: hour }))) instanceof NotFoundError);
    });

    it("creates, replaces, reads, lists and deletes webhooks; the secret is only named", async (t) => {
      if (!(await hasOperation("createWebhook"))) {
        t.skip("this coordinator is older than webhooks");
        return;
      }
      const made = await client.createWebhook({ name: "ts-hook", scheme: "stripe", secret: "TS_UNSET" });
      checkWebhook(made);
      assert.deepEqual([made.name, made.scheme, made.secret], ["ts-hook", "stripe", "TS_UNSET"]);
      assert.deepEqual([made.created, made.secret_set], [true, false], "no COMPOSER_WEBHOOK_SECRET_TS_UNSET");
      assert.match(made.url, /\/v1\/webhooks\/ts-hook$/);
      assert.equal(made.tolerance ?? null, null);

      const replaced = await client.createWebhook({ name: "ts-hook", scheme: "stripe", secret: "TS_UNSET", tolerance: "10m" });
      checkWebhook(replaced);
      assert.deepEqual([replaced.created, replaced.tolerance], [false, "10m"]);
      assert.equal(replaced.created_at, made.created_at);
      const got = await client.getWebhook("ts-hook");
      checkWebhook(got);
      assert.deepEqual({ ...got, created: false }, replaced);
      const all = await client.listWebhooks();
      all.forEach((w) => checkWebhook(w));
      assert.deepEqual(all.find((w) => w.name === "ts-hook"), got);

      const deleted = await client.deleteWebhook("ts-hook");
      conforms(deleted, deletedShape, "deleted");
      assert.deepEqual(deleted, { deleted: "ts-hook" });
      assert.ok((await rejection(client.getWebhook("ts-hook"))) instanceof NotFoundError);
      assert.ok((await rejection(client.deleteWebhook("ts-hook"))) instanceof NotFoundError);
      assert.ok(!(await client.listWebhooks()).some((w) => w.name === "ts-hook"));
      const bad = await rejection(client.createWebhook({ name: "ts-hook", scheme: "github", secret: "whsec_the-secret-itself" }));
      assert.ok(bad instanceof InvalidRequestError);
      assert.match(bad.message, /secret/);
    });

    it("sets, reads, lists and deletes limits; a key with : and / stays one path segment", async (t) => {
      if (!(await hasOperation("setLimit"))) {
        t.skip("this coordinator is older than limits");
        return;
      }
      // Every reserved character of a URL, and those encodeURIComponent leaves.
      const key = "ts-limit:acct_1/eu west?#%+&=!'()*é";
      const made = await client.setLimit(key, { rate: "25/1s", burst: 5, concurrency: 2 });
      checkLimit(made);
      assert.deepEqual(
        [made.key, made.rate, made.burst, made.concurrency, made.set_by, made.in_use, made.waiting, made.held_until],
        [key, "25/1s", 5, 2, "api", 0, 0, undefined],
      );
      assert.equal(made.tokens, 5, "a full bucket");
      assert.ok(Number.isFinite(Date.parse(made.updated_at)));
      const got = await client.getLimit(key);
      checkLimit(got);
      assert.deepEqual({ ...got, tokens: 0 }, { ...made, tokens: 0 });

      const other = "ts-limit/only-concurrency";
      const only = await client.setLimit(other, { concurrency: 3 });
      assert.deepEqual([only.concurrency, only.rate, only.burst, only.tokens], [3, undefined, undefined, undefined]);
      const replaced = await client.setLimit(key, { rate: "1000/1h" });
      assert.deepEqual([replaced.rate, replaced.burst, replaced.concurrency], ["1000/1h", 1000, undefined]);

      const page = await client.listLimits({ limit: 1000 });
      conforms(page, limitPageShape, "limit page");
      page.limits.forEach((l) => checkLimit(l, "listed limit"));
      const keys = page.limits.map((l) => l.key);
      assert.ok(keys.includes(key) && keys.includes(other), keys.join(" "));
      assert.equal(page.next_after, null);
      const first = await client.listLimits({ limit: 1 });
      assert.deepEqual([first.limits.map((l) => l.key), first.next_after], [keys.slice(0, 1), keys[0]]);
      const iterated: string[] = [];
      for await (const l of client.iterateLimits({ limit: 1 })) iterated.push(l.key);
      assert.deepEqual(iterated, keys);
      const later: string[] = [];
      for await (const l of client.iterateLimits({ after: key, limit: 2 })) later.push(l.key);
      assert.deepEqual(later, keys.slice(keys.indexOf(key) + 1));

      const deleted = await client.deleteLimit(key);
      conforms(deleted, deletedShape, "deleted");
      assert.deepEqual(deleted, { deleted: key });
      const gone = await rejection(client.getLimit(key));
      assert.ok(gone instanceof NotFoundError);
      assert.deepEqual([gone.status, gone.code], [404, "not_found"]);
      assert.ok((await rejection(client.deleteLimit(key))) instanceof NotFoundError);
      assert.ok(!(await client.listLimits({ limit: 1000 })).limits.some((l) => l.key === key));
      await client.deleteLimit(other);
    });

    it("refuses a bad limit with a 400 naming its field", async (t) => {
      if (!(await hasOperation("setLimit"))) {
        t.skip("this coordinator is older than limits");
        return;
      }
      const bad = await rejection(client.setLimit("ts-limit-bad", { rate: "0/1s" }));
      assert.ok(bad instanceof InvalidRequestError);
      assert.deepEqual([bad.status, bad.code], [400, "invalid_request"]);
      assert.match(bad.message, /rate/);
      for (const values of [{ rate: "fast" }, { concurrency: 0 }, { rate: "1/1s", burst: 0 }]) {
        assert.ok((await rejection(client.setLimit("ts-limit-bad", values))) instanceof InvalidRequestError, JSON.stringify(values));
      }
      assert.ok((await rejection(client.getLimit("ts-limit-bad"))) instanceof NotFoundError);
      assert.ok((await rejection(client.listLimits({ limit: 0 }))) instanceof InvalidRequestError);
    });

    it("holds an HTTP step by its concurrency limit until the one before is done", async (t) => {
      if (!(await hasOperation("setLimit"))) {
        t.skip("this coordinator is older than limits");
        return;
      }
      let now = 0;
      let most = 0;
      const target = await fakeServer(async (_req, _body, res) => {
        most = Math.max(most, ++now);
        await delay(1500);
        now--;
        json(res, 200, { ok: true });
      });
      try {
        await client.registerWorkflow({
          name: "ts-solo",
          nodes: [{ id: "call", type: "HTTP", config: { url: `${target.url}/slow` }, limits: [{ key: "solo", concurrency: 1 }] }],
        });
        const ids = [(await client.startRun({ workflow: "ts-solo" })).id, (await client.startRun({ workflow: "ts-solo" })).id];
        const held = await eventually("a step held by the limit's concurrency", async () => {
          for (const id of ids) {
            const run = await client.getRun(id);
            checkRun(run);
            const task = run.tasks?.find((x) => x.node_id === "call");
            // `queued` until the limiter's next pass, then why it waits.
            if (task?.held?.reason === "concurrency") return task;
          }
          return undefined;
        });
        assert.equal(held.state, "PENDING");
        assert.deepEqual([held.held?.key, held.held?.reason], ["solo", "concurrency"]);
        const limit = await client.getLimit("solo");
        checkLimit(limit);
        assert.deepEqual([limit.concurrency, limit.set_by], [1, "definition"]);
        assert.ok(limit.in_use <= 1);
        const runs = await Promise.all(ids.map((id) => waitFor(id)));
        assert.deepEqual(runs.map((r) => r.status), ["SUCCEEDED", "SUCCEEDED"]);
        assert.deepEqual(runs.map((r) => (r.output as { call: { body: JsonValue } }).call.body), [{ ok: true }, { ok: true }]);
        assert.ok(runs.every((r) => r.tasks?.every((x) => x.held === undefined)), "no longer held");
        assert.equal(most, 1, "never two calls at once");
        assert.equal(target.requests.length, 2);
        const idle = await client.getLimit("solo");
        assert.deepEqual([idle.in_use, idle.waiting], [0, 0]);
      } finally {
        await target.close();
      }
    });

    it("cancels a run, and refuses to cancel it again", async () => {
      const id = await start(waitForEvent("ts-cancel"), { key: "c" });
      await taskState(id, "w", "WAITING");
      const cancelled = await client.cancelRun(id);
      checkRun(cancelled);
      assert.equal(cancelled.status, "CANCELLED");
      assert.equal(cancelled.tasks?.[0]?.state, "CANCELLED");
      assert.equal((await waitFor(id)).status, "CANCELLED");
      const again = await rejection(client.cancelRun(id));
      assert.ok(again instanceof ConflictError);
      assert.equal(again.status, 409);
      assert.equal(again.code, "conflict");
    });

    it("retries a failed run from its failed step", async () => {
      const id = await start(waitForEvent("ts-retry", "1s"), { key: "r" });
      const failed = await waitFor(id);
      assert.equal(failed.status, "FAILED");
      assert.match(failed.error ?? "", /timed out after 1s/);
      const retried = await client.retryRun(id);
      checkRun(retried);
      assert.equal(retried.status, "RUNNING");
      assert.equal(retried.tasks?.find((t) => t.node_id === "w")?.attempt, 2);
      await taskState(id, "w", "WAITING");
      assert.equal((await client.sendEvent("ts-retry.go", "r", "late but welcome")).matched, 1);
      const run = await waitFor(id);
      assert.equal(run.status, "SUCCEEDED");
      assert.deepEqual(run.output, { t: { got: "late but welcome" } });
      assert.ok((await client.runEvents(id)).some((e) => e.type === "RunRetried"));
      assert.ok((await rejection(client.retryRun(id))) instanceof ConflictError, "a succeeded run is not retried");
    });

    it("pauses a run (nothing new starts) and resumes it", async () => {
      const id = await start(waitForEvent("ts-pause"), { key: "p" });
      await taskState(id, "w", "WAITING");
      const paused = await client.pauseRun(id);
      assert.equal(paused.status, "PAUSED");
      assert.equal((await client.sendEvent("ts-pause.go", "p", { ok: 1 })).matched, 1);
      const held = await taskState(id, "w", "COMPLETED");
      await delay(500);
      const still = await client.getRun(id);
      assert.equal(still.status, "PAUSED");
      assert.equal(still.tasks?.find((t) => t.node_id === "t"), undefined, "the next step waits for resume");
      assert.equal(held.status, "PAUSED");
      assert.ok((await rejection(client.pauseRun(id))) instanceof ConflictError, "already paused");
      const resumed = await client.resumeRun(id);
      assert.ok(["RUNNING", "SUCCEEDED"].includes(resumed.status));
      const run = await waitFor(id);
      assert.equal(run.status, "SUCCEEDED");
      assert.deepEqual(run.output, { t: { got: { ok: 1 } } });
      const again = await rejection(client.resumeRun(id));
      assert.ok(again instanceof ConflictError);
      assert.match(again.message, /only a PAUSED run can be resumed/);
    });

    it("gives a run its start's or its definition's priority and fairness key, and another priority while it is open", async (t) => {
      if (!(await hasOperation("setRunPriority"))) {
        t.skip("this coordinator is older than PUT /v1/runs/{id}/priority");
        return;
      }
      await client.registerWorkflow(waitForEvent("ts-prio-child"));
      const def: WorkflowDefinition = {
        name: "ts-prio",
        nodes: [{ id: "sub", type: "SUB_WORKFLOW", config: { workflow: "ts-prio-child", input: { key: "${ .input.key }" } } }],
        priority: 2,
        fairness_key: "tenant-${ .input.tenant }",
      };
      await client.registerWorkflow(def);
      const spec = (await client.getWorkflow("ts-prio")).spec;
      assert.deepEqual([spec?.priority, spec?.fairness_key], [2, "tenant-${ .input.tenant }"]);

      const started = await client.startRun({ workflow: "ts-prio", input: { tenant: "acme", key: "p1" } });
      checkRun(started);
      assert.deepEqual([started.priority, started.fairness_key], [2, "tenant-acme"], "the definition's");
      const urgent = await client.startRun({ workflow: "ts-prio", input: { tenant: "acme", key: "p2" }, priority: 1 });
      assert.equal(urgent.priority, 1, "the start's instead of the definition's");
      await client.registerWorkflow({ name: "ts-prio-plain", nodes: [{ id: "x", type: "TRANSFORM", config: { output: 1 } }] });
      const plain = await waitFor((await client.startRun({ workflow: "ts-prio-plain" })).id);
      checkRun(plain);
      assert.equal(plain.priority, 3, "3 by default");
      assert.ok(!("fairness_key" in plain), "absent when it has none");

      const childOf = (id: string) =>
        eventually(`the child of ${id}`, async () => (await client.listRuns({ parentRunId: id })).runs[0]);
      const child = await childOf(started.id);
      checkRun(child, "child run");
      assert.deepEqual([child.priority, child.fairness_key], [2, "tenant-acme"], "its parent's");

      const changed = await client.setRunPriority(started.id, 4);
      checkRun(changed);
      assert.deepEqual([changed.id, changed.status, changed.priority], [started.id, "RUNNING", 4]);
      assert.deepEqual(changed.tasks?.map((t) => t.node_id), ["sub"], "the run in full");
      assert.equal((await client.getRun(started.id)).priority, 4);
      assert.equal((await client.getRun(child.id)).priority, 4, "the open runs under it too");
      assert.equal((await client.getRun(urgent.id)).priority, 1, "no other run");
      const lines = (await client.runEvents(started.id)).filter((e) => e.type === "PriorityChanged");
      assert.equal(lines.length, 1, JSON.stringify(lines));
      checkHistory(lines[0]!);
      const payload = lines[0]!.payload as { priority: number; from: number; actor: string };
      assert.deepEqual([payload.priority, payload.from, typeof payload.actor], [4, 2, "string"]);

      for (const bad of [0, 6, 2.5]) {
        const refused = await rejection(client.setRunPriority(started.id, bad));
        assert.ok(refused instanceof InvalidRequestError, String(refused));
        assert.equal(refused.status, 400);
        assert.ok((await rejection(client.startRun({ workflow: "ts-prio", priority: bad }))) instanceof InvalidRequestError);
      }
      assert.match((await rejection(client.setRunPriority(started.id, 9))).message, /priority/);
      assert.ok((await rejection(client.setRunPriority("00000000-0000-0000-0000-000000000000", 1))) instanceof NotFoundError);
      await client.cancelRun(started.id);
      await client.cancelRun(urgent.id);
      const ended = await rejection(client.setRunPriority(started.id, 1));
      assert.ok(ended instanceof ConflictError, String(ended));
      assert.equal(ended.status, 409);
      assert.equal((await client.getRun(started.id)).priority, 4);
    });

    it("resolves an IN_DOUBT step (delivery: at_most_once) whose worker died", async (t) => {
      if (!(await hasOperation("resolveTask"))) {
        t.skip("this coordinator is older than POST /v1/runs/{id}/tasks/{node}/resolve");
        return;
      }
      const id = await start({
        name: "ts-doubt",
        nodes: [{ ...custom("thumb", "resize-image", "images", { width: 16 }), delivery: "at_most_once" }],
      });
      const doomed = exampleWorker({ RESIZE_MS: "600000" });
      try {
        await taskState(id, "thumb", "RUNNING");
      } finally {
        doomed.child.kill("SIGKILL");
        await doomed.exit;
      }
      const doubt = await taskState(id, "thumb", "IN_DOUBT");
      checkRun(doubt);
      assert.equal(doubt.status, "RUNNING");
      const resolved = await client.resolveTask(id, "thumb", { outcome: "completed", output: { width: 16, by: "operator" } });
      checkRun(resolved);
      const run = await waitFor(id);
      assert.equal(run.status, "SUCCEEDED");
      assert.deepEqual(run.output, { thumb: { width: 16, by: "operator" } });
      assert.equal(run.tasks?.[0]?.attempt, 1);
      const kinds = (await client.runEvents(id)).map((e) => e.type);
      assert.ok(kinds.includes("TaskInDoubt") && kinds.includes("TaskResolved"), kinds.join(" "));
      const again = await rejection(client.resolveTask(id, "thumb", { outcome: "retry" }));
      assert.ok(again instanceof ConflictError, String(again));
      assert.ok((await rejection(client.resolveTask(id, "no-such-node", { outcome: "retry" }))) instanceof NotFoundError);
    });

    it("maps 404, 400 and 401 answers to their errors", async () => {
      const missing = await rejection(client.getRun("00000000-0000-0000-0000-000000000000"));
      assert.ok(missing instanceof NotFoundError);
      assert.deepEqual([missing.status, missing.code], [404, "not_found"]);
      assert.match(missing.message, /run 00000000-0000-0000-0000-000000000000 not found/);
      const notUuid = await rejection(client.getRun("not-a-uuid"));
      assert.ok(notUuid instanceof InvalidRequestError);
      assert.deepEqual([notUuid.status, notUuid.code], [400, "invalid_request"]);
      assert.match(notUuid.message, /expected a UUID/);
      assert.ok((await rejection(client.getWorkflow("ts-no-such"))) instanceof NotFoundError);
      assert.ok((await rejection(client.getWorkflowVersion("ts-list", 99))) instanceof NotFoundError);
      const noWorkflow = await rejection(client.startRun({ workflow: "ts-no-such" }));
      assert.ok(noWorkflow instanceof NotFoundError);
      assert.match(noWorkflow.message, /workflow "ts-no-such" not found/);
      assert.ok((await rejection(client.runEvents("00000000-0000-0000-0000-000000000000"))) instanceof NotFoundError);
      const badStatus = await rejection(client.listRuns({ status: "bogus" as "FAILED" }));
      assert.ok(badStatus instanceof InvalidRequestError);
      assert.match(badStatus.message, /status/);
      assert.ok((await rejection(client.listRuns({ limit: 5000 }))) instanceof InvalidRequestError);
      assert.ok((await rejection(client.sendEvent("", "k"))) instanceof InvalidRequestError);
      for (const token of ["wrong", undefined]) {
        const denied = await rejection(new Client({ url: dev.url, token }).listWorkflows());
        assert.ok(denied instanceof UnauthorizedError);
        assert.deepEqual([denied.status, denied.code], [401, "unauthorized"]);
      }
    });
  });

  describe("workflows in code", () => {
    it("registers by content, and ?version=N declares the version meant", async () => {
      const def = (v: number): WorkflowDefinition => ({ name: "ts-versioned", nodes: [{ id: "a", type: "TRANSFORM", config: { output: v } }] });
      const v1 = await client.registerWorkflow(def(1), { version: 1 });
      assert.deepEqual([v1.version, v1.created], [1, true]);
      const again = await client.registerWorkflow(def(1), { version: 1 });
      assert.deepEqual([again.version, again.created], [1, false]);
      const clash = await rejection(client.registerWorkflow(def(2), { version: 1 }));
      assert.ok(clash instanceof ConflictError, String(clash));
      assert.match(clash.message, /version 1 is registered with a different definition/);
      const gap = await rejection(client.registerWorkflow(def(2), { version: 3 }));
      assert.ok(gap instanceof ConflictError, String(gap));
      const v2 = await client.registerWorkflow(def(2), { version: 2 });
      assert.deepEqual([v2.version, v2.created], [2, true]);
      // Identical to an older version: that version, not a new one.
      const old = await client.registerWorkflow(def(1));
      assert.deepEqual([old.version, old.created], [1, false]);
    });

    it("serve() registers a workflow built in code and runs its typed steps; starts are checked against its input_schema", async () => {
      const wf = workflow("ts-coded", { input: s.object({ id: s.string(), amount: s.number() }), queue: "ts-coded" });
      const charge = wf.step("charge", {
        reads: { order: wf.input },
        output: s.object({ id: s.string(), cents: s.integer() }),
        handler: ({ order }) => ({ id: `ch-${order.id}`, cents: Math.round(order.amount * 100) }),
      });
      const label = wf.step("label", { reads: { id: charge.out.id }, handler: ({ id }, task) => `${id}@${task.attempt}` });
      const done = wf.returns(wf.transform("receipt", { charge: charge.out, label: label.out }).out);
      const stop = new AbortController();
      const registered: number[] = [];
      const serving = serve({
        url: dev.url,
        token: dev.token,
        workflows: [done],
        pollWaitMs: 500,
        logger: memoryLogger(),
        signal: stop.signal,
        onRegistered: (r) => registered.push(...r.map((w) => w.version)),
      });
      try {
        await eventually("registration", () => (registered.length > 0 ? true : undefined));
        const got = await client.getWorkflow("ts-coded");
        assert.deepEqual(got.spec?.input_schema, wf.definition().input_schema);
        const bad = await rejection(client.startRun({ workflow: "ts-coded", input: { id: 1, amount: 2 } }));
        assert.ok(bad instanceof InvalidRequestError, String(bad));
        assert.match(bad.message, /input_schema at \/id/);
        const id = await start(done.definition(), { id: "o1", amount: 1.5 });
        const run = await waitFor(id);
        assert.equal(run.status, "SUCCEEDED", JSON.stringify(run.error));
        assert.deepEqual(run.output, { charge: { id: "ch-o1", cents: 150 }, label: "ch-o1@1" });
      } finally {
        stop.abort();
        await serving;
      }
    });
  });

  describe("types", () => {
    it("have the fields of the OpenAPI document's schemas, and its enumerations", async () => {
      const resp = await fetch(`${dev.url}/openapi.json`);
      const doc = (await resp.json()) as { components: { schemas: Record<string, Schema> } };
      const schemas = doc.components.schemas;
      // Every field of the document is in the type, required alike. The type may
      // have optional fields the document lacks: those of newer coordinators
      // (failure handling, LOOP), so that the package fits older ones too.
      const compare = (name: string, shape: AnyShape, exactRequired: boolean) => {
        const schema = schemas[name];
        if (schema === undefined && NEWER.has(name)) return; // an older coordinator
        assert.ok(schema?.properties, `no schema ${name}`);
        for (const key of Object.keys(schema.properties)) {
          assert.ok(key in shape, `${name}.${key} is in the document, not in the type`);
        }
        const required = new Set(schema.required ?? []);
        for (const [key, presence] of Object.entries(shape)) {
          const property = schema.properties[key];
          if (property === undefined) {
            assert.equal(presence, "optional", `${name}.${key} is not in the document, so it must be optional`);
          } else if (required.has(key)) {
            assert.equal(presence, "required", `${name}.${key} is required`);
          } else if (exactRequired) {
            assert.equal(presence, "optional", `${name}.${key} is optional`);
          } else if (presence === "required") {
            // Always sent, maybe null: the document has it optional and nullable.
            assert.ok(allowsNull(property), `${name}.${key}: the document neither requires it nor allows null`);
          }
        }
      };
      for (const [name, shape] of Object.entries(answers)) compare(name, shape, false);
      for (const [name, shape] of Object.entries(requests)) compare(name, shape, true);
      const within = (values: readonly string[], schema: string) => {
        const documented = schemas[schema]?.enum ?? [];
        for (const v of documented) assert.ok(values.includes(v), `${schema} ${v} is in the document, not in the type`);
        assert.ok(documented.length > 0);
      };
      within(Object.keys(runStatuses), "RunStatus");
      within(RUN_STATUSES, "RunStatus");
      assert.equal(RUN_STATUSES.length, schemas["RunStatus"]?.enum?.length);
      within(Object.keys(taskStates), "TaskState");
      within(Object.keys(historyKinds), "HistoryKind");
      if (schemas["ResolveOutcome"]) within(Object.keys(resolveOutcomes), "ResolveOutcome");
      if (schemas["BackfillOverlap"]) within(Object.keys(backfillOverlaps), "BackfillOverlap");
      if (schemas["WebhookScheme"]) within(Object.keys(webhookSchemes), "WebhookScheme");
      if (schemas["On429"]) within(Object.keys(on429s), "On429");
    });

    it("match what the server answers: runs, tasks, MAP items, child runs, history, the task API, errors", async () => {
      await client.registerWorkflow({ name: "ts-child", nodes: [{ id: "c", type: "TRANSFORM", config: { output: "${ .input }" } }] });
      const id = await start(
        {
          name: "ts-shapes",
          nodes: [
            { id: "m", type: "MAP", config: { items: "${ .input.xs }", node: { type: "TRANSFORM", config: { output: { x: "${ .item }" } } } } },
            { id: "sub", type: "SUB_WORKFLOW", config: { workflow: "ts-child", input: { from: "parent" } } },
            custom("own", "ts-shape-type", "ts-shapes"),
          ],
          edges: [{ from: "m", to: "sub" }, { from: "sub", to: "own" }],
        },
        { xs: [1, 2, 3] },
      );
      // The task API by hand: poll, heartbeat, complete, as its types say.
      const call = async (path: string, body: unknown) => {
        const r = await fetch(`${dev.url}${path}`, {
          method: "POST",
          headers: { "content-type": "application/json", authorization: `Bearer ${dev.token}` },
          body: JSON.stringify(body),
        });
        return { status: r.status, body: (await r.json()) as Record<string, unknown> };
      };
      const batch = await eventually("a leased task", async () => {
        const b = await call("/v1/tasks/poll", { worker_id: "ts-shapes-1", queues: ["ts-shapes"], max: 1, wait: "1s" });
        return (b.body["tasks"] as unknown[]).length > 0 ? b : undefined;
      });
      conforms(batch.body, taskBatchShape, "task batch");
      const leased = (batch.body["tasks"] as Array<Record<string, unknown>>)[0]!;
      conforms(leased, leasedTaskShape, "leased task");
      const lease = { worker_id: "ts-shapes-1", run_id: leased["run_id"], attempt: leased["attempt"] };
      const beat = await call(`/v1/tasks/${String(leased["id"])}/heartbeat`, lease);
      conforms(beat.body, leaseExtendedShape, "lease extended");
      const lost = await call(`/v1/tasks/${String(leased["id"])}/heartbeat`, { ...lease, worker_id: "someone-else" });
      assert.equal(lost.status, 409);
      conforms(lost.body, errorBodyShape, "error body");
      assert.equal((lost.body["error"] as { code: string }).code, "lease_lost");
      const done = await call(`/v1/tasks/${String(leased["id"])}/complete`, { ...lease, output: { by: "hand" } });
      conforms(done.body, reportAckShape, "report ack");
      assert.equal(done.body["applied"], true);

      const run = await waitFor(id);
      assert.equal(run.status, "SUCCEEDED", JSON.stringify(run));
      checkRun(run);
      const map = run.tasks?.find((t) => t.node_id === "m");
      const { created: _created, ...counts } = map?.progress ?? { created: undefined };
      assert.deepEqual(counts, { total: 3, queued: 0, open: 0, completed: 3, failed: 0 });
      assert.deepEqual(run.output, { own: { by: "hand" } });
      const items = await client.mapItems(id, "m");
      conforms(items, itemPageShape, "item page");
      items.items.forEach((t) => checkTask(t, "item"));
      assert.deepEqual(items.items.map((t) => [t.item_index, t.parent_task_id, t.output]), [
        [0, map?.id, { x: 1 }],
        [1, map?.id, { x: 2 }],
        [2, map?.id, { x: 3 }],
      ]);
      const children = await client.listRuns({ parentRunId: id });
      assert.equal(children.runs.length, 1);
      const child = children.runs[0]!;
      checkRun(child, "child run");
      assert.equal(child.parent_run_id, id);
      assert.equal(child.parent_task_id, run.tasks?.find((t) => t.node_id === "sub")?.id);
      checkRun(await client.getRun(child.id), "child run in full");
      (await client.runEvents(id)).forEach((e) => checkHistory(e));
      assert.ok((await client.runEvents(id)).some((e) => e.type === "MapStarted"));
    });
  });

  describe("Worker", () => {
    it("runs a workflow of custom-type steps end to end; a thrown error is retried", async () => {
      const attempts: Record<string, number> = {};
      const inputs: JsonValue[] = [];
      const w = worker({ queues: ["ts-double"] }).handle<{ n: number }>("double", async (task) => {
        attempts[task.node_id] = (attempts[task.node_id] ?? 0) + 1;
        inputs.push(task.input);
        if (task.node_id === "b" && attempts["b"] === 1) throw new Error("flaky once");
        return { n: task.input.n * 2 };
      });
      const id = await start(
        {
          name: "ts-double",
          nodes: [
            custom("a", "double", "ts-double", { n: "${ .input.n }" }),
            custom("b", "double", "ts-double", { n: "${ .nodes.a.output.n }" }),
            custom("c", "double", "ts-double", { n: "${ .nodes.b.output.n }" }),
          ],
          edges: [{ from: "a", to: "b" }, { from: "b", to: "c" }],
        },
        { n: 3 },
      );
      const run = await whileRunning(w, () => waitFor(id));
      assert.equal(run.status, "SUCCEEDED", JSON.stringify(run));
      assert.deepEqual(run.output, { c: { n: 24 } });
      assert.deepEqual(attempts, { a: 1, b: 2, c: 1 });
      assert.deepEqual(inputs, [{ n: 3 }, { n: 6 }, { n: 6 }, { n: 12 }], "each step's input arrived");
      assert.equal(run.tasks?.find((t) => t.node_id === "b")?.attempt, 2);
      const retry = (await client.runEvents(id)).find((e) => e.type === "TaskRetryScheduled");
      assert.equal((retry?.payload as { error?: string } | undefined)?.error, "Error: flaky once");
      assert.deepEqual(linesAfterStart(w), []);
    });

    it("a worker without queues polls its handlers' default queues: a custom node with no queue runs to SUCCEEDED", async () => {
      // A node that names no `queue` goes to its type in lower case (the
      // coordinator's rule); a worker given no queues polls just that.
      const type = `Resize${randomBytes(4).toString("hex").toUpperCase()}`;
      const seen: string[] = [];
      const w = worker().handle<{ size: number }>(type, (task) => {
        seen.push(task.queue);
        return { size: task.input.size / 2 };
      });
      const id = await start({ name: "ts-default-queue", nodes: [{ id: "r", type, config: { size: "${ .input.size }" } }] }, { size: 8 });
      const run = await whileRunning(w, () => waitFor(id, 30_000));
      assert.equal(run.status, "SUCCEEDED", JSON.stringify(run));
      assert.deepEqual(run.output, { r: { size: 4 } });
      assert.deepEqual(seen, [type.toLowerCase()]);
      assert.deepEqual(w.queues, [type.toLowerCase()]);
      assert.deepEqual(w.logger.lines, []);
    });

    it("warns at start of a handler whose type's default queue the explicit queues miss", async () => {
      const w = worker({ queues: ["images"], workerId: "ts-misses" })
        .handle("Resize", () => null)
        .handle("images", () => null); // its default queue is polled: no warning for it
      await whileRunning(w, async () => {});
      assert.deepEqual(w.logger.lines, [
        "warn: worker ts-misses: handler for type 'Resize': a node of this type without a `queue` goes to queue 'resize', " +
          "which this worker does not poll (it polls images)",
      ]);
    });

    it("runs the step a report made ready as the report's answer leased it (eager dispatch), without a poll", async () => {
      const reports: Array<{ sent: { next?: unknown; stages?: Record<string, number> }; ack: ReportAck; priority: string | undefined }> = [];
      const spy = spyFetch((url, init) => {
        if (!/\/(complete|fail)$/.test(url)) return undefined;
        const priority = (init?.headers as Record<string, string> | undefined)?.["composer-priority"];
        return fetch(url, init).then(async (answer) => {
          const sent = JSON.parse(String(init?.body)) as { next?: unknown; stages?: Record<string, number> };
          reports.push({ sent, ack: (await answer.clone().json()) as ReportAck, priority });
          return answer;
        });
      });
      const ran: string[] = [];
      const w = worker({ queues: ["ts-eager"], fetch: spy.fetch }).handle<{ n: number }>("inc", (task) => {
        ran.push(task.node_id);
        return { n: task.input.n + 1 };
      });
      const id = await start(
        {
          name: "ts-eager",
          nodes: [
            custom("a", "inc", "ts-eager", { n: "${ .input.n }" }),
            custom("b", "inc", "ts-eager", { n: "${ .nodes.a.output.n }" }),
            custom("c", "inc", "ts-eager", { n: "${ .nodes.b.output.n }" }),
          ],
          edges: [{ from: "a", to: "b" }, { from: "b", to: "c" }],
        },
        { n: 1 },
      );
      const run = await whileRunning(w, () => waitFor(id));
      assert.equal(run.status, "SUCCEEDED", JSON.stringify(run));
      assert.deepEqual(run.output, { c: { n: 4 } });
      assert.deepEqual(ran, ["a", "b", "c"]);
      assert.deepEqual(reports.map((r) => r.sent.next), Array(3).fill({ queues: ["ts-eager"], max: 1 }));
      // a's answer leased b, b's leased c; c ended the run.
      assert.deepEqual(reports.map((r) => (r.ack.next ?? []).map((t) => t.node_id)), [["b"], ["c"], []]);
      // Each result names its run's priority and sends back its lease's stages with the handler's.
      assert.deepEqual(reports.map((r) => r.priority), ["3", "3", "3"]);
      for (const { sent } of reports) {
        const stages = sent.stages ?? {};
        for (const stage of ["leased_at_us", "started_at_us", "finished_at_us"]) assert.ok(stage in stages, JSON.stringify(sent));
        assert.ok((stages["started_at_us"] ?? 0) <= (stages["finished_at_us"] ?? 0), JSON.stringify(stages));
      }
      for (const { ack } of reports) {
        conforms(ack, reportAckShape, "report ack");
        for (const t of ack.next ?? []) conforms(t, leasedTaskShape, "a task of next");
      }
      assert.deepEqual(linesAfterStart(w), []);
    });

    it("gives a handler its attempt's traceparent, in the trace of the run's caller", async () => {
      const seen = new Map<string, string | undefined>();
      const w = worker({ queues: ["ts-traced"] }).handle("traced", (task) => {
        seen.set(task.run_id, task.traceparent);
        return { traceparent: task.traceparent ?? null };
      });
      await client.registerWorkflow({ name: "ts-traced", nodes: [custom("t", "traced", "ts-traced")] });
      const trace = traceId();
      const given = (await client.startRun({ workflow: "ts-traced", traceparent: traceparent(trace) })).id;
      const own = (await client.startRun({ workflow: "ts-traced" })).id;
      const runs = await whileRunning(w, () => Promise.all([waitFor(given), waitFor(own)]));
      assert.deepEqual(runs.map((r) => r.status), ["SUCCEEDED", "SUCCEEDED"], JSON.stringify(runs));
      const traces: Record<string, string> = {};
      for (const [runId, tp] of seen) {
        assert.equal(typeof tp, "string", `run ${runId}: ${String(tp)}`);
        const match = W3C.exec(tp ?? "");
        assert.ok(match, tp);
        traces[runId] = match[1]!;
      }
      // The caller's trace, or the run's own (its id) when it gave none.
      assert.deepEqual(traces, { [given]: trace, [own]: own.replaceAll("-", "") });
      assert.deepEqual(runs[0]!.output, { t: { traceparent: seen.get(given)! } });
      assert.deepEqual(linesAfterStart(w), []);
    });

    it("fails the run for good on a TaskError that is not retryable, with its message", async () => {
      let calls = 0;
      const w = worker({ queues: ["ts-refuse"] }).handle("refuse", () => {
        calls++;
        throw new TaskError("width must be positive", { retryable: false });
      });
      const id = await start({ name: "ts-refuse", nodes: [custom("r", "refuse", "ts-refuse")] });
      const run = await whileRunning(w, () => waitFor(id));
      checkRun(run);
      assert.equal(run.status, "FAILED");
      assert.equal(run.tasks?.[0]?.error, "width must be positive (not retryable)");
      assert.equal(run.tasks?.[0]?.attempt, 1, "not retried");
      assert.equal(calls, 1);
    });

    it("sends a TaskError's code and status, which become the step's error_info", async () => {
      const w = worker({ queues: ["ts-declined"] }).handle("charge", () => {
        throw new TaskError("the card was declined", { retryable: false, code: "card_declined", status: 402 });
      });
      const id = await start({ name: "ts-declined", nodes: [custom("c", "charge", "ts-declined")] });
      const run = await whileRunning(w, () => waitFor(id));
      assert.equal(run.status, "FAILED");
      const task = run.tasks?.[0];
      assert.equal(task?.error_info?.code, "card_declined", JSON.stringify(task));
      assert.equal(task?.error_info?.status, 402);
      assert.equal(task?.error_info?.retryable, false);
      assert.equal(task?.attempt, 1, "not retried");
    });

    it("sends a 429's retryAfterMs: the next attempt waits for it, and the node's limit key is held", async (t) => {
      if (!(await hasOperation("setLimit"))) {
        t.skip("this coordinator is older than limits");
        return;
      }
      const began: number[] = [];
      const w = worker({ queues: ["ts-throttled"] }).handle("charge", (task) => {
        began.push(Date.now());
        if (task.attempt === 1) throw new TaskError("rate limited", { code: "rate_limited", status: 429, retryAfterMs: 2000 });
        return { charged: task.attempt };
      });
      // Retried after 50 ms, but for the Retry-After.
      const node = { ...custom("c", "charge", "ts-throttled"), limits: [{ key: "ts-throttled", concurrency: 5 }] };
      const id = await start({ name: "ts-throttled", nodes: [node] });
      const run = await whileRunning(w, async () => {
        const limit = await eventually("the key held", async () => {
          if (began.length === 0) return undefined;
          const l = await client.getLimit("ts-throttled");
          return l.held_until ? l : undefined;
        });
        checkLimit(limit);
        return waitFor(id);
      });
      assert.equal(run.status, "SUCCEEDED", JSON.stringify(run));
      assert.deepEqual(run.output, { c: { charged: 2 } });
      assert.equal(began.length, 2);
      assert.ok(began[1]! - began[0]! >= 1800, `the second attempt waited for the Retry-After: ${began[1]! - began[0]!} ms`);
    });

    it("retries a handler that throws until the policy's last attempt", async () => {
      const seen: number[] = [];
      const w = worker({ queues: ["ts-throws"] }).handle("throws", async (task) => {
        seen.push(task.attempt);
        throw new RangeError(`attempt ${task.attempt} broke`);
      });
      const id = await start({ name: "ts-throws", nodes: [custom("x", "throws", "ts-throws")] });
      const run = await whileRunning(w, () => waitFor(id));
      assert.equal(run.status, "FAILED");
      assert.deepEqual(seen, [1, 2, 3]);
      assert.equal(run.tasks?.[0]?.error, "RangeError: attempt 3 broke");
    });

    it("fails a task of a type it has no handler for, and an answer that is not JSON", async () => {
      const w = worker({ queues: ["ts-misc"] })
        .handle("known", () => ({ fine: true }))
        .handle("bigint", () => ({ n: 1n }))
        .handle("nan", () => ({ ratio: 0 / 0 }))
        .handle("nothing", () => undefined);
      const unknown = await start({ name: "ts-unknown-type", nodes: [custom("u", "unknown-type", "ts-misc")] });
      const bigint = await start({ name: "ts-bigint", nodes: [custom("b", "bigint", "ts-misc")] });
      const nan = await start({ name: "ts-nan", nodes: [custom("n", "nan", "ts-misc")] });
      const nothing = await start({ name: "ts-nothing", nodes: [custom("x", "nothing", "ts-misc")] });
      const [u, b, n, x] = await whileRunning(w, () => Promise.all([unknown, bigint, nan, nothing].map((id) => waitFor(id))));
      assert.equal(n?.status, "FAILED");
      assert.match(n?.tasks?.[0]?.error ?? "", /^RangeError: the output holds NaN, which JSON cannot hold$/);
      assert.equal(x?.status, "SUCCEEDED");
      assert.deepEqual(x?.output, { x: null }, "undefined is null");
      assert.ok(u && b);
      assert.equal(u.status, "FAILED");
      assert.match(u.tasks?.[0]?.error ?? "", new RegExp(`^no handler for type unknown-type on queue ts-misc \\(worker ${w.workerId}\\) \\(not retryable\\)$`));
      assert.equal(u.tasks?.[0]?.attempt, 1, "not retried");
      assert.equal(b.status, "FAILED");
      assert.match(b.tasks?.[0]?.error ?? "", /^TypeError: .*BigInt/);
      assert.equal(b.tasks?.[0]?.attempt, 3, "retried");
    });

    it("resolves ${ .secrets.NAME } from COMPOSER_SECRET_NAME and scrubs the value from outputs and errors", async () => {
      const secret = "s3cr3t-value";
      const seen: JsonValue[] = [];
      const w = worker({ queues: ["ts-secrets"], env: { COMPOSER_SECRET_TS_KEY: secret } })
        .handle<{ auth: string }>("echo", (task) => {
          seen.push(task.input);
          return { echoed: task.input, [`key ${task.input.auth}`]: task.input.auth.toUpperCase() };
        })
        .handle<{ auth: string }>("leak", (task) => {
          throw new TaskError(`denied for ${task.input.auth}`, { retryable: false });
        });
      const id = await start(
        {
          name: "ts-secrets",
          nodes: [
            custom("echo", "echo", "ts-secrets", { auth: "Bearer ${ .secrets.TS_KEY }", literal: "$${ .input.x }", n: "${ .input.n }" }),
            custom("leak", "leak", "ts-secrets", { auth: "${.secrets.TS_KEY}" }),
          ],
          edges: [{ from: "echo", to: "leak" }],
        },
        { n: 7 },
      );
      const missing = await start({ name: "ts-no-secret", nodes: [custom("m", "echo", "ts-secrets", { auth: "${ .secrets.TS_MISSING }" })] });
      const [run, without] = await whileRunning(w, () => Promise.all([waitFor(id), waitFor(missing)]));

      assert.deepEqual(seen, [{ auth: `Bearer ${secret}`, literal: "${ .input.x }", n: 7 }], "the handler saw the value");
      const echo = run.tasks?.find((t) => t.node_id === "echo");
      assert.deepEqual(echo?.output, {
        echoed: { auth: "Bearer [secret]", literal: "${ .input.x }", n: 7 },
        "key Bearer [secret]": "BEARER [secret]",
      }, "values scrubbed, keys too, in another letter case too");
      assert.deepEqual(echo?.input, { auth: "Bearer ${ .secrets.TS_KEY }", literal: "$${ .input.x }", n: 7 }, "the server keeps the reference");
      assert.equal(run.status, "FAILED");
      assert.equal(run.tasks?.find((t) => t.node_id === "leak")?.error, "denied for [secret] (not retryable)");
      const everything = JSON.stringify([run, await client.runEvents(id)]);
      assert.ok(!everything.includes(secret), "the value never reached the server");

      assert.equal(without.status, "FAILED");
      assert.match(without.tasks?.[0]?.error ?? "", /^unknown secret TS_MISSING: set COMPOSER_SECRET_TS_MISSING/);
      assert.equal(without.tasks?.[0]?.attempt, 1, "not retried");
    });

    it("runs up to `concurrency` tasks at once", async () => {
      let now = 0;
      let most = 0;
      const spy = spyFetch();
      const w = worker({ queues: ["ts-conc"], concurrency: 2, fetch: spy.fetch }).handle("slow", async () => {
        now++;
        most = Math.max(most, now);
        await delay(400);
        now--;
        return "ok";
      });
      await client.registerWorkflow({ name: "ts-conc", nodes: [custom("s", "slow", "ts-conc")] });
      const ids = await Promise.all([0, 1, 2, 3, 4].map(async () => (await client.startRun({ workflow: "ts-conc" })).id));
      const runs = await whileRunning(w, () => Promise.all(ids.map((id) => waitFor(id))));
      assert.deepEqual(runs.map((r) => r.status), Array(5).fill("SUCCEEDED"));
      assert.equal(most, 2);
      const polls = spy.calls.filter((c) => c.url.endsWith("/v1/tasks/poll")).map((c) => (c.body as { max: number }).max);
      assert.ok(polls.every((m) => m >= 1 && m <= 2), polls.join(","));
      assert.ok(polls.includes(2));
    });

    it("runs a priority-1 run on its urgent slot while its one other slot is held, and no default-priority step there", async () => {
      const ran: string[] = [];
      let release = () => {};
      const held = new Promise<void>((resolve) => (release = resolve));
      const spy = spyFetch();
      const w = worker({ queues: ["ts-urgent"], concurrency: 1, urgentSlots: 1, fetch: spy.fetch }).handle(
        "job",
        async (task) => {
          const who = (task.input as { who: string }).who;
          ran.push(who);
          if (who === "bulk") await held;
          return {};
        },
      );
      const one = [custom("s", "job", "ts-urgent", { who: "${ .input.who }" })];
      await client.registerWorkflow({ name: "ts-urgent-bulk", nodes: one });
      await client.registerWorkflow({ name: "ts-urgent-normal", nodes: one });
      await client.registerWorkflow({
        name: "ts-urgent-chain",
        nodes: [custom("a", "job", "ts-urgent", { who: "urgent-a" }), custom("b", "job", "ts-urgent", { who: "urgent-b" })],
        edges: [{ from: "a", to: "b" }],
      });
      const bulk = (await client.startRun({ workflow: "ts-urgent-bulk", input: { who: "bulk" }, priority: 5 })).id;
      await whileRunning(w, async () => {
        while (ran.length === 0) await delay(20);
        const normal = (await client.startRun({ workflow: "ts-urgent-normal", input: { who: "normal" } })).id;
        const urgent = (await client.startRun({ workflow: "ts-urgent-chain", priority: 1 })).id;
        assert.equal((await waitFor(urgent)).status, "SUCCEEDED");
        // The default priority waits for the ordinary slot, however often the urgent slot polls.
        await delay(300);
        assert.deepEqual(ran, ["bulk", "urgent-a", "urgent-b"]);
        release();
        assert.equal((await waitFor(bulk)).status, "SUCCEEDED");
        assert.equal((await waitFor(normal)).status, "SUCCEEDED");
      });
      assert.deepEqual(ran, ["bulk", "urgent-a", "urgent-b", "normal"]);
      const asked = spy.calls
        .filter((c) => c.url.endsWith("/v1/tasks/poll"))
        .map((c) => (c.body as { priority_at_most?: number }).priority_at_most);
      assert.ok(asked.includes(2) && asked.includes(undefined), asked.join(","));
    });

    it("heartbeats a task that runs longer than its lease, so no other worker takes it", async () => {
      const spy = spyFetch();
      const first = worker({ queues: ["ts-long"], fetch: spy.fetch }).handle("long", async () => {
        await delay(2.5 * dev.leaseTtlMs);
        return { by: "first" };
      });
      let stolen = 0;
      const second = worker({ queues: ["ts-long"] }).handle("long", () => {
        stolen++;
        return { by: "second" };
      });
      const id = await start({ name: "ts-long", nodes: [custom("l", "long", "ts-long")] });
      const run = await whileRunning(first, async () => {
        await taskState(id, "l", "RUNNING");
        return whileRunning(second, () => waitFor(id));
      });
      assert.equal(run.status, "SUCCEEDED");
      assert.deepEqual(run.output, { l: { by: "first" } });
      assert.equal(stolen, 0);
      assert.equal(run.tasks?.[0]?.attempt, 1);
      const beats = spy.calls.filter((c) => c.url.endsWith("/heartbeat")).length;
      assert.ok(beats >= 5, `${beats} heartbeats in 2.5 leases`);
    });

    it("aborts task.signal when the lease is lost (the run was cancelled) and drops the result", async () => {
      const spy = spyFetch();
      const started = signal<string>();
      let reason: unknown;
      const w = worker({ queues: ["ts-lost"], fetch: spy.fetch }).handle("hang", async (task) => {
        started.resolve(task.id);
        await Promise.race([new Promise((res) => task.signal.addEventListener("abort", res)), delay(15_000)]);
        reason = task.signal.reason;
        return "too late";
      });
      const id = await start({ name: "ts-lost", nodes: [custom("h", "hang", "ts-lost")] });
      await whileRunning(w, async () => {
        const taskId = await started.promise;
        await client.cancelRun(id);
        await eventually("the abort", () => (reason !== undefined ? true : undefined), 10_000);
        await eventually("the task's end", () => (w.activeTasks === 0 ? true : undefined), 10_000);
        assert.ok(reason instanceof LeaseLostError, String(reason));
        assert.equal(reason.taskId, taskId);
        const reports = spy.calls.filter((c) => c.url.includes(taskId) && /\/(complete|fail)$/.test(c.url));
        assert.deepEqual(reports, [], "the result was dropped");
      });
      const run = await client.getRun(id);
      assert.equal(run.status, "CANCELLED");
      assert.equal(run.tasks?.[0]?.output, null);
      assert.ok(w.logger.lines.some((l) => /the lease was lost while it ran; its result is dropped/.test(l)), w.logger.lines.join("\n"));
    });

    it("drops the result of a handler that gives up on its lost lease (task.signal.throwIfAborted())", async () => {
      const spy = spyFetch();
      const w = worker({ queues: ["ts-give-up"], fetch: spy.fetch }).handle("hang", async (task) => {
        await new Promise((res) => task.signal.addEventListener("abort", res));
        task.signal.throwIfAborted(); // throws the LeaseLostError
        return "unreachable";
      });
      const id = await start({ name: "ts-give-up", nodes: [custom("h", "hang", "ts-give-up")] });
      await whileRunning(w, async () => {
        const run = await taskState(id, "h", "RUNNING");
        await client.cancelRun(id);
        await eventually("the task's end", () => (w.logger.lines.some((l) => /its result is dropped/.test(l)) ? true : undefined), 10_000);
        const taskId = run.tasks?.[0]?.id ?? "?";
        assert.deepEqual(spy.calls.filter((c) => c.url.includes(taskId) && /\/(complete|fail)$/.test(c.url)), []);
      });
    });

    it("retries its report across connection errors and 5xx", async () => {
      let completes = 0;
      const spy = spyFetch((url) => {
        if (!url.endsWith("/complete")) return undefined;
        completes++;
        if (completes === 1) throw new TypeError("fetch failed", { cause: new Error("ECONNRESET") });
        if (completes === 2) {
          return new Response(JSON.stringify({ error: { code: "busy", message: "the engine is busy" } }), {
            status: 503,
            headers: { "content-type": "application/json", "retry-after": "1" },
          });
        }
        return undefined;
      });
      let calls = 0;
      const w = worker({ queues: ["ts-flaky-net"], fetch: spy.fetch }).handle("x", () => (calls++, "landed"));
      const id = await start({ name: "ts-flaky-net", nodes: [custom("x", "x", "ts-flaky-net")] });
      const run = await whileRunning(w, () => waitFor(id));
      assert.equal(run.status, "SUCCEEDED");
      assert.deepEqual(run.output, { x: "landed" });
      assert.equal(completes, 3);
      assert.equal(calls, 1, "the same result was sent again, not the task run again after its lease expired");
      const retried = w.logger.lines.filter((l) => /^warn: task \S+: reporting complete failed \(try [12]: .*\); retrying in \d+\.\ds$/.test(l));
      assert.equal(retried.length, 2, w.logger.lines.join("\n"));
      assert.equal(run.tasks?.[0]?.attempt, 1);
    });

    it("keeps polling through refused polls (a wrong token), logging them, and stops at once", async () => {
      const w = worker({ queues: ["ts-denied"], token: "wrong" }).handle("x", () => 1);
      const running = w.run();
      await eventually("a logged poll failure", () =>
        w.logger.lines.filter((l) => /poll failed \(UnauthorizedError: missing or wrong bearer token\); retrying/.test(l)).length >= 2
          ? true
          : undefined,
      );
      const t0 = Date.now();
      await w.stop();
      await running;
      assert.ok(Date.now() - t0 < 2_000, "a stop cuts the backoff short");
    });

    it("loses a task to another worker when it dies mid-task (killed, no more heartbeats)", async () => {
      const id = await start({ name: "ts-resize", nodes: [custom("thumb", "resize-image", "images", { width: 64 })] });
      const doomed = exampleWorker({ RESIZE_MS: "600000" });
      try {
        await taskState(id, "thumb", "RUNNING");
      } finally {
        doomed.child.kill("SIGKILL"); // no goodbye: the lease just stops being renewed
        await doomed.exit;
      }
      const killedAt = Date.now();
      const w = worker({ queues: ["images"] }).handle<{ width: number }>("resize-image", (task) => ({ width: task.input.width, by: "survivor" }));
      const run = await whileRunning(w, () => waitFor(id));
      assert.equal(run.status, "SUCCEEDED", JSON.stringify(run));
      assert.deepEqual(run.output, { thumb: { width: 64, by: "survivor" } });
      assert.equal(run.tasks?.[0]?.attempt, 1, "taken over at the same attempt");
      assert.ok(Date.now() - killedAt >= dev.leaseTtlMs / 2, "not before the lease ran out");
    });

    it("stops gracefully: no new polls, the running task finishes and reports, then run() resolves", async () => {
      const spy = spyFetch();
      const started = signal();
      const w = worker({ queues: ["ts-slow"], fetch: spy.fetch }).handle("slow", async () => {
        started.resolve();
        await delay(1500);
        return "done";
      });
      const id = await start({ name: "ts-slow", nodes: [custom("s", "slow", "ts-slow")] });
      const running = w.run();
      await started.promise;
      const stopAt = Date.now();
      await w.stop();
      await running;
      const run = await client.getRun(id);
      assert.equal(run.status, "SUCCEEDED", "reported before stop() resolved");
      assert.deepEqual(run.output, { s: "done" });
      const polls = spy.calls.filter((c) => c.url.endsWith("/v1/tasks/poll"));
      assert.ok(polls.every((c) => c.at <= stopAt), "no poll after stop()");

      // A task queued after the stop waits for another worker.
      const later = await client.startRun({ workflow: "ts-slow" });
      await delay(1000);
      assert.equal((await client.getRun(later.id)).tasks?.[0]?.state, "PENDING");
      await whileRunning(w, () => waitFor(later.id)); // and run() works again
    });

    it("stops on SIGTERM with handleSignals: the running task reports, then the process exits 0", async () => {
      const id = await start({ name: "ts-resize-term", nodes: [custom("thumb", "resize-image", "images", { width: 32 })] });
      const proc = exampleWorker({ RESIZE_MS: "2000" });
      try {
        await taskState(id, "thumb", "RUNNING");
        proc.child.kill("SIGTERM");
        const code = await Promise.race([proc.exit, delay(30_000).then(() => "still running")]);
        assert.equal(code, 0, proc.stderr());
      } finally {
        proc.child.kill("SIGKILL");
        await proc.exit;
      }
      const run = await client.getRun(id);
      assert.equal(run.status, "SUCCEEDED", "it reported before exiting");
      assert.deepEqual(run.output, { thumb: { width: 32, resized_by: proc.child.pid } });
      assert.match(proc.stderr(), /SIGTERM received; stopping once its 1 running tasks reported/);
    });
  });

  describe("namespaces", () => {
    it("a namespace the administrator creates holds a run its own worker runs, which default does not see", async (t) => {
      if (!(await hasOperation("createNamespace"))) {
        t.skip("this coordinator is older than namespaces");
        return;
      }
      const made = await client.createNamespace("team-x", "the x team");
      checkNamespace(made);
      assert.deepEqual([made.name, made.description, made.state, made.created], ["team-x", "the x team", "active", true]);
      assert.equal((await client.createNamespace("team-x")).created, false, "it exists: answered as it is");
      const got = await client.getNamespace("team-x");
      checkNamespace(got);
      assert.deepEqual({ ...got, created: true }, made);
      const all = await client.listNamespaces();
      all.forEach((n) => checkNamespace(n));
      assert.equal(all[0]?.name, "default");
      assert.ok(all.some((n) => n.name === "team-x"));

      const team = new Client({ url: dev.url, token: dev.token, namespace: "team-x" });
      await team.registerWorkflow({ name: "ts-ns", nodes: [custom("work", "ts-ns-step", "ts-ns", { size: "${ .input.size }" })] });
      const run = await team.startRun({ workflow: "ts-ns", input: { size: 3 } });
      const seen: string[] = [];
      const w = worker({ queues: ["ts-ns"], namespace: "team-x" }).handle<{ size: number }>("ts-ns-step", (task) => {
        seen.push(task.run_id);
        return { doubled: task.input.size * 2 };
      });
      assert.equal(w.namespace, "team-x");
      const done = await whileRunning(w, () => team.waitForRun(run.id, { timeoutMs: 60_000 }));
      assert.equal(done.status, "SUCCEEDED", JSON.stringify(done.error));
      assert.deepEqual(done.output, { work: { doubled: 6 } });
      assert.deepEqual(seen, [run.id]);
      assert.deepEqual(linesAfterStart(w), []);

      // The default namespace has neither the run nor the workflow.
      assert.ok((await rejection(client.getRun(run.id))) instanceof NotFoundError);
      assert.ok((await rejection(client.getWorkflow("ts-ns"))) instanceof NotFoundError);
      assert.ok(!(await client.listWorkflows()).some((wf) => wf.name === "ts-ns"));
      // A namespace nobody created is the server's 404; a bad name never leaves the client.
      const missing = await rejection(new Client({ url: dev.url, token: dev.token, namespace: "team-nobody" }).listWorkflows());
      assert.ok(missing instanceof NotFoundError, String(missing));
      assert.match(missing.message, /team-nobody/);
      for (const bad of ["Team-X", "team_x", "x".repeat(64)]) {
        assert.throws(() => new Client({ url: dev.url, token: dev.token, namespace: bad }), /^TypeError: namespace: expected/);
        assert.throws(() => new Worker({ url: dev.url, token: dev.token, namespace: bad }), /^TypeError: namespace: expected/);
      }
    });

    it("a namespace's quotas refuse a start by name, and its usage is shown", async (t) => {
      if (!(await hasOperation("setNamespaceQuotas"))) {
        t.skip("this coordinator is older than quotas");
        return;
      }
      await client.createNamespace("ts-small");
      const inside = new Client({ url: dev.url, token: dev.token, namespace: "ts-small" });
      await inside.registerWorkflow({
        name: "ts-waits",
        nodes: [{ id: "w", type: "WAIT_FOR_EVENT", config: { event: "go", key: "k" } }],
      });
      const set = await client.setNamespaceQuotas("ts-small", { open_runs: 1, schedules: 3 });
      assert.deepEqual(set.quotas, { open_runs: 1, schedules: 3 });
      await inside.startRun({ workflow: "ts-waits" });
      const over = await rejection(inside.startRun({ workflow: "ts-waits" }));
      assert.ok(over instanceof UnavailableError, String(over));
      assert.deepEqual([over.status, over.code, over.retryAfterMs], [429, "over_quota", 1000]);
      assert.match(over.message, /quota open_runs \(1\)/);
      assert.equal((await client.getNamespace("ts-small")).usage?.open_runs, 1);
      assert.deepEqual((await client.setNamespaceQuotas("ts-small", {})).quotas, {});
      await inside.startRun({ workflow: "ts-waits" });
    });

    it("a deleted namespace is no longer served; default cannot be deleted", async (t) => {
      if (!(await hasOperation("deleteNamespace"))) {
        t.skip("this coordinator is older than namespaces");
        return;
      }
      await client.createNamespace("ts-gone");
      const inside = new Client({ url: dev.url, token: dev.token, namespace: "ts-gone" });
      assert.deepEqual(await inside.listWorkflows(), []);
      const deleted = await client.deleteNamespace("ts-gone");
      checkNamespace(deleted);
      assert.deepEqual([deleted.name, deleted.state], ["ts-gone", "deleting"]);
      assert.ok((await rejection(client.getNamespace("ts-gone"))) instanceof NotFoundError);
      assert.ok((await rejection(inside.listWorkflows())) instanceof ConflictError);
      assert.ok((await rejection(client.createNamespace("ts-gone"))) instanceof ConflictError);
      assert.ok((await rejection(client.deleteNamespace("ts-never"))) instanceof NotFoundError);
      assert.ok((await rejection(client.deleteNamespace("default"))) instanceof ConflictError);
    });
  });
});

/** Schemas of newer coordinators than some the package is used with. */
const NEWER = new Set([
  "ErrorInfo",
  "OnFailureSpec",
  "ResolveTask",
  "TriggerSpec",
  "TriggeredRun",
  "TriggerFailure",
  "EventView",
  "EventPage",
  "BackfillRequest",
  "BackfillQueued",
  "WebhookSpec",
  "WebhookView",
  "WebhookList",
  "HeldView",
  "LimitView",
  "LimitPage",
  "LimitValuesSpec",
  "LimitSpec",
  "SetPriority",
  "TakeNext",
  "NamespaceView",
  "NamespaceList",
  "CreateNamespace",
]);

interface Schema {
  type?: string | string[];
  properties?: Record<string, Schema>;
  required?: string[];
  enum?: string[];
  oneOf?: Schema[];
  anyOf?: Schema[];
  $ref?: string;
}

/** Whether a property's schema takes null: `["string", "null"]`, a oneOf with null, or any value at all. */
function allowsNull(s: Schema): boolean {
  if (Array.isArray(s.type)) return s.type.includes("null");
  if (s.oneOf || s.anyOf) return (s.oneOf ?? s.anyOf ?? []).some((x) => x.type === "null");
  return s.type === undefined && s.$ref === undefined;
}
