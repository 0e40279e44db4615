"""examples/branching.yaml in Python: a branch on the input, a join after either branch."""

import json

from composer_client.workflow import Workflow, expr, transform, wait

wf = Workflow("branching")
start = wf.add("start", transform({"big": expr(".input.amount > 100")}))
big = start["big"]
review = wf.add("review", wait("2s"), after=start.when(big))
fast_track = wf.add("fast_track", transform({"track": "fast"}), after=start.when(f"{big.jq} | not"))
wf.add(
    "done",
    transform({"amount": wf.input["amount"], "reviewed": expr(f'{review.state.jq} == "COMPLETED"')}),
    after=[review, fast_track],
)

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
