"""examples/order.json in Python: a charge with an idempotency key, a WAIT,
a WAIT_FOR_EVENT and a summary; a failure edge refunds and fails the run.

    python3 examples/workflows/order.py    # prints the definition
"""

import json

from composer_client.workflow import Retry, Workflow, fail, http, transform, wait, wait_for_event

wf = Workflow(
    "order",
    description=(
        "An order: charge it (one charge per order, however often the call is retried: the order's Idempotency-Key),"
        " cool off, wait for the shipment event, summarise. A declined charge takes the failure edge: refund, then"
        ' end the run FAILED. Input: {"target": base URL of the services (composer dev: http://HOST:PORT/demo),'
        ' "order_id": "o-1", "amount": 30}; an amount over 1000 is declined.'
    ),
)
order = wf.input

charge = wf.add(
    "charge",
    http(
        f"{order['target']}/pay/charge",
        method="POST",
        idempotency_key=f"order-{order['order_id']}",
        body={"amount": order["amount"], "order": order["order_id"]},
        request_timeout="10s",
        retry=Retry(max_attempts=5, initial_backoff="1s", multiplier=2.0, max_backoff="1m"),
    ),
)
cool_off = wf.add("cool_off", wait("2s"), after=charge)
shipped = wf.add("shipped", wait_for_event("shipment.sent", order["order_id"], timeout="7d"), after=cool_off)
# Reads charge and shipped: an edge from shipped (charge is upstream of it already).
summary = wf.add("summary", transform({"paid": charge["body"]["id"], "carrier": shipped["carrier"]}))
refund = wf.add(
    "refund",
    http(
        f"{order['target']}/pay/refund",
        method="POST",
        body={"order": order["order_id"], "reason": charge.error["code"], "status": charge.error["status"]},
    ),
    after=charge.on_failure(),
)
wf.add(
    "order_failed",
    fail(
        f"order {order['order_id']} was not charged ({charge.error['message']}); it was refunded",
        code="charge_failed",
    ),
    after=refund,
)
wf.output = {"summary": summary, "order": order["order_id"]}

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
