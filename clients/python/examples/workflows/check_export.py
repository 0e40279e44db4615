"""examples/check_export.json in Python: one check of an export's status."""

import json

from composer_client.workflow import Workflow, http

wf = Workflow(
    "check_export",
    description=(
        'One check of an export\'s status (the iteration of wait_for_export). Input: {"target": base URL of the'
        ' services, "export": "exp_1"}.'
    ),
)
status = wf.add("status", http(f"{wf.input['target']}/exports/{wf.input['export']}"))
wf.output = {"status": status["body"]["status"]}

if __name__ == "__main__":
    print(json.dumps(wf.definition(), indent=2))
