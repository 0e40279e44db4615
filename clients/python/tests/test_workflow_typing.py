"""mypy --strict catches a step that reads another's output with the wrong
parameter type, and passes the same program written right. Needs mypy
(skipped without it); no server."""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from .support import PACKAGE_ROOT

PROGRAM = textwrap.dedent(
    """
    from dataclasses import dataclass
    from typing import TypedDict

    from composer_client.workflow import Node, Workflow, step


    @dataclass
    class Order:
        id: str
        amount: int


    @dataclass
    class Charge:
        id: str


    @dataclass
    class Shipment:
        tracking: str


    class Note(TypedDict):
        text: str


    @step(queue="payments")
    def charge_card(order: Order) -> Charge:
        return Charge(f"ch_{order.id}")


    def ship(order: Order, charge: Charge) -> Shipment:
        return Shipment(f"{order.id}/{charge.id}")


    def notify(shipment: Shipment) -> Note:
        return {"text": shipment.tracking}


    wf = Workflow("typed", input=Order)
    charge = wf.step(charge_card, wf.input)
    shipment: Node[Shipment] = wf.step(ship, wf.input, charge)
    note = wf.step(notify, READ)
    """
)


def mypy(source: str) -> "subprocess.CompletedProcess[str]":
    with tempfile.TemporaryDirectory(prefix="composer-typing-") as tmp:
        path = os.path.join(tmp, "typed_workflow.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT, MYPYPATH=PACKAGE_ROOT)
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--strict",
                "--no-incremental",
                "--cache-dir",
                os.path.join(tmp, ".cache"),
                path,
            ],
            check=False,
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )


class TypingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        try:
            import mypy  # noqa: F401
        except ImportError as e:
            raise unittest.SkipTest("mypy is not installed") from e

    def test_the_right_program_passes(self) -> None:
        done = mypy(PROGRAM.replace("READ", "shipment"))
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)

    def test_a_step_reading_the_wrong_type_fails(self) -> None:
        # notify takes a Shipment; charge is a Node[Charge].
        source = PROGRAM.replace("READ", "charge")
        done = mypy(source)
        self.assertNotEqual(done.returncode, 0, done.stdout)
        line = source.splitlines().index("note = wf.step(notify, charge)") + 1
        errors = [e for e in done.stdout.splitlines() if ": error:" in e]
        self.assertTrue(errors, done.stdout)
        self.assertIn(f"typed_workflow.py:{line}:", errors[0])
        # mypy binds the parameter's type from the Ref and says which two differ:
        # 'Argument 1 to "step" of "Workflow" has incompatible type "Callable[[Shipment], Note]";
        #  expected "Callable[[Charge], Note]"  [arg-type]'
        self.assertIn("incompatible type", errors[0])
        self.assertIn("[[Shipment]", errors[0])
        self.assertIn("[[Charge]", errors[0])
        self.assertEqual(len(errors), 1, done.stdout)

    def test_an_argument_in_the_wrong_place_fails(self) -> None:
        done = mypy(
            PROGRAM.replace("READ", "shipment").replace(
                "wf.step(ship, wf.input, charge)", "wf.step(ship, charge, wf.input)"
            )
        )
        self.assertNotEqual(done.returncode, 0, done.stdout)
        self.assertIn("Charge", done.stdout)

    def test_a_result_of_the_wrong_type_fails(self) -> None:
        done = mypy(
            PROGRAM.replace("READ", "shipment").replace(
                "shipment: Node[Shipment] = wf.step(ship,", "shipment: Node[Charge] = wf.step(ship,"
            )
        )
        self.assertNotEqual(done.returncode, 0, done.stdout)


if __name__ == "__main__":
    unittest.main()
