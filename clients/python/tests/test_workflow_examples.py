"""Each workflow of the repository's examples/ written in Python
(examples/workflows/<name>.py) builds exactly that definition.

No server: the JSON files are read as they are; examples/branching.yaml
is read with PyYAML when it is installed (``composer`` has no offline
command that prints a YAML definition as JSON), else that case is skipped.
"""

import importlib.util
import json
import unittest
from pathlib import Path
from types import ModuleType
from typing import Any

from composer_client.workflow import Workflow

PYTHON = Path(__file__).resolve().parent.parent
REPO = PYTHON.parent.parent
EXAMPLES = REPO / "examples"
PROGRAMS = PYTHON / "examples" / "workflows"

NOT_WORKFLOWS = {"schedules", "webhooks"}
"""Directories of examples/ holding schedules and webhooks, not workflows."""


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_definition(path: Path) -> Any:
    if path.suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))
    try:
        import yaml  # type: ignore[import-untyped,unused-ignore]
    except ImportError as e:
        raise unittest.SkipTest(f"{path.name}: PyYAML is not installed to read it") from e
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def example_files() -> list[Path]:
    return sorted([*EXAMPLES.glob("*.json"), *EXAMPLES.glob("*.yaml"), *EXAMPLES.glob("*.yml")])


class ExamplesTest(unittest.TestCase):
    def test_every_example_has_a_program(self) -> None:
        files = example_files()
        self.assertGreater(len(files), 10)
        missing = [p.name for p in files if not (PROGRAMS / f"{p.stem}.py").exists()]
        self.assertEqual(missing, [], "examples without a Python program in examples/workflows")
        extra = sorted({p.stem for p in PROGRAMS.glob("*.py")} - {p.stem for p in files})
        self.assertEqual(extra, [], "programs without an example")

    def test_schedules_and_webhooks_are_not_workflows(self) -> None:
        for sub in NOT_WORKFLOWS:
            for path in sorted((EXAMPLES / sub).glob("*.json")):
                data = json.loads(path.read_text(encoding="utf-8"))
                self.assertNotIn("nodes", data, f"{path} is a workflow: it needs a program too")

    def test_each_program_builds_its_example(self) -> None:
        for path in example_files():
            with self.subTest(example=path.name):
                expected = read_definition(path)
                module = load(PROGRAMS / f"{path.stem}.py")
                wf = module.wf
                self.assertIsInstance(wf, Workflow)
                got = wf.definition()
                # As data: key order does not matter, list order does.
                self.assertEqual(got, expected)
                # And it survives JSON.
                self.assertEqual(json.loads(json.dumps(got)), expected)


if __name__ == "__main__":
    unittest.main()
