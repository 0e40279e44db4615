/**
 * Tests without a server: `composer workflow simulate --ask` runs the
 * definition through the engine's state machine, and asks this process for
 * each attempt a worker would run; the answer is the step's own handler's.
 */

import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { resolveSecrets } from "../secrets.js";
import { TaskError } from "../task-error.js";
import type { JsonValue, WorkflowDefinition } from "../types.js";
import type { WorkerTask } from "../worker.js";
import { runStep, type WorkflowBuilder } from "./builder.js";
import { stepHandlers } from "./serve.js";

/** What `composer workflow simulate` asks: one attempt a worker would run. */
export interface SimulationAsk {
  node: string;
  /** The task's key: the node's id, `ship[2]` for a MAP item. */
  key: string;
  type: string;
  input: JsonValue;
  attempt: number;
}

/** One node of a simulation's report. */
export interface SimulatedNode {
  id: string;
  type: string;
  state: string;
  attempts: number;
  input: JsonValue;
  output: JsonValue;
  error: JsonValue;
}

/** One edge of a simulation's report. */
export interface SimulatedEdge {
  from: string;
  to: string;
  on: "success" | "failure" | "always";
  taken: boolean;
}

/** What a simulated run ended as (`--format json`'s report), and what was asked and answered. */
export interface SimulationReport<O = unknown> {
  status: "SUCCEEDED" | "FAILED" | (string & {});
  output: O | null;
  error: string | null;
  nodes: SimulatedNode[];
  edges: SimulatedEdge[];
  /** Each attempt asked, in order, with the answer given. */
  asks: Array<{ ask: SimulationAsk; answer: SimulationAnswer }>;
}

/** An answer to an ask, as the protocol writes it. */
export type SimulationAnswer =
  | { output: JsonValue }
  | { error: string; retryable: boolean }
  | { timeout: true }
  | { mock: true };

/** Thrown (or returned) by a handler or mock in a simulation: the attempt timed out. */
export class SimulatedTimeout extends Error {
  constructor() {
    super("the attempt timed out");
    this.name = "SimulatedTimeout";
  }
}

/** A function that answers an attempt: its output, or it throws (a `TaskError` says whether it is retryable). */
export type SimulatedHandler = (input: any, task: WorkerTask<any>) => unknown;

export interface SimulateOptions {
  /** Handlers by node type, for types this workflow's typed steps do not handle (a worker's elsewhere). */
  handlers?: Record<string, SimulatedHandler> | undefined;
  /**
   * By node id: a function answers each attempt of the node (a MAP's
   * items too) instead of its handler; a value is the node's output (an
   * HTTP or custom node) or its event's payload (WAIT_FOR_EVENT), as
   * `--mock NODE=JSON`.
   */
  mocks?: Record<string, SimulatedHandler | JsonValue> | undefined;
  /** Nodes each attempt of which fails (`--fail NODE[=MESSAGE]`): an id, or id to message. */
  failures?: readonly string[] | Record<string, string> | undefined;
  /** The composer binary (default `$COMPOSER_BIN`, else `composer` on the PATH). */
  bin?: string | undefined;
  /** Where secrets are read (`COMPOSER_SECRET_NAME`, default `process.env`). */
  env?: Record<string, string | undefined> | undefined;
}

/** The binary `simulate` runs: `bin`, else `$COMPOSER_BIN`, else `composer`. */
export function composerCommand(bin?: string): string {
  return bin ?? (process.env["COMPOSER_BIN"] || "composer");
}

function describe(e: unknown): string {
  return e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}

/**
 * Runs `wf` on `input` offline with `composer workflow simulate --ask`:
 * each attempt of a typed step runs its handler here (a mock first, when
 * there is one), and the run's report is answered. Rejects when the
 * definition or an argument is invalid (exit status 2).
 */
export async function simulate<I, O>(
  wf: WorkflowBuilder<I, O> | WorkflowDefinition,
  input: NoInfer<I>,
  options: SimulateOptions = {},
): Promise<SimulationReport<O>> {
  const definition = "definition" in wf && typeof wf.definition === "function" ? wf.definition() : (wf as WorkflowDefinition);
  const steps = new Map("handlers" in wf && typeof wf.handlers === "function" ? stepHandlers([wf]).map((h) => [h.type, h]) : []);
  const functions = new Map<string, SimulatedHandler>();
  const args: string[] = [];
  for (const [node, mock] of Object.entries(options.mocks ?? {})) {
    if (typeof mock === "function") functions.set(node, mock);
    else args.push("--mock", `${node}=${JSON.stringify(mock)}`);
  }
  const failures = options.failures ?? [];
  for (const [node, message] of Array.isArray(failures) ? failures.map((n) => [n, undefined]) : Object.entries(failures)) {
    args.push("--fail", message === undefined ? String(node) : `${node}=${message}`);
  }
  const work = mkdtempSync(join(tmpdir(), "composer-simulate-"));
  try {
    const file = join(work, `${definition.name}.json`);
    writeFileSync(file, JSON.stringify(definition));
    const child = spawn(
      composerCommand(options.bin),
      ["workflow", "simulate", "--file", file, "--input", JSON.stringify(input ?? {}), "--ask", "--output", "json", ...args],
      { stdio: ["pipe", "pipe", "pipe"], env: { ...process.env, COMPOSER_LOG: process.env["COMPOSER_LOG"] ?? "error" } },
    );
    let stderr = "";
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (c: string) => (stderr += c));
    const exited = new Promise<number | null>((resolve, reject) => {
      child.once("error", reject);
      child.once("close", (code) => resolve(code));
    });
    // Writing to a composer that exited (a refused definition) must not throw out of here.
    child.stdin.on("error", () => {});
    const asks: SimulationReport<O>["asks"] = [];
    let report: Omit<SimulationReport<O>, "asks"> | undefined;
    const other: string[] = [];
    const lines = createInterface({ input: child.stdout, crlfDelay: Infinity });
    const reading = (async () => {
      for await (const line of lines) {
        let message: unknown;
        try {
          message = JSON.parse(line);
        } catch {
          other.push(line);
          continue;
        }
        if (typeof message === "object" && message !== null && "ask" in message) {
          const ask = (message as { ask: SimulationAsk }).ask;
          const answer = await answerAsk(ask, steps, functions, options);
          asks.push({ ask, answer });
          child.stdin.write(`${JSON.stringify(answer)}\n`);
        } else if (typeof message === "object" && message !== null && "report" in message) {
          report = (message as { report: Omit<SimulationReport<O>, "asks"> }).report;
        } else {
          other.push(line);
        }
      }
    })();
    const [code] = await Promise.all([exited, reading]);
    child.stdin.end();
    if (code === 2 || code === null || (code !== 0 && code !== 1)) {
      throw new Error(`composer workflow simulate refused ${definition.name} (exit status ${code}): ${stderr.trim()}`);
    }
    if (report === undefined) {
      // A report printed as a document rather than a {"report"} line.
      try {
        report = JSON.parse(other.join("\n")) as Omit<SimulationReport<O>, "asks">;
      } catch {
        throw new Error(`composer workflow simulate gave no report (exit status ${code}): ${stderr.trim()}`);
      }
    }
    return { ...report, asks };
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

async function answerAsk(
  ask: SimulationAsk,
  steps: Map<string, ReturnType<typeof stepHandlers>[number]>,
  functions: Map<string, SimulatedHandler>,
  options: SimulateOptions,
): Promise<SimulationAnswer> {
  const mock = functions.get(ask.node);
  const step = steps.get(ask.type);
  const handler = options.handlers?.[ask.type];
  if (mock === undefined && step === undefined && handler === undefined) return { mock: true };
  try {
    const used: string[] = [];
    const input = resolveSecrets(ask.input, used, options.env ?? process.env);
    const task: WorkerTask<any> = {
      id: `simulated:${ask.key}`,
      run_id: "simulated",
      attempt: ask.attempt,
      node_id: ask.node,
      node_type: ask.type,
      queue: step?.queue ?? ask.type.toLowerCase(),
      input,
      lease_ttl_ms: 60_000,
      signal: new AbortController().signal,
    };
    const out =
      mock !== undefined ? await mock(input, task) : step !== undefined ? await runStep(step.registration, task) : await handler!(input, task);
    if (out instanceof SimulatedTimeout) return { timeout: true };
    const text = JSON.stringify(out === undefined ? null : out);
    if (text === undefined) return { error: "the handler's answer is not JSON", retryable: true };
    return { output: JSON.parse(text) as JsonValue };
  } catch (e) {
    if (e instanceof SimulatedTimeout) return { timeout: true };
    if (e instanceof TaskError) return { error: e.message, retryable: e.retryable };
    return { error: describe(e), retryable: true };
  }
}
