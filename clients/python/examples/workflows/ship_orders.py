"""examples/ship_orders.json in Python: a MAP, ten at a time, an item's failure reported."""

import json

from composer_client.workflow import Retry, Workflow, expr, http, index, item, map_, transform

wf = Workflow(
    "ship_orders",
    description=("MAP: one shipment call per order, ten at a time; an order that cannot ship is reported, not fatal."),
)
ship_each = wf.add(
    "ship_each",
    map_(
        wf.input["orders"],
        http(
            f"{wf.input['target']}/echo/ship/orders",
            method="POST",
            body={"order": item["id"], "position": index},
            retry=Retry(max_attempts=3),
            timeout="30s",
        ),
        max_concurrency=10,
        on_item_failure="continue",
    ),
)
outputs = ship_each.jq
report = wf.add(
    "report",
    transform(
        {
            "shipped": expr(f'[{outputs}[] | select(has("error") | not)] | length'),
            "failed": expr(f'[{outputs} | to_entries[] | select(.value | has("error")) | .key]'),
        }
    ),
)
wf.output = report

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
