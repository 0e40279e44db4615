"""examples/pay_once.json in Python: an at-most-once charge."""

import json

from composer_client.workflow import Retry, Workflow, http

wf = Workflow(
    "pay_once",
    description=(
        "At most once: a charge whose outcome is unknown (its worker died, its request timed out) waits IN_DOUBT"
        " for an operator instead of being sent again; retries of one execution share one Idempotency-Key."
    ),
)
order = wf.input
wf.add(
    "charge",
    http(
        f"{order['target']}/pay/charge",
        method="POST",
        request_timeout="10s",
        idempotency_key=f"order-{order['order_id']}",
        body={"amount": order["amount"], "order": order["order_id"]},
        delivery="at_most_once",
        retry=Retry(max_attempts=3),
    ),
)

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
