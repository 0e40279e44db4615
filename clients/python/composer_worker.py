"""The Python worker, under its old name: ``from composer_worker import
Worker, Task, TaskError, LeaseLost`` keeps working. New code imports
``composer_client.worker`` (installed with ``pip install ./clients/python``).
"""

from composer_client import worker as _worker
from composer_client.worker import LeaseLost, Task, TaskError, Worker

__all__ = ["LeaseLost", "Task", "TaskError", "Worker"]

# Not public, but the old module had them and its tests called them.
_resolve = _worker._resolve
_scrub = _worker._scrub
