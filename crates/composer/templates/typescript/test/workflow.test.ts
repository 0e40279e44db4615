/**
 * The workflow, offline: `composer workflow simulate` runs its definition
 * through the engine's state machine, and each step is answered by its own
 * handler here. Needs `composer` on PATH, or COMPOSER_BIN.
 */

import assert from "node:assert/strict";
import { it } from "node:test";

import { simulate, TaskError } from "@composer/client";

import wf from "../src/workflow.js";

it("greets in the person's language, loudly", async () => {
  const report = await simulate(wf, { name: "Ada", language: "fr" });
  assert.equal(report.status, "SUCCEEDED");
  assert.deepEqual(report.output, { for: "Ada", said: "Bonjour, Ada!", shouted: "BONJOUR, ADA!" });
});

it("retries a step that throws, then fails the run", async () => {
  const report = await simulate(wf, { name: "Ada" }, { mocks: { greet: () => { throw new Error("down"); } } });
  assert.equal(report.status, "FAILED");
  assert.equal(report.nodes.find((n) => n.id === "greet")?.attempts, 3);
});

it("fails at once on an error that is not retryable", async () => {
  const refuse = () => {
    throw new TaskError("no", { retryable: false });
  };
  const report = await simulate(wf, { name: "Ada" }, { mocks: { shout: refuse } });
  assert.equal(report.status, "FAILED");
  assert.equal(report.nodes.find((n) => n.id === "shout")?.attempts, 1);
});

it("refuses an input its schema does not take", async () => {
  await assert.rejects(simulate(wf, { name: "" }), /input_schema/);
});
