"""examples/fulfil_on_order.json in Python: a trigger, one run per order."""

import json

from composer_client.workflow import Trigger, Workflow, expr, transform

wf = Workflow(
    "fulfil_on_order",
    description=(
        "Started by every order.created event with a total: one run per order (the order's id is the idempotency"
        " key), whatever sends the event and however often."
    ),
    triggers=[
        Trigger(
            "order.created",
            when=".event.payload.total > 0",
            input=expr(".event.payload"),
            idempotency_key=f"order-{expr('.event.payload.order')}",
        )
    ],
)
wf.add("pack", transform({"order": wf.input["order"], "items": expr(".input.items // []")}))

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
