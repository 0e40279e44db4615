"""Each workflow of the repository's examples/ written in Python
(examples/workflows/<name>.py) builds exactly that definition.

No server. Every example, JSON and YAML alike, is compared as the server
stores it: ``composer workflow normalize`` (offline) of the example file
equals ``composer workflow normalize`` of the program's definition written
to a temporary file. The binary is ``$COMPOSER_BIN`` (default
``target/debug/composer`` from the repository's root); without it the
comparison fails, saying how to build it. The JSON examples are compared
as plain data too.
"""

import importlib.util
import json
import os
import subprocess
import tempfile
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


def example_files() -> list[Path]:
    return sorted([*EXAMPLES.glob("*.json"), *EXAMPLES.glob("*.yaml"), *EXAMPLES.glob("*.yml")])


def program_of(path: Path) -> Workflow[Any]:
    wf = load(PROGRAMS / f"{path.stem}.py").wf
    assert isinstance(wf, Workflow), f"{path.stem}.py: `wf` is not a Workflow"
    return wf


def composer_binary() -> str:
    """``$COMPOSER_BIN`` (default ``target/debug/composer`` from the
    repository's root), as an absolute path; fails the test when it is not
    an executable."""
    binary = os.path.abspath(os.environ.get("COMPOSER_BIN", str(REPO / "target" / "debug" / "composer")))
    if not os.access(binary, os.X_OK):
        raise AssertionError(
            f"no composer binary at {binary}: build it from the repository's root with "
            "`cargo build -p composer` (it is then target/debug/composer), "
            "or set COMPOSER_BIN to a composer executable"
        )
    return binary


def normalize(binary: str, path: Path) -> Any:
    """``composer workflow normalize -f path``: the definition as the server
    stores it, as data; fails the test with its stderr when it is refused."""
    done = subprocess.run(
        [binary, "workflow", "normalize", "--file", str(path), "--output", "json"],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env={**os.environ, "COMPOSER_LOG": "error"},
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"composer workflow normalize -f {path} exited {done.returncode}: {done.stderr.strip()}")
    return json.loads(done.stdout)


class ExamplesTest(unittest.TestCase):
    def test_every_example_has_a_program(self) -> None:
        files = example_files()
        self.assertGreater(len(files), 10)
        missing = [p.name for p in files if not (PROGRAMS / f"{p.stem}.py").exists()]
        self.assertEqual(missing, [], "examples without a Python program in examples/workflows")
        extra = sorted({p.stem for p in PROGRAMS.glob("*.py")} - {p.stem for p in files})
        self.assertEqual(extra, [], "programs without an example")
        self.assertTrue(any(p.suffix in (".yaml", ".yml") for p in files), "no YAML example left to compare")

    def test_schedules_and_webhooks_are_not_workflows(self) -> None:
        for sub in NOT_WORKFLOWS:
            for path in sorted((EXAMPLES / sub).glob("*.json")):
                data = json.loads(path.read_text(encoding="utf-8"))
                self.assertNotIn("nodes", data, f"{path} is a workflow: it needs a program too")

    def test_each_program_builds_its_example_as_the_server_stores_it(self) -> None:
        binary = composer_binary()
        with tempfile.TemporaryDirectory(prefix="composer-examples-") as tmp:
            for path in example_files():
                with self.subTest(example=path.name):
                    got = program_of(path).definition()
                    written = Path(tmp) / f"{path.stem}.json"
                    written.write_text(json.dumps(got), encoding="utf-8")
                    self.assertEqual(normalize(binary, written), normalize(binary, path))

    def test_each_program_builds_its_json_example_as_data(self) -> None:
        for path in example_files():
            if path.suffix != ".json":
                continue
            with self.subTest(example=path.name):
                expected = json.loads(path.read_text(encoding="utf-8"))
                got = program_of(path).definition()
                # As data: key order does not matter, list order does.
                self.assertEqual(got, expected)
                # And it survives JSON.
                self.assertEqual(json.loads(json.dumps(got)), expected)


if __name__ == "__main__":
    unittest.main()
