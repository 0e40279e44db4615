"""examples/invoice_totals.json in Python: a MAP with a reduction instead of a list of outputs."""

import json

from composer_client.workflow import Retry, Workflow, http, item, map_

wf = Workflow(
    "invoice_totals",
    description=(
        "A MAP of up to a million items that keeps no list of outputs: a reduction sums the amounts as items end,"
        " and up to 1% of them may fail."
    ),
)
price = wf.add(
    "price",
    map_(
        wf.input["invoices"],
        http(f"{wf.input['target']}/invoices/{item}", retry=Retry(max_attempts=3)),
        max_concurrency=500,
        tolerated_failures="1%",
        collect={
            "init": {"total": 0, "failed": 0},
            "reduce": '.item as $i | .acc | if $i.state == "COMPLETED" then .total += $i.output.body.amount'
            " else .failed += 1 end",
        },
    ),
)
wf.output = price

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
