"""examples/hello.json in Python: an HTTP call, a one-second WAIT, another call."""

import json

from composer_client.workflow import Retry, Workflow, expr, http, wait

wf = Workflow(
    "hello",
    description=(
        'Three steps: call the health endpoint of the coordinator the run\'s input names ({"coordinator": URL}),'
        " pause for a second, call it again."
    ),
)
must_have = expr('.input.coordinator // error("the input names no coordinator URL")')
check = wf.add(
    "check",
    http(
        f"{must_have}/healthz",
        method="GET",
        request_timeout="5s",
        retry=Retry(max_attempts=3, initial_backoff="500ms"),
    ),
)
pause = wf.add("pause", wait("1s"), after=check)
wf.add("recheck", http(f"{wf.input['coordinator']}/healthz", method="GET"), after=pause)

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
