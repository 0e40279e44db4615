#!/usr/bin/env bash
# Fuzzes the REST API against its OpenAPI document with schemathesis: every
# phase (examples, coverage, fuzzing, stateful), every check (settings in
# schemathesis.toml beside this script). A schema-valid
# request must be accepted, a schema-violating one refused, and nothing may
# answer 5xx. The schemas say what the server checks wherever JSON Schema
# can; the few rules it cannot (an edge names a node, a cron is a grammar, an
# error goes with `failed`, a key used before is state) are exceptions in
# schemathesis.toml, each with its reason and narrowed to the status it
# answers; every other check still applies.
# Task-API polls wait at most 50 ms here (COMPOSER_TASK_POLL_MAX_WAIT), so
# the many polls the fuzzer sends do not each wait a minute for a task.
# Usage: tests/api/fuzz.sh COMPOSER_BINARY
set -euo pipefail
bin=$(realpath "$1")
work=$(mktemp -d)
chmod 755 "$work"  # run as root, the embedded PostgreSQL runs as postgres
trap 'kill "$dev" 2>/dev/null; wait "$dev" 2>/dev/null; rm -rf "$work"' EXIT
# `exec`: $! is then composer itself, whose SIGTERM stops its embedded services.
(cd "$work" && exec env -u COMPOSER_API_TOKEN COMPOSER_LISTEN=127.0.0.1:0 COMPOSER_ADDR_FILE="$work/addr" \
  COMPOSER_LOG=error COMPOSER_TASK_POLL_MAX_WAIT=50ms "$bin" dev >"$work/dev.log" 2>&1) &
dev=$!
for _ in $(seq 1 300); do [ -s "$work/addr" ] && break; sleep 0.2; done
url=$(cat "$work/addr")
# The document's examples name the workflow `example`: registered here, the
# examples phase starts real runs of it (the other phases mostly get 404s).
"$bin" workflow --url "$url" apply -f - >/dev/null <<'JSON'
{"name": "example", "nodes": [{"id": "greet", "type": "TRANSFORM",
  "config": {"output": {"greeting": "hello ${ .input.name }"}}}]}
JSON
schemathesis --config-file "$(dirname "$0")/schemathesis.toml" run "$url/openapi.json" --no-color
echo "api: schemathesis found nothing"
