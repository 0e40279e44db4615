"""The definition JSON Schema against the server. `composer workflow schema`
is the repository's copy (docs/workflow.schema.json); every example in
examples/ validates against it and is accepted by a live coordinator, every
YAML example names it in its `# yaml-language-server: $schema=` line; and
the schema and the server judge each definition of definitions/corpus.json
alike, except those breaking a rule the schema cannot say (its `cross_field`),
which the schema accepts and the server refuses.

Usage: python3 definitions.py COMPOSER_BINARY URL
"""

import json
import pathlib
import subprocess
import sys
import urllib.error
import urllib.request

import yaml
from jsonschema import Draft202012Validator

root = pathlib.Path(__file__).resolve().parents[2]
binary, url = sys.argv[1], sys.argv[2]
failures = []
checked = 0


def check(ok, what):
    global checked
    checked += 1
    if not ok:
        failures.append(what)


def server_accepts(definition):
    req = urllib.request.Request(
        f"{url}/v1/workflows",
        data=json.dumps(definition).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status in (200, 201), ""
    except urllib.error.HTTPError as e:
        body = e.read().decode()
        if e.code != 400:
            raise AssertionError(f"{e.code} for {definition}: {body}") from e
        return False, json.loads(body)["error"]["message"]


schema = json.loads(subprocess.run([binary, "workflow", "schema"], check=True, capture_output=True).stdout)
copy = root / "docs" / "workflow.schema.json"
check(json.loads(copy.read_text()) == schema, f"{copy} is not `composer workflow schema`")
Draft202012Validator.check_schema(schema)
validator = Draft202012Validator(schema)


def schema_errors(definition):
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(definition)]


examples = sorted(p for p in (root / "examples").iterdir() if p.suffix in (".json", ".yaml", ".yml"))
for path in examples:
    text = path.read_text()
    if path.suffix == ".json":
        definition = json.loads(text)
    else:
        definition = yaml.safe_load(text)
        first = text.splitlines()[0]
        prefix = "# yaml-language-server: $schema="
        named = (path.parent / first.removeprefix(prefix)).resolve() if first.startswith(prefix) else None
        check(named == copy, f"{path.name}: its first line names no schema, or not {copy}: {first!r}")
    errors = schema_errors(definition)
    check(not errors, f"{path.name}: the schema refuses it: {errors}")
    accepted, message = server_accepts(definition)
    check(accepted, f"{path.name}: the server refuses it: {message}")

corpus = json.loads((pathlib.Path(__file__).parent / "definitions" / "corpus.json").read_text())
for case in corpus["cases"]:
    errors = schema_errors(case["definition"])
    accepted, message = server_accepts(case["definition"])
    why = case["why"]
    if "cross_field" in case:
        rule = case["cross_field"]
        check(rule in schema["description"], f"{why}: the schema's description does not list {rule!r}")
        check(not errors, f"{why}: the schema refuses what it cannot know: {errors}")
        check(not accepted, f"{why}: the server accepts it")
    else:
        check((not errors) == case["valid"], f"{why}: the schema says {'no' if errors else 'yes'}: {errors}")
        check(accepted == case["valid"], f"{why}: the server says {'yes' if accepted else 'no'}: {message}")

for f in failures:
    print(f"FAIL {f}", file=sys.stderr)
print(f"definitions: {len(examples)} examples, {len(corpus['cases'])} corpus cases; "
      f"{checked - len(failures)} checks passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
