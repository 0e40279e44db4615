"""An example client: registers a small workflow, starts a run of it with
an input, waits for it to end and prints what it gave. Run it beside
`composer dev`:

    COMPOSER_URL=http://127.0.0.1:8080 python3 clients/python/examples/start_and_wait.py Ada

(`pip install ./clients/python` first, or put clients/python on PYTHONPATH).
It exits 0 when the run SUCCEEDED, 1 when it failed or was cancelled, 2 when
the server refused a request and 4 when none answered.
"""

import logging
import os
import sys

from composer_client import Client, ComposerError, InvalidRequest, Unavailable, WaitTimeout

GREETING = {
    "name": "py-greeting",
    "nodes": [
        {"id": "greet", "type": "TRANSFORM", "config": {"output": {"text": "Hello, ${ .input.name }!"}}},
        {"id": "pause", "type": "WAIT", "config": {"duration": "200ms"}},
    ],
    "edges": [{"from": "greet", "to": "pause"}],
    "output": {"greeting": "${ .nodes.greet.output.text }"},
}


def main(name: str) -> int:
    client = Client(
        os.environ.get("COMPOSER_URL", "http://127.0.0.1:8080"),
        os.environ.get("COMPOSER_API_TOKEN"),
        namespace=os.environ.get("COMPOSER_NAMESPACE"),
    )
    try:
        registered = client.register_workflow(GREETING)
        print(
            f"workflow {registered['name']} version {registered['version']}"
            f" ({'new' if registered['created'] else 'unchanged'})"
        )
        run = client.start_run("py-greeting", input={"name": name})
        print(f"run {run['id']} {run['status']}")
        done = client.wait(run["id"], timeout=60)
    except WaitTimeout as e:
        print(f"still {e.run['status']} after {e.timeout:g}s", file=sys.stderr)
        return 5
    except InvalidRequest as e:
        print(f"refused: {e.code}: {e.message}", file=sys.stderr)
        return 2
    except Unavailable as e:
        print(f"no answer: {e}", file=sys.stderr)
        return 4
    except ComposerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"run {done['id']} {done['status']}: {done.get('output')}")
    for step in done["tasks"]:
        print(f"  {step['node_id']:<8} {step['state']:<10} attempt {step['attempt']}")
    return 0 if done["status"] == "SUCCEEDED" else 1


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "WARNING"))
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "world"))
