"""examples/sync_account.json in Python: at most one run per customer at a time."""

import json

from composer_client.workflow import Concurrency, Workflow, http

wf = Workflow(
    "sync_account",
    description=(
        "Concurrency limit: at most one sync per customer at a time; more runs for a customer wait QUEUED and start"
        " oldest first."
    ),
)
wf.concurrency = Concurrency(1, key=wf.input["customer_id"])
wf.add(
    "pull",
    http(f"{wf.input['target']}/echo/crm/sync", method="POST", body={"customer": wf.input["customer_id"]}),
)

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
