"""The old entry point of the Python client's tests, kept so that
`COMPOSER_BIN=target/debug/composer python3 -m unittest clients/python/test_worker.py`
(scripts/test) still runs them: it loads the whole suite in tests/. The
command to use is

    COMPOSER_BIN=target/debug/composer python3 -m unittest discover -s clients/python/tests -t clients/python
"""

import os
import unittest
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))


def load_tests(loader: unittest.TestLoader, tests: unittest.TestSuite, pattern: Optional[str]) -> unittest.TestSuite:
    return loader.discover(start_dir=os.path.join(HERE, "tests"), top_level_dir=HERE)
