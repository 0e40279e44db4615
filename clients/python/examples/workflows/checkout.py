"""examples/checkout.json in Python: SUB_WORKFLOW, billing as a child run."""

import json

from composer_client.workflow import Retry, Workflow, sub_workflow, transform

wf = Workflow(
    "checkout",
    description=(
        "SUB_WORKFLOW: billing is its own workflow (examples/billing.json, registered first); its output is this"
        " node's output. A failed billing run is retried as a new child run."
    ),
)
given = wf.input
bill = wf.add(
    "bill",
    sub_workflow(
        "billing",
        input={"target": given["target"], "customer": given["customer"], "amount": given["amount"]},
        timeout="10m",
        retry=Retry(max_attempts=2, initial_backoff="30s"),
    ),
)
receipt = wf.add("receipt", transform({"customer": given["customer"], "invoice": bill["invoice"]}))
wf.output = receipt

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
