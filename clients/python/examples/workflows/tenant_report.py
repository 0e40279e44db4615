"""examples/tenant_report.json in Python: a priority and a fairness key."""

import json

from composer_client.workflow import Workflow, http

wf = Workflow(
    "tenant_report",
    description=(
        "Priorities and fairness: reports run at priority 4 (urgent ones are started with --priority 1); at most 20"
        " run at once, and the tenants' queued reports take turns, so one tenant's thousand queued reports do not"
        " hold up another's one."
    ),
    priority=4,
    concurrency=20,
)
wf.fairness_key = wf.input["tenant"]
wf.add(
    "build",
    http(
        f"{wf.input['target']}/echo/reports/build",
        method="POST",
        body={"tenant": wf.input["tenant"], "month": wf.input["month"]},
    ),
)

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
