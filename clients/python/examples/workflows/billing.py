"""examples/billing.json in Python: a charge whose Idempotency-Key is its run's id."""

import json

from composer_client.workflow import Retry, Workflow, http, run_id

wf = Workflow(
    "billing",
    description=(
        "The child of checkout: charges the customer once (the Idempotency-Key is this run's, so a retried call"
        " is not a second charge) and returns the invoice."
    ),
)
charge = wf.add(
    "charge",
    http(
        f"{wf.input['target']}/pay/charge",
        method="POST",
        idempotency_key=f"bill-{run_id}",
        body={"amount": wf.input["amount"], "customer": wf.input["customer"]},
        retry=Retry(max_attempts=3, initial_backoff="1s"),
    ),
)
wf.output = {"invoice": charge["body"]["id"], "amount": charge["body"]["amount"]}

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
