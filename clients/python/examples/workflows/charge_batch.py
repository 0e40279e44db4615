"""examples/charge_batch.json in Python: rate and concurrency limits, and a named limit."""

import json

from composer_client.workflow import Limit, Workflow, http, item, map_

wf = Workflow(
    "charge_batch",
    description=(
        "Limits on steps across runs: charges go out at most 25 a second (a burst of 50) per Stripe account, and at"
        " most 4 CRM updates are in flight across every run; a 429 with Retry-After holds the account's key that"
        " long. 'partner' is a named limit: set it with PUT /v1/limits/partner."
    ),
)
target, account = wf.input["target"], wf.input["account"]
charge_each = wf.add(
    "charge_each",
    map_(
        wf.input["charges"],
        http(
            f"{target}/pay/charge",
            method="POST",
            body=item,
            limits=[Limit(f"stripe:{account}", rate="25/1s", burst=50)],
        ),
    ),
)
wf.add(
    "update_crm",
    http(
        f"{target}/echo/crm/accounts/{account}/charged",
        method="POST",
        limits=[Limit("crm", concurrency=4), Limit("partner")],
    ),
    after=charge_each,
)

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
