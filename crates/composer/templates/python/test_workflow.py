"""Tests of the workflow, offline: `composer workflow simulate` runs it
(no server) and asks this process to run each step's function.

    python3 -m unittest test_workflow

It needs the composer executable: on PATH, or COMPOSER_BIN=/path/to/composer.
"""

import unittest
from typing import Any

from composer_client.workflow import simulate

from workflow import Greeting, Person, greet, wf


class GreetTest(unittest.TestCase):
    def test_a_step_alone(self) -> None:
        self.assertEqual(greet(Person("Ada", "fr")), Greeting("Bonjour, Ada!", "fr"))

    def test_the_workflow(self) -> None:
        sim = simulate(wf, {"name": "Ada"})
        self.assertEqual(sim.status, "SUCCEEDED", sim.report)
        self.assertEqual(sim.output, {"for": "Ada", "said": "Hello, Ada!", "shouted": "HELLO, ADA!"})

    def test_a_mocked_step(self) -> None:
        def fake_greet(given: Any) -> Any:
            return {"text": "hi", "language": "en"}

        sim = simulate(wf, {"name": "Ada"}, mocks={"greet": fake_greet})
        self.assertEqual(sim.output["shouted"], "HI")

    def test_a_failing_step(self) -> None:
        sim = simulate(wf, {"name": "Ada"}, failures=["shout"])
        self.assertEqual(sim.status, "FAILED")
        self.assertEqual(sim.nodes["shout"]["state"], "FAILED")


if __name__ == "__main__":
    unittest.main()
