"""The starter project of `composer init --lang python`
(crates/composer/templates/python/): copied to a temporary directory, its
own tests pass offline (simulate, with COMPOSER_BIN), its workflow is
mypy --strict clean, and its files are those the README names."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

from composer_client import Client, InvalidRequest, NotFound

from .support import PACKAGE_ROOT, REPO_ROOT, DevServer

TEMPLATE = os.path.join(REPO_ROOT, "crates", "composer", "templates", "python")
FILES = ["README.md", "pyproject.toml", "test_workflow.py", "workflow.py"]


class TemplateTest(unittest.TestCase):
    def setUp(self) -> None:
        self.binary = os.path.abspath(
            os.environ.get("COMPOSER_BIN", os.path.join(REPO_ROOT, "target", "debug", "composer"))
        )
        tmp = tempfile.mkdtemp(prefix="composer-template-")
        self.addCleanup(shutil.rmtree, tmp, True)
        self.project = os.path.join(tmp, "my-workflows")
        shutil.copytree(TEMPLATE, self.project)
        # composer_client from this checkout, as `pip install ./clients/python` would give it.
        self.env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT, COMPOSER_BIN=self.binary, PYTHONDONTWRITEBYTECODE="1")

    def run_in_project(self, *args: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(
            [sys.executable, *args],
            cwd=self.project,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def test_its_files(self) -> None:
        self.assertEqual(sorted(os.listdir(TEMPLATE)), FILES)
        with open(os.path.join(TEMPLATE, "pyproject.toml"), encoding="utf-8") as f:
            pyproject = f.read()
        self.assertIn('"composer-client"', pyproject)
        self.assertIn("pip install ./clients/python", pyproject)

    def test_its_tests_pass_offline(self) -> None:
        if not os.access(self.binary, os.X_OK):
            self.skipTest(f"no composer binary at {self.binary}: set COMPOSER_BIN")
        done = self.run_in_project("-m", "unittest", "-v", "test_workflow")
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("Ran 4 tests", done.stderr)

    def test_its_tests_fail_when_a_step_is_wrong(self) -> None:
        if not os.access(self.binary, os.X_OK):
            self.skipTest(f"no composer binary at {self.binary}: set COMPOSER_BIN")
        path = os.path.join(self.project, "workflow.py")
        with open(path, encoding="utf-8") as f:
            source = f.read()
        with open(path, "w", encoding="utf-8") as f:
            f.write(source.replace("greeting.text.upper()", "greeting.text.lower()"))
        done = self.run_in_project("-m", "unittest", "test_workflow")
        self.assertNotEqual(done.returncode, 0, done.stderr)
        self.assertIn("HELLO, ADA!", done.stderr)

    def test_its_worker_registers_and_runs_the_workflow_on_composer_dev(self) -> None:
        """`python3 workflow.py` as the README says, against a real server:
        it registers `greet` and runs its typed steps; a start its input
        type refuses is a 400 naming the field."""
        dev = DevServer().start()
        self.addCleanup(dev.stop)
        env = dict(self.env, COMPOSER_URL=dev.url)
        worker = subprocess.Popen(
            [sys.executable, "workflow.py"], cwd=self.project, env=env, stderr=subprocess.PIPE, text=True
        )

        def stop_worker() -> None:
            worker.terminate()
            worker.communicate(timeout=30)

        self.addCleanup(stop_worker)
        client = Client(dev.url, timeout=30)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.get_workflow("greet")
                break
            except NotFound:
                self.assertIsNone(worker.poll(), "the worker stopped before registering")
                self.assertLess(time.monotonic(), deadline, "the worker did not register greet")
                time.sleep(0.2)
        run = client.start_run("greet", input={"name": "Ada"})
        done = client.wait(run["id"], timeout=60)
        self.assertEqual(done["status"], "SUCCEEDED", done)
        self.assertEqual(done["output"], {"for": "Ada", "said": "Hello, Ada!", "shouted": "HELLO, ADA!"})
        with self.assertRaises(InvalidRequest) as refused:
            client.start_run("greet", input={"name": "Ada", "language": "de"})
        self.assertIn("/language", str(refused.exception))

    def test_it_type_checks(self) -> None:
        try:
            import mypy  # noqa: F401
        except ImportError:
            self.skipTest("mypy is not installed")
        done = self.run_in_project(
            "-m", "mypy", "--no-incremental", "--cache-dir", os.path.join(self.project, ".cache")
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)

    def test_it_defines_the_workflow(self) -> None:
        code = "import json, workflow; print(json.dumps(workflow.wf.definition()))"
        done = self.run_in_project("-c", code)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertIn('"name": "greet"', done.stdout)
        self.assertIn('"input_schema"', done.stdout)


if __name__ == "__main__":
    unittest.main()
