/**
 * Type errors caught: a program with a planted mismatch, compiled by
 * `tsc --strict --noEmit` against the package's declarations (dist/, built
 * by `npm test` first), fails naming the mismatch; the correct program passes.
 */

import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";

import { PACKAGE_DIR } from "./dev.js";

// Inside the package, so that `@composer/client` resolves to the package itself (its exports).
mkdirSync(join(PACKAGE_DIR, "build"), { recursive: true });
const work = mkdtempSync(join(PACKAGE_DIR, "build", "typecheck-"));
after(() => rmSync(work, { recursive: true, force: true }));

function tsc(name: string, source: string): { ok: boolean; out: string } {
  const file = join(work, `${name}.ts`);
  writeFileSync(file, source);
  const r = spawnSync(
    process.execPath,
    [
      join(PACKAGE_DIR, "node_modules", "typescript", "bin", "tsc"),
      "--strict",
      "--noEmit",
      "--module", "nodenext",
      "--moduleResolution", "nodenext",
      "--target", "es2022",
      "--types", "node",
      "--typeRoots", join(PACKAGE_DIR, "node_modules", "@types"),
      file,
    ],
    { cwd: work, encoding: "utf8" },
  );
  return { ok: r.status === 0, out: `${r.stdout}${r.stderr}` };
}

/** A program around one step; `$STEP` is where the step under test goes. */
const program = (step: string) => `
import { s, workflow } from "@composer/client";

const Charge = s.object({ id: s.string(), cents: s.integer() });
const wf = workflow("order", { input: s.object({ id: s.string(), amount: s.number() }) });
const charge = wf.step("charge", {
  reads: { order: wf.input },
  output: Charge,
  handler: async ({ order }) => ({ id: "ch-" + order.id, cents: Math.round(order.amount * 100) }),
});
${step}
export default wf;
`;

describe("tsc --strict", () => {
  it("passes the correct program", () => {
    const r = tsc(
      "good",
      program(`
        wf.step("ship", { reads: { chargeId: charge.out.id }, handler: ({ chargeId }) => ({ label: chargeId.toUpperCase() }) });
        wf.step("sum", { input: s.object({ cents: s.integer() }), reads: { cents: charge.out.cents }, handler: ({ cents }) => cents * 2 });
      `),
    );
    assert.ok(r.ok, r.out);
  });

  it("rejects a handler that treats charge.out.id (a string) as a number", () => {
    const r = tsc(
      "handler",
      program(`wf.step("ship", { reads: { chargeId: charge.out.id }, handler: ({ chargeId }) => ({ n: chargeId.toFixed(2) }) });`),
    );
    assert.ok(!r.ok, "tsc passed the planted mismatch");
    assert.match(r.out, /handler\.ts\(\d+,\d+\): error TS\d+: Property 'toFixed' does not exist on type 'string'/);
  });

  it("rejects a step whose declared input type is not what it reads", () => {
    const r = tsc(
      "input",
      program(`wf.step("sum", { input: s.object({ cents: s.string() }), reads: { cents: charge.out.cents }, handler: ({ cents }) => cents });`),
    );
    assert.ok(!r.ok, "tsc passed the planted mismatch");
    assert.match(r.out, /input\.ts\(\d+,\d+\): error TS2322: Type 'Schema<\{ cents: string; \}>' is not assignable/);
    assert.match(r.out, /the reads do not give the declared input; they give": \{ cents: number; \}/);
  });

  it("rejects a handler whose answer does not fit its output schema", () => {
    const r = tsc(
      "output",
      program(`wf.step("again", { reads: { o: wf.input }, output: Charge, handler: () => ({ id: "x", cents: "12" }) });`),
    );
    assert.ok(!r.ok, "tsc passed the planted mismatch");
    assert.match(r.out, /Type 'string' is not assignable to type 'number'/);
  });
});
