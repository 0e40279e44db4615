/**
 * Workflows in code: each example of the repository (`examples/*.json`,
 * `*.yaml`) built by its program in `examples/workflows/` is that file's
 * definition; what the builder emits; the worker's side of typed steps.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join, resolve } from "node:path";
import { describe, it } from "node:test";
import { pathToFileURL } from "node:url";

import {
  at,
  attach,
  Client,
  http,
  jq,
  refs,
  s,
  step,
  stepHandlers,
  stepQueues,
  TaskError,
  tpl,
  transform,
  Worker,
  workerFor,
  workflow,
  type Infer,
  type WorkerTask,
  type WorkflowBuilder,
  type WorkflowDefinition,
} from "../src/index.js";
import { composerBin, PACKAGE_DIR } from "./dev.js";
import { fakeServer, json } from "./helpers.js";

const EXAMPLES = resolve(PACKAGE_DIR, "..", "..", "examples");
const PROGRAMS = join(PACKAGE_DIR, "build", "examples", "workflows");

/** `composer workflow normalize`: a definition file (JSON or YAML) as the server stores it; undefined when the binary has no such command. */
function normalize(file: string): unknown {
  const r = spawnSync(composerBin(), ["workflow", "normalize", "--file", file, "--output", "json"], {
    encoding: "utf8",
    env: { ...process.env, COMPOSER_LOG: "error" },
  });
  if (r.error !== undefined || (r.status !== 0 && /unrecognized subcommand|no such file/i.test(`${r.stderr}${r.error ?? ""}`))) return undefined;
  assert.equal(r.status, 0, `composer workflow normalize ${file}: ${r.stderr}`);
  return JSON.parse(r.stdout) as unknown;
}

function writeTemp(def: unknown): { file: string; done(): void } {
  const work = mkdtempSync(join(tmpdir(), "composer-ts-wf-"));
  const file = join(work, "def.json");
  writeFileSync(file, JSON.stringify(def));
  return { file, done: () => rmSync(work, { recursive: true, force: true }) };
}

function exampleFiles(): string[] {
  return readdirSync(EXAMPLES)
    .filter((f) => /\.(json|ya?ml)$/.test(f))
    .sort();
}

/** `composer workflow simulate`'s verdict on a definition: 2 when it refuses it. */
function simulateStatus(def: WorkflowDefinition, input: unknown = {}): { status: number | null; stderr: string } {
  const work = mkdtempSync(join(tmpdir(), "composer-ts-wf-"));
  try {
    const file = join(work, "def.json");
    writeFileSync(file, JSON.stringify(def));
    const r = spawnSync(composerBin(), ["workflow", "simulate", "--file", file, "--input", JSON.stringify(input), "--output", "json"], {
      encoding: "utf8",
      env: { ...process.env, COMPOSER_LOG: "error" },
    });
    return { status: r.status, stderr: r.stderr };
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

describe("the examples, built in code", () => {
  it("has a program for every workflow example (schedules are not workflows)", () => {
    const missing = exampleFiles()
      .map((f) => basename(f).replace(/\.(json|ya?ml)$/, ""))
      .filter((n) => !existsSync(join(PROGRAMS, `${n}.js`)));
    assert.deepEqual(missing, [], "examples without a program in examples/workflows/");
    for (const f of readdirSync(join(EXAMPLES, "schedules"))) {
      const doc = JSON.parse(readFileSync(join(EXAMPLES, "schedules", f), "utf8")) as Record<string, unknown>;
      assert.ok("cron" in doc && !("nodes" in doc), `${f} is a schedule, not a workflow`);
    }
  });

  for (const file of exampleFiles()) {
    const name = file.replace(/\.(json|ya?ml)$/, "");
    it(`examples/workflows/${name}.ts builds examples/${file}`, async (t) => {
      const path = join(EXAMPLES, file);
      const program = (await import(pathToFileURL(join(PROGRAMS, `${name}.js`)).href)) as { default: WorkflowBuilder<any, any> };
      const built = JSON.parse(JSON.stringify(program.default.definition())) as unknown;
      // YAML is read by composer itself (`workflow normalize`), as JSON.
      const expected = file.endsWith(".json") ? (JSON.parse(readFileSync(path, "utf8")) as unknown) : normalize(path);
      if (expected === undefined) {
        t.skip("no composer with `workflow normalize` to read the YAML (COMPOSER_BIN)");
        return;
      }
      // As data: key order does not matter, everything else does (edge order included).
      assert.deepStrictEqual(built, expected);
      // And as the server compares definitions when registering: the same.
      const fromFile = normalize(path);
      if (fromFile !== undefined) {
        const tmp = writeTemp(built);
        try {
          assert.deepStrictEqual(normalize(tmp.file), fromFile);
        } finally {
          tmp.done();
        }
      }
    });
  }

  it("emits definitions composer accepts", { skip: !existsSync(composerBin()) && "no composer binary" }, async () => {
    for (const file of exampleFiles()) {
      const name = file.replace(/\.(json|ya?ml)$/, "");
      const program = (await import(pathToFileURL(join(PROGRAMS, `${name}.js`)).href)) as { default: WorkflowBuilder<any, any> };
      const { status, stderr } = simulateStatus(program.default.definition());
      assert.notEqual(status, 2, `${name}: ${stderr}`);
    }
  });
});

describe("the builder", () => {
  const Order = s.object({ id: s.string(), amount: s.number({ minimum: 0 }), items: s.array(s.object({ sku: s.string() })) });
  const Charge = s.object({ id: s.string(), cents: s.integer() });

  function orderFlow() {
    const wf = workflow("order", { input: Order, queue: "payments", description: "d" });
    const charge = wf.step("charge", {
      reads: { order: wf.input },
      output: Charge,
      retry: { max_attempts: 2 },
      handler: ({ order }) => ({ id: `ch-${order.id}`, cents: Math.round(order.amount * 100) }),
    });
    const ship = wf.step("ship", {
      type: "ship-it",
      queue: "shipping",
      reads: { charge: charge.out.id, first: at<string>(wf.input.items, 0, "sku") },
      handler: ({ charge, first }) => ({ label: `${charge}:${first}` }),
    });
    const receipt = wf.transform("receipt", { charge: charge.out.id, label: ship.out.label });
    return { wf: wf.returns(receipt.out), charge, ship, receipt };
  }

  it("emits typed steps: input keyed by reads, an edge from each node read, the input schema", () => {
    const { wf } = orderFlow();
    assert.deepStrictEqual(wf.definition(), {
      name: "order",
      description: "d",
      input_schema: {
        type: "object",
        properties: {
          id: { type: "string" },
          amount: { type: "number", minimum: 0 },
          items: { type: "array", items: { type: "object", properties: { sku: { type: "string" } }, required: ["sku"] } },
        },
        required: ["id", "amount", "items"],
      },
      nodes: [
        { id: "charge", type: "order.charge", queue: "payments", retry: { max_attempts: 2 }, config: { order: "${ .input }" } },
        {
          id: "ship",
          type: "ship-it",
          queue: "shipping",
          config: { charge: "${ .nodes.charge.output.id }", first: "${ .input.items[0].sku }" },
        },
        { id: "receipt", type: "TRANSFORM", config: { output: { charge: "${ .nodes.charge.output.id }", label: "${ .nodes.ship.output.label }" } } },
      ],
      // receipt reads charge too, but charge leads to it through ship already.
      edges: [
        { from: "charge", to: "ship" },
        { from: "ship", to: "receipt" },
      ],
      output: "${ .nodes.receipt.output }",
    });
  });

  it("keeps an edge from a node read when the path to it is conditional or a failure edge", () => {
    const wf = workflow<{ n: number }>("paths");
    const a = wf.transform("a", { n: wf.input.n });
    const b = wf.transform("b", 1, { after: { node: a, when: jq`${a.out.n} > 1` } });
    const c = wf.transform("c", 2, { after: { node: b, on: "always" } });
    wf.transform("d", { a: a.out, c: c.out });
    assert.deepEqual(wf.definition().edges, [
      { from: "a", to: "b", when: ".nodes.a.output.n > 1" },
      { from: "a", to: "d" },
      { from: "b", to: "c", on: "always" },
      { from: "c", to: "d" },
    ]);
  });

  it("reaches every option of a definition and of a node", () => {
    const handler = () => ({ ok: true });
    const wf = workflow<{ tenant: string; list: string[] }>("all", {
      timeout: "1h",
      priority: 2,
      concurrency: { max: 3 },
      tags: { kind: "x" },
    });
    wf.set({
      fairnessKey: wf.input.tenant,
      tags: { tenant: wf.input.tenant, n: 1 },
      onFailure: { workflow: "handler", version: 2, input: { id: refs.failedRun.id } },
      onSuccess: { workflow: "notify" },
      onEnd: { workflow: "audit", version: 1, input: { id: "${ .run.id }" } },
      deadlines: [{ after: "2h", start: { workflow: "page", input: { id: "${ .run.id }" } } }],
      triggers: [{ event: "e", when: jq`${refs.event().key} == "k"` }],
    });
    const each = wf.map("each", {
      items: wf.input.list,
      max_concurrency: 2,
      node: (item, index) => step({ reads: { item, index }, handler: ({ item, index }) => `${item}${index}` }),
    });
    const own = wf.task<{ v: number }>("own", "Resize", { w: 1 }, {
      queue: "gpu",
      timeout: "30s",
      delivery: "at_most_once",
      limits: [{ key: tpl`t:${wf.input.tenant}`, rate: "5/1s", burst: 2 }, { key: "k", concurrency: 1 }],
      retry: { max_attempts: 4, initial_backoff: "1s", multiplier: 3, max_backoff: "1m", on_429: "ignore" },
      after: each,
    });
    wf.waitForEvent("ev", { event: "paid", key: wf.input.tenant, timeout: "1d", default_output: { none: true } }, { after: own, updates: [{ name: "approve", validate: ".update.payload.ok", refusal: "not ok" }] });
    wf.wait("until", { until: "2030-01-01T00:00:00Z" }, { after: own, deadlines: [{ after: "1h", start: { workflow: "page" } }] });
    wf.subWorkflow("child", { workflow: "child", version: 1, input: { v: own.out.v }, on_parent_close: "abandon" }, { timeout: "5m" });
    wf.loop("again", { workflow: "child", until: ".iteration.index >= 2", max_iterations: 3, input: { i: refs.iteration().index }, on_parent_close: "cancel" });
    wf.fail("stop", { message: "no", code: "stopped" }, { after: { node: own, on: "failure" } });
    wf.http("call", { url: "https://x.example", method: "PUT", headers: { A: refs.secret("TOKEN") }, accept: [409], retry_statuses: [503], follow_redirects: true, idempotency_key: "per_attempt" }, { after: { node: own, on: "always" } });
    wf.step("typed", { reads: { v: own.out.v }, handler });
    const def = wf.definition();
    assert.equal(def.fairness_key, "${ .input.tenant }");
    assert.deepEqual(def.tags, { tenant: "${ .input.tenant }", n: 1 });
    assert.deepEqual(def.on_failure, { workflow: "handler", version: 2, input: { id: "${ .failed_run.id }" } });
    assert.deepEqual(def.on_success, { workflow: "notify" });
    assert.deepEqual(def.on_end, { workflow: "audit", version: 1, input: { id: "${ .run.id }" } });
    assert.deepEqual(def.deadlines, [{ after: "2h", start: { workflow: "page", input: { id: "${ .run.id }" } } }]);
    assert.deepEqual(def.triggers, [{ event: "e", when: '.event.key == "k"' }]);
    assert.deepEqual(def.concurrency, { max: 3 });
    assert.equal(def.priority, 2);
    const node = (id: string) => def.nodes.find((n) => n.id === id);
    assert.deepEqual(node("each"), {
      id: "each",
      type: "MAP",
      config: {
        items: "${ .input.list }",
        max_concurrency: 2,
        node: { type: "all.each", config: { item: "${ .item }", index: "${ .index }" } },
      },
    });
    assert.deepEqual(node("own")?.limits, [{ key: "t:${ .input.tenant }", rate: "5/1s", burst: 2 }, { key: "k", concurrency: 1 }]);
    assert.equal(node("own")?.delivery, "at_most_once");
    assert.deepEqual(node("until")?.deadlines, [{ after: "1h", start: { workflow: "page" } }]);
    assert.deepEqual(node("ev")?.updates, [{ name: "approve", validate: ".update.payload.ok", refusal: "not ok" }]);
    assert.deepEqual(node("call")?.config?.["headers"], { A: "${ .secrets.TOKEN }" });
    assert.deepEqual(node("again")?.config, {
      workflow: "child",
      until: ".iteration.index >= 2",
      max_iterations: 3,
      input: { i: "${ .iteration.index }" },
      on_parent_close: "cancel",
    });
    assert.deepEqual(
      def.edges?.filter((e) => e.from === "own"),
      [
        { from: "own", to: "ev" },
        { from: "own", to: "until" },
        { from: "own", to: "child" },
        { from: "own", to: "stop", on: "failure" },
        { from: "own", to: "call", on: "always" },
        { from: "own", to: "typed" },
      ],
    );
    assert.deepEqual(
      stepHandlers([wf]).map((h) => [h.type, h.queue, h.node]),
      [["all.each", "all.each", "each"], ["all.typed", "all.typed", "typed"]],
    );
    if (existsSync(composerBin())) {
      const { status, stderr } = simulateStatus(def, { tenant: "t", list: ["a"] });
      assert.notEqual(status, 2, stderr);
    }
  });

  it("refuses what the server would: bad names, a duplicate id, an edge to no node, a read that is not a reference", () => {
    assert.throws(() => workflow(".."), /workflow ".."/);
    const wf = workflow("w");
    wf.transform("a", 1);
    assert.throws(() => wf.transform("a", 2), /already defined/);
    assert.throws(() => wf.transform("b c", 2), /node "b c"/);
    wf.edge("a", "zz");
    assert.throws(() => wf.definition(), /zz, which is no node/);
    assert.throws(() => step({ reads: { x: "text" as never }, handler: () => 1 }), /reads\.x is not a reference/);
    assert.throws(() => workflow("empty").definition(), /no nodes/);
  });

  it("quotes paths that are not identifiers", () => {
    const wf = workflow<{ "a-b": { c: string } }>("q");
    const n = wf.transform("my-node", { v: wf.input["a-b"].c });
    const m = wf.transform("m", { v: n.out, w: at(n.out, "x", 2) });
    void m;
    const def = wf.definition();
    assert.equal(def.nodes[0]?.config?.["output"] && (def.nodes[0].config["output"] as Record<string, unknown>)["v"], '${ .input["a-b"].c }');
    assert.deepEqual(def.nodes[1]?.config, { output: { v: '${ .nodes["my-node"].output }', w: '${ .nodes["my-node"].output.x[2] }' } });
    assert.deepEqual(def.edges, [{ from: "my-node", to: "m" }]);
  });

  it("puts references into templates and jq", () => {
    const wf = workflow<{ a: { b: number } }>("t");
    assert.equal(String(wf.input.a.b), "${ .input.a.b }");
    assert.equal(`x-${wf.input.a}`, "x-${ .input.a }");
    assert.equal(jq`${wf.input.a.b} + 1`.text, ".input.a.b + 1");
    assert.equal(String(tpl`${jq`${wf.input.a.b} + 1`}!`), "${ .input.a.b + 1 }!");
    assert.equal(JSON.stringify({ r: wf.input.a }), '{"r":"${ .input.a }"}');
    assert.equal(transform(wf.input).type, "TRANSFORM");
    assert.equal(http({ url: "https://x" }).type, "HTTP");
  });
});

describe("schemas", () => {
  const S = s.object({
    name: s.string({ minLength: 1 }),
    n: s.integer({ minimum: 0 }),
    tag: s.optional(s.enum(["a", "b"])),
    kind: s.literal("k"),
    list: s.array(s.number(), { maxItems: 2 }),
    any: s.union(s.string(), s.boolean()),
    map: s.record(s.nullable(s.string())),
    flag: s.boolean(),
  });
  type S = Infer<typeof S>;
  const good: S = { name: "x", n: 1, kind: "k", list: [1.5], any: true, map: { a: null, b: "c" }, flag: false };

  it("check values and name where they break", () => {
    assert.deepEqual(S.check(good), []);
    assert.deepEqual(S.parse({ ...good, tag: "a" }), { ...good, tag: "a" });
    const bad = S.check({ name: "", n: 1.5, tag: "c", kind: "j", list: [1, 2, "3"], any: 1, map: { a: 1 } });
    assert.deepEqual(
      bad.map((i) => i.path),
      ["/name", "/n", "/tag", "/kind", "/list", "/list/2", "/any", "/map/a", "/flag"],
    );
    assert.throws(() => S.parse({ ...good, n: -1 }), /\/n: -1 is less than 0/);
  });

  it("are JSON Schema 2020-12", () => {
    assert.deepEqual(S.jsonSchema(), {
      type: "object",
      properties: {
        name: { type: "string", minLength: 1 },
        n: { type: "integer", minimum: 0 },
        tag: { enum: ["a", "b"] },
        kind: { const: "k" },
        list: { type: "array", items: { type: "number" }, maxItems: 2 },
        any: { anyOf: [{ type: "string" }, { type: "boolean" }] },
        map: { type: "object", additionalProperties: { anyOf: [{ type: "string" }, { type: "null" }] } },
        flag: { type: "boolean" },
      },
      required: ["name", "n", "kind", "list", "any", "map", "flag"],
    });
    assert.deepEqual(s.object({ a: s.string().describe("an a") }, { strict: true }).jsonSchema(), {
      type: "object",
      properties: { a: { type: "string", description: "an a" } },
      required: ["a"],
      additionalProperties: false,
    });
  });
});

describe("typed steps in a worker", () => {
  const Out = s.object({ id: s.string() });
  function flow() {
    const wf = workflow<{ id: string }>("w1", { queue: "steps" });
    const one = wf.step("one", { reads: { id: wf.input.id }, output: Out, handler: ({ id }) => ({ id: `${id}!` }) });
    wf.step("two", {
      reads: { one },
      output: Out,
      handler: ({ one }) => (one.id === "bad" ? ({ id: 1 } as unknown as { id: string }) : { id: one.id }),
    });
    return wf;
  }

  it("registers each step's handler under its type, on the steps' queues", async () => {
    const wf = flow();
    assert.deepEqual(stepQueues([wf]), ["steps"]);
    const worker = workerFor([wf], { url: "http://127.0.0.1:1" });
    assert.deepEqual(worker.queues, ["steps"]);
    const handlers = stepHandlers([wf]);
    const task = (input: unknown): WorkerTask<any> =>
      ({ id: "t", run_id: "r", attempt: 1, node_id: "two", node_type: "w1.two", queue: "steps", input, lease_ttl_ms: 1000, signal: new AbortController().signal });
    const { runStep } = await import("../src/index.js");
    assert.deepEqual(await runStep(handlers[0]!.registration, task({ id: "a" })), { id: "a!" });
    // An output its schema refuses fails the attempt for good.
    await assert.rejects(
      Promise.resolve(runStep(handlers[1]!.registration, task({ one: { id: "bad" } }))),
      (e: unknown) => e instanceof TaskError && !e.retryable && /at \/id: expected a string/.test(e.message),
    );
    assert.throws(() => stepHandlers([wf, (() => { const o = workflow("w1"); o.step("one", { reads: {}, handler: () => 1 }); return o; })()]), /two handlers/);
    void attach(new Worker({ url: "http://127.0.0.1:1", queues: ["x"] }), [wf]);
  });

  it("runs the handlers for tasks of a fake coordinator and registers the workflow with its version", async () => {
    const wf = flow();
    const completed: unknown[] = [];
    let served = false;
    const server = await fakeServer((req, body, res) => {
      if (req.url?.startsWith("/v1/workflows")) return json(res, 201, { id: "x", name: "w1", version: 3, created_at: "t" });
      if (req.url === "/v1/tasks/poll") {
        if (served) {
          setTimeout(() => json(res, 200, { tasks: [] }), 50);
          return;
        }
        served = true;
        return json(res, 200, {
          tasks: [{ id: "t1", run_id: "r", attempt: 1, node_id: "one", node_type: "w1.one", queue: "steps", input: { id: "a" }, lease_ttl_ms: 60_000 }],
        });
      }
      if (req.url === "/v1/tasks/t1/complete") {
        completed.push((JSON.parse(body) as { output: unknown }).output);
        return json(res, 200, { applied: true });
      }
      json(res, 404, { error: { code: "not_found", message: req.url } });
    });
    try {
      const client = new Client({ url: server.url });
      const registered = await client.registerWorkflow(wf, { version: 3 });
      assert.equal(registered.created, true);
      assert.equal(server.requests[0]?.url, "/v1/workflows?version=3");
      assert.deepEqual(JSON.parse(server.requests[0]!.body), wf.definition());
      const worker = workerFor([wf], { url: server.url, pollWaitMs: 10, eager: false });
      const running = worker.run();
      const until = Date.now() + 10_000;
      while (completed.length === 0 && Date.now() < until) await new Promise((r) => setTimeout(r, 20));
      await worker.stop();
      await running;
      assert.deepEqual(completed, [{ id: "a!" }]);
    } finally {
      await server.close();
    }
  });
});

