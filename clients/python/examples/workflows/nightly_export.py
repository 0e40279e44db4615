"""examples/nightly_export.json in Python: a failure handler (a run of notify_failure)."""

import json

from composer_client.workflow import OnFailure, Retry, Workflow, expr, http

failed_run = expr(".failed_run")
wf = Workflow(
    "nightly_export",
    description=(
        "A failure handler: when an export fails (or times out, or is cancelled), a run of notify_failure is"
        " started in the same commit, with what failed."
    ),
    timeout="2h",
)
wf.on_failure = OnFailure(
    "notify_failure",
    on=["FAILED", "CANCELLED"],
    input={
        "run": failed_run["id"],
        "why": failed_run["error"],
        "export": failed_run["nodes"]["export"]["state"],
        "day": wf.input["day"],
        "target": wf.input["target"],
    },
)
wf.add(
    "export",
    http(f"{wf.input['target']}/exports", method="POST", body={"day": wf.input["day"]}, retry=Retry(max_attempts=3)),
)

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
