"""examples/notify_failure.json in Python: the handler of nightly_export's failures."""

import json

from composer_client.workflow import Workflow, http

wf = Workflow(
    "notify_failure",
    description="The handler of nightly_export's failures: posts what failed to a chat hook.",
)
given = wf.input
wf.add(
    "post",
    http(
        f"{given['target']}/echo/chat/hooks/ops",
        method="POST",
        body={"text": f"export for {given['day']} ended {given['export']}: {given['why']}", "run": given["run"]},
    ),
)

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
