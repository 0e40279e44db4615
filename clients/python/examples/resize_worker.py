"""An example worker: serves the custom node type `resize-image` on queue
`images`. Run it beside `composer dev`:

    COMPOSER_URL=http://127.0.0.1:8080 python3 clients/python/examples/resize_worker.py

and register a definition with a node
`{"id": "thumb", "type": "resize-image", "queue": "images", "config": {"width": 128}}`.
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from composer_worker import Task, TaskError, Worker  # noqa: E402


def resize(task: Task) -> dict:
    width = task.input.get("width")
    if not isinstance(width, int) or width <= 0:
        raise TaskError(f"width must be a positive integer, got {width!r}", retryable=False)
    # Stands in for real work; long enough for the heartbeat to matter.
    time.sleep(float(os.environ.get("RESIZE_SECONDS", "0.1")))
    return {"width": width, "resized_by": os.getpid()}


if __name__ == "__main__":
    Worker(
        os.environ.get("COMPOSER_URL", "http://127.0.0.1:8080"),
        os.environ.get("COMPOSER_WORKER_TOKEN"),
        queues=["images"],
        concurrency=int(os.environ.get("CONCURRENCY", "4")),
    ).handle("resize-image", resize).run()
