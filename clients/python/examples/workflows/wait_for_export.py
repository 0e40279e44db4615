"""examples/wait_for_export.json in Python: a LOOP of check_export until it says done."""

import json

from composer_client.workflow import Workflow, fail, iteration, loop, previous

wf = Workflow(
    "wait_for_export",
    description=(
        "LOOP: run check_export every second until it reports done, at most 60 times; the output is the last check"
        " and how many it took."
    ),
)
poll = wf.add(
    "poll",
    loop(
        "check_export",
        input={
            "target": wf.input["target"],
            "export": wf.input["export"],
            "try": iteration["index"],
            "last": previous["status"],
        },
        until=f'{iteration["output"]["status"].jq} == "done"',
        max_iterations=60,
        delay="1s",
    ),
)
wf.add(
    "gave_up",
    fail(f"export {wf.input['export']} was not done: {poll.error['message']}", code="export_not_done"),
    after=poll.on_failure(),
)
wf.output = poll["output"]

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
