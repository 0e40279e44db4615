/** Running workflows' typed steps in a worker, and registering the workflows first. */

import { Client, type RegisteredWorkflow } from "../client.js";
import { Worker, type Handler, type RunOptions, type WorkerOptions } from "../worker.js";
import { runStep, type WorkflowBuilder, type WorkflowHandler } from "./builder.js";

/** The handlers of the workflows' typed steps, by type (a type handled twice must be the same handler). */
export function stepHandlers(workflows: readonly WorkflowBuilder<any, any>[]): WorkflowHandler[] {
  const byType = new Map<string, WorkflowHandler>();
  for (const wf of workflows) {
    for (const h of wf.handlers()) {
      const known = byType.get(h.type);
      if (known !== undefined && known.registration.handler !== h.registration.handler) {
        throw new TypeError(
          `type ${h.type} has two handlers (${known.workflow}.${known.node} and ${h.workflow}.${h.node}): give the steps their own type`,
        );
      }
      byType.set(h.type, h);
    }
  }
  return [...byType.values()];
}

/** The worker handler that runs a typed step (its output checked against its schema). */
export function stepHandler(h: WorkflowHandler): Handler<any> {
  return (task) => runStep(h.registration, task);
}

/** Registers the workflows' typed steps' handlers on `worker`; answers the worker. */
export function attach(worker: Worker, workflows: readonly WorkflowBuilder<any, any>[]): Worker {
  for (const h of stepHandlers(workflows)) worker.handle(h.type, stepHandler(h));
  return worker;
}

/** The queues the workflows' typed steps go to, each once. */
export function stepQueues(workflows: readonly WorkflowBuilder<any, any>[]): string[] {
  return [...new Set(stepHandlers(workflows).map((h) => h.queue))].sort();
}

/**
 * A worker that runs the workflows' typed steps: its `queues` are theirs
 * (unless given), its handlers theirs (add your own with `handle`).
 */
export function workerFor(workflows: readonly WorkflowBuilder<any, any>[], options: WorkerOptions): Worker {
  const queues = options.queues ?? stepQueues(workflows);
  const worker = new Worker({ ...options, ...(queues.length > 0 ? { queues } : {}) });
  return attach(worker, workflows);
}

/** `registerWorkflow`'s options. */
export interface RegisterOptions {
  /** The version meant (`?version=N`): 409 when N holds another definition or is not the next. */
  version?: number | undefined;
}

/** Registers each workflow's definition, in order (a child before its parent); answers the versions. */
export async function registerWorkflows(
  client: Client,
  workflows: readonly WorkflowBuilder<any, any>[],
  options: RegisterOptions = {},
): Promise<RegisteredWorkflow[]> {
  const out: RegisteredWorkflow[] = [];
  for (const wf of workflows) out.push(await client.registerWorkflow(wf.definition(), options));
  return out;
}

export interface ServeOptions extends WorkerOptions {
  /** The workflows to register and whose typed steps to run. */
  workflows: readonly WorkflowBuilder<any, any>[];
  /** The API token registration needs (`COMPOSER_API_TOKEN`); `token` when not given. */
  apiToken?: string | undefined;
  /** Register the workflows before polling (default true). */
  register?: boolean | undefined;
  /** The version each must be registered as (see `RegisterOptions.version`). */
  version?: number | undefined;
  /** Called with what registration answered. */
  onRegistered?: ((registered: RegisteredWorkflow[]) => void) | undefined;
  /** Stops the worker gracefully when aborted. */
  signal?: AbortSignal | undefined;
}

/**
 * Registers the workflows, then runs a worker for their typed steps until
 * it stops (`signal` aborted, or SIGTERM/SIGINT with `handleSignals`); both
 * in `namespace`, when given.
 */
export async function serve(options: ServeOptions, run: RunOptions = {}): Promise<void> {
  const { workflows, apiToken, register, version, onRegistered, signal, ...workerOptions } = options;
  if (register ?? true) {
    const client = new Client({
      url: options.url,
      token: apiToken ?? options.token,
      namespace: options.namespace,
      fetch: options.fetch,
    });
    const registered = await registerWorkflows(client, workflows, { version });
    onRegistered?.(registered);
  }
  const worker = workerFor(workflows, workerOptions);
  if (signal?.aborted) return;
  const stop = () => void worker.stop();
  signal?.addEventListener("abort", stop, { once: true });
  try {
    await worker.run(run);
  } finally {
    signal?.removeEventListener("abort", stop);
  }
}
