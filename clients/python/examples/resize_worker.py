"""An example worker: serves the custom node type `resize-image` on queue
`images` (or `$QUEUE`). Run it beside `composer dev`:

    COMPOSER_URL=http://127.0.0.1:8080 python3 clients/python/examples/resize_worker.py

(`pip install ./clients/python` first, or put clients/python on PYTHONPATH)
and register a definition with a node
`{"id": "thumb", "type": "resize-image", "queue": "images", "config": {"width": 128}}`.
SIGTERM (or ctrl-c) stops it once its running tasks have reported.
"""

import logging
import os
import time
from typing import Any

from composer_client.worker import Task, TaskError, Worker


def resize(task: Task) -> dict[str, Any]:
    width = task.input.get("width")
    if not isinstance(width, int) or width <= 0:
        raise TaskError(f"width must be a positive integer, got {width!r}", retryable=False)
    # Stands in for real work; long enough for the heartbeat to matter.
    deadline = time.monotonic() + float(os.environ.get("RESIZE_SECONDS", "0.1"))
    while time.monotonic() < deadline:
        if task.cancelled.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
            break  # the lease is lost: the result would be dropped anyway
    return {"width": width, "resized_by": os.getpid()}


if __name__ == "__main__":
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    Worker(
        os.environ.get("COMPOSER_URL", "http://127.0.0.1:8080"),
        os.environ.get("COMPOSER_WORKER_TOKEN"),
        queues=[os.environ.get("QUEUE", "images")],
        concurrency=int(os.environ.get("CONCURRENCY", "4")),
        namespace=os.environ.get("COMPOSER_NAMESPACE"),
    ).handle("resize-image", resize).run()
