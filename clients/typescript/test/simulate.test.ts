/**
 * `simulate()`: a workflow's own handlers answer `composer workflow
 * simulate --ask`, offline. Needs the composer binary (COMPOSER_BIN).
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { describe, it } from "node:test";

import { s, simulate, SimulatedTimeout, task, TaskError, workflow, type SimulateOptions } from "../src/index.js";
import { composerBin } from "./dev.js";

const bin = composerBin();
const hasAsk = existsSync(bin) && /--ask/.test(spawnSync(bin, ["workflow", "simulate", "--help"], { encoding: "utf8" }).stdout);
const skip = !hasAsk && `no composer with simulate --ask at ${bin}`;

const Order = s.object({ id: s.string(), amount: s.number() });
const Charge = s.object({ id: s.string(), cents: s.integer() });

function orderFlow(calls: string[] = []) {
  const wf = workflow("sim_order", { input: Order });
  const charge = wf.step("charge", {
    reads: { order: wf.input },
    output: Charge,
    retry: { max_attempts: 3, initial_backoff: "1s" },
    handler: ({ order }, task) => {
      calls.push(`charge#${task.attempt}`);
      if (order.amount > 1000) throw new TaskError("declined", { retryable: false });
      if (order.amount < 0) throw new Error(`flaky attempt ${task.attempt}`);
      return { id: `ch-${order.id}`, cents: Math.round(order.amount * 100) };
    },
  });
  const shipped = wf.waitForEvent<{ carrier: string }>("shipped", { event: "shipment.sent", key: wf.input.id }, { after: charge });
  const label = wf.step("label", {
    reads: { charge: charge.out.id, carrier: shipped.out.carrier },
    handler: ({ charge, carrier }) => {
      calls.push("label");
      return { label: `${charge} via ${carrier}` };
    },
  });
  return wf.returns({ label: label.out.label, cents: charge.out.cents });
}

const opts = (o: SimulateOptions = {}): SimulateOptions => ({ bin, ...o });

describe("simulate", { skip }, () => {
  it("runs the steps' own handlers and answers the typed report", async () => {
    const calls: string[] = [];
    const report = await simulate(orderFlow(calls), { id: "o1", amount: 12.5 }, opts({ mocks: { shipped: { carrier: "DHL" } } }));
    assert.equal(report.status, "SUCCEEDED");
    const out: { label: string; cents: number } | null = report.output;
    assert.deepEqual(out, { label: "ch-o1 via DHL", cents: 1250 });
    assert.deepEqual(calls, ["charge#1", "label"]);
    assert.deepEqual(
      report.asks.map((a) => [a.ask.node, a.ask.type, a.ask.attempt]),
      [
        ["charge", "sim_order.charge", 1],
        ["label", "sim_order.label", 1],
      ],
    );
    assert.deepEqual(report.asks[0]?.ask.input, { order: { id: "o1", amount: 12.5 } });
    assert.equal(report.nodes.find((n) => n.id === "charge")?.state, "COMPLETED");
  });

  it("retries a handler that throws, under the node's retry policy, then fails the run", async () => {
    const calls: string[] = [];
    const report = await simulate(orderFlow(calls), { id: "o2", amount: -1 }, opts());
    assert.equal(report.status, "FAILED");
    assert.deepEqual(calls, ["charge#1", "charge#2", "charge#3"]);
    const charge = report.nodes.find((n) => n.id === "charge");
    assert.equal(charge?.state, "FAILED");
    assert.equal(charge?.attempts, 3);
    assert.match(String(report.error), /flaky attempt 3/);
    assert.deepEqual(report.asks[0]?.answer, { error: "Error: flaky attempt 1", retryable: true });
  });

  it("fails at once on a TaskError that is not retryable", async () => {
    const calls: string[] = [];
    const report = await simulate(orderFlow(calls), { id: "o3", amount: 5000 }, opts());
    assert.equal(report.status, "FAILED");
    assert.deepEqual(calls, ["charge#1"]);
    assert.deepEqual(report.asks[0]?.answer, { error: "declined", retryable: false });
  });

  it("answers with a mock function per node instead of its handler, and a timeout", async () => {
    const calls: string[] = [];
    let asked = 0;
    const report = await simulate(
      orderFlow(calls),
      { id: "o4", amount: 1 },
      opts({
        mocks: {
          charge: (input: { order: { id: string } }) => {
            asked += 1;
            if (asked === 1) throw new SimulatedTimeout();
            return { id: `mock-${input.order.id}`, cents: 7 };
          },
          shipped: { carrier: "UPS" },
        },
      }),
    );
    assert.equal(report.status, "SUCCEEDED");
    assert.deepEqual(report.output, { label: "mock-o4 via UPS", cents: 7 });
    assert.deepEqual(calls, ["label"], "charge's own handler did not run");
    assert.deepEqual(report.asks[0]?.answer, { timeout: true });
    assert.equal(report.nodes.find((n) => n.id === "charge")?.attempts, 2);
  });

  it("checks a step's output against its schema", async () => {
    const wf = workflow<{ n: number }>("sim_schema");
    wf.step("bad", { reads: { n: wf.input.n }, output: s.object({ id: s.string() }), handler: () => ({ id: 42 }) as unknown as { id: string } });
    const report = await simulate(wf, { n: 1 }, opts());
    assert.equal(report.status, "FAILED");
    assert.match(String(report.error), /output does not match its schema at \/id: expected a string/);
  });

  it("takes --fail, handlers by type for nodes of other workers, and MAP items", async () => {
    const wf = workflow<{ items: string[] }>("sim_map");
    const each = wf.map("each", { items: wf.input.items, node: (item) => task<string>("upper", { v: item }) });
    wf.http("notify", { url: "https://example.com" }, { after: each });
    const ok = await simulate(wf, { items: ["a", "b"] }, opts({ handlers: { upper: (input: { v: string }) => input.v.toUpperCase() } }));
    assert.equal(ok.status, "SUCCEEDED");
    assert.deepEqual(ok.nodes.find((n) => n.id === "each")?.output, ["A", "B"]);
    assert.deepEqual(
      ok.asks.map((a) => a.ask.key),
      ["each[0]", "each[1]", "notify"],
    );
    assert.deepEqual(ok.asks[2]?.answer, { mock: true }, "an HTTP node without a mock takes the default");
    const failed = await simulate(wf, { items: [] }, opts({ failures: { notify: "down" } }));
    assert.equal(failed.status, "FAILED");
  });

  it("rejects a definition or an input composer refuses", async () => {
    // A TRANSFORM without its output: the definition as JSON, past the builder's checks.
    await assert.rejects(
      simulate({ name: "sim_bad", nodes: [{ id: "a", type: "TRANSFORM", config: {} }] }, {}, opts()),
      /refused sim_bad \(exit status 2\): .*output/,
    );
    await assert.rejects(simulate(orderFlow(), { id: 1, amount: 1 } as never, opts()), /input_schema at \/id/);
  });
});
