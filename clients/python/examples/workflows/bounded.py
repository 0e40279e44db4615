"""examples/bounded.json in Python: a time limit on each attempt and on the run."""

import json

from composer_client.workflow import Retry, Workflow, http, transform

wf = Workflow(
    "bounded",
    description=(
        'Time limits: each attempt of the charge gets 10 seconds, the whole run one hour. Input: {"target": base'
        ' URL of the services (composer dev: http://HOST:PORT/demo), "amount": 30}.'
    ),
    timeout="1h",
)
charge = wf.add(
    "charge",
    http(
        f"{wf.input['target']}/pay/charge",
        method="POST",
        body={"amount": wf.input["amount"]},
        timeout="10s",  # the node's: one attempt (request_timeout= would be the call's)
        retry=Retry(max_attempts=3, initial_backoff="2s"),
    ),
)
receipt = wf.add("receipt", transform({"paid": wf.input["amount"], "charge": charge["body"]["id"]}))
wf.output = receipt

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
