/** Workflows in code: the builder, the schemas, the worker's side and offline simulation. */

export {
  fail,
  http,
  loop,
  map,
  Node,
  runStep,
  step,
  subWorkflow,
  task,
  transform,
  wait,
  waitForEvent,
  workflow,
  WorkflowBuilder,
} from "./builder.js";
export type {
  After,
  Condition,
  EdgeOn,
  FailConfig,
  HttpConfig,
  HttpOutput,
  LimitSpec,
  LoopConfig,
  LoopOutput,
  MapConfig,
  NodeOptions,
  OnFailure,
  DeclaredInput,
  Reads,
  ReadValues,
  Resolved,
  RetrySpec,
  Spec,
  StepHandler,
  StepOptions,
  StepRegistration,
  SubWorkflowConfig,
  Template,
  Trigger,
  WaitConfig,
  WaitForEventConfig,
  WorkflowHandler,
  WorkflowOptions,
  WorkflowRef,
} from "./builder.js";
export { at, Expr, jq, ref, refs, tpl } from "./refs.js";
export type { EventInfo, FailedRun, NodeError, NodeState, Ref, RefBase, RefLike, RunInfo, ValueOf } from "./refs.js";
export { s } from "./schema.js";
export type { ArrayOptions, Infer, Issue, JsonSchema, NumberOptions, ObjectOf, ObjectOptions, OptionalSchema, Schema, StringOptions } from "./schema.js";
export { attach, registerWorkflows, serve, stepHandler, stepHandlers, stepQueues, workerFor } from "./serve.js";
export type { RegisterOptions, ServeOptions } from "./serve.js";
export { composerCommand, simulate, SimulatedTimeout } from "./simulate.js";
export type { SimulateOptions, SimulatedEdge, SimulatedHandler, SimulatedNode, SimulationAnswer, SimulationAsk, SimulationReport } from "./simulate.js";
