"""Workflows in code: a definition declared in Python, with typed steps
run by this process's worker, registered at start, tested offline.

    from dataclasses import dataclass
    from composer_client.workflow import Workflow, http, simulate

    @dataclass
    class Order:
        id: str
        amount: int

    @dataclass
    class Charge:
        id: str
        amount: int

    def charge_card(order: Order) -> Charge:
        return Charge(f"ch_{order.id}", order.amount)

    def receipt(order: Order, charge: Charge) -> str:
        return f"{order.id}: {charge.id}"

    wf = Workflow("order", input=Order)
    charge = wf.step(charge_card, wf.input, queue="payments")   # Node[Charge]
    done = wf.step(receipt, wf.input, charge)                   # mypy checks Ref[Charge] -> charge: Charge
    wf.output = {"receipt": done}

    wf.definition()                     # the JSON the server takes
    simulate(wf, {"id": "o-1", "amount": 30}).output
    run_worker(wf)                      # registers it, then serves charge_card and receipt

``wf.add(id, spec)`` adds a node of any kind (``http``, ``transform``,
``wait``, ``wait_for_event``, ``map_``, ``loop``, ``sub_workflow``,
``fail``, ``custom``) with its options; ``after=`` adds edges
(``charge.on_failure()``, ``start.when(".nodes.start.output.big")``).
"""

from ._builder import NodeOptions, StepInfo, StepOptions, Workflow, WorkflowOptions, handler_for, step
from ._json import from_json, json_schema, to_json
from ._nodes import (
    Concurrency,
    HttpResponse,
    ItemOptions,
    Limit,
    OnFailure,
    Retry,
    Spec,
    Trigger,
    custom,
    fail,
    http,
    loop,
    map_,
    sub_workflow,
    transform,
    wait,
    wait_for_event,
)
from ._refs import After, Node, Ref, duration, expr, index, item, iteration, previous, run_id, secret
from ._run import (
    Ask,
    AttemptTimeout,
    SimulatedNode,
    Simulation,
    SimulationError,
    composer_bin,
    handlers_of,
    queues_of,
    register,
    run_worker,
    simulate,
    worker_for,
)

__all__ = [
    "After",
    "Ask",
    "AttemptTimeout",
    "Concurrency",
    "HttpResponse",
    "ItemOptions",
    "Limit",
    "Node",
    "NodeOptions",
    "OnFailure",
    "Ref",
    "Retry",
    "SimulatedNode",
    "Simulation",
    "SimulationError",
    "Spec",
    "StepInfo",
    "StepOptions",
    "Trigger",
    "Workflow",
    "WorkflowOptions",
    "composer_bin",
    "custom",
    "duration",
    "expr",
    "fail",
    "from_json",
    "handler_for",
    "handlers_of",
    "http",
    "index",
    "item",
    "iteration",
    "json_schema",
    "loop",
    "map_",
    "previous",
    "queues_of",
    "register",
    "run_id",
    "run_worker",
    "secret",
    "simulate",
    "step",
    "sub_workflow",
    "to_json",
    "transform",
    "wait",
    "wait_for_event",
    "worker_for",
]
