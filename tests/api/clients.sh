#!/usr/bin/env bash
# What tools make of Composer's documents, against a live `composer dev`:
# the API document passes `redocly lint` with no error; openapi-python-client,
# openapi-generator's typescript-fetch and openapi-generator's python each
# generate a client, and a script per client (tests/api/generated/flow*)
# registers a workflow, starts a run with input and checks it arrived, waits,
# lists, sends an event and cancels, with nothing but the generated calls; and
# the definition JSON Schema judges the examples and a corpus as the server
# does (tests/api/definitions.py). The tools are pinned
# (tests/api/generated/requirements.txt, package-lock.json) and installed
# once into a cache keyed by those files (COMPOSER_CI_CACHE).
# Usage: tests/api/clients.sh COMPOSER_BINARY
set -euo pipefail
bin=$(realpath "$1")
here=$(cd "$(dirname "$0")/generated" && pwd)
cache=${COMPOSER_CI_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/composer-ci}
key() { sha256sum "$@" | sha256sum | cut -c1-16; }

venv="$cache/venv-$(key "$here/requirements.txt")"
if [ ! -x "$venv/.done" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r "$here/requirements.txt"
  printf '#!/bin/sh\n' >"$venv/.done" && chmod +x "$venv/.done"
fi
npm_dir="$cache/npm-$(key "$here/package.json" "$here/package-lock.json")"
if [ ! -e "$npm_dir/.done" ]; then
  rm -rf "$npm_dir" && mkdir -p "$npm_dir"
  cp "$here/package.json" "$here/package-lock.json" "$npm_dir/"
  (cd "$npm_dir" && npm ci --no-audit --no-fund --loglevel=error)
  touch "$npm_dir/.done"
fi

work=$(mktemp -d)
chmod 755 "$work"  # run as root, the embedded PostgreSQL runs as postgres
trap 'kill "$dev" 2>/dev/null; wait "$dev" 2>/dev/null; rm -rf "$work"' EXIT
(cd "$work" && exec env -u COMPOSER_API_TOKEN COMPOSER_LISTEN=127.0.0.1:0 COMPOSER_ADDR_FILE="$work/addr" \
  COMPOSER_LOG=error COMPOSER_DATA_DIR="$work/data" "$bin" dev >"$work/dev.log" 2>&1) &
dev=$!
for _ in $(seq 1 300); do [ -s "$work/addr" ] && break; sleep 0.2; done
url=$(cat "$work/addr")
curl -fsS "$url/openapi.json" -o "$work/openapi.json"

step() { local name=$1; shift; local t0=$SECONDS; "$@"; echo "clients: $name ok ($((SECONDS - t0)) s)"; }

# Redocly's recommended rules, warnings allowed, errors not.
step "redocly lint" "$npm_dir/node_modules/.bin/redocly" lint "$work/openapi.json" --format=summary

gen_python() {
  "$venv/bin/openapi-python-client" generate --path "$work/openapi.json" --output-path "$work/py" \
    --config "$here/openapi-python-client.yaml" >"$work/gen-py.log" 2>&1
  # A warning means an operation or a model was left out.
  if grep -qi "warning" "$work/gen-py.log"; then cat "$work/gen-py.log" >&2; return 1; fi
  PYTHONPATH="$work/py" "$venv/bin/python" "$here/flow.py" "$url"
}
step "openapi-python-client" gen_python

gen_typescript() {
  "$venv/bin/openapi-generator-cli" generate -i "$work/openapi.json" -g typescript-fetch -o "$work/ts/gen" \
    --additional-properties=importFileExtension=.js >"$work/gen-ts.log" 2>&1 || { cat "$work/gen-ts.log" >&2; return 1; }
  cp "$here/flow.ts" "$here/tsconfig.json" "$work/ts/"
  echo '{"type": "module"}' >"$work/ts/package.json"
  ln -s "$npm_dir/node_modules" "$work/ts/node_modules"
  (cd "$work/ts" && node_modules/.bin/tsc -p tsconfig.json && node build/flow.js "$url")
}
step "openapi-generator typescript-fetch" gen_typescript

gen_generator_python() {
  "$venv/bin/openapi-generator-cli" generate -i "$work/openapi.json" -g python -o "$work/og" \
    --additional-properties=packageName=composer_og >"$work/gen-og.log" 2>&1 || { cat "$work/gen-og.log" >&2; return 1; }
  PYTHONPATH="$work/og" "$venv/bin/python" "$here/flow_generator.py" "$url"
}
step "openapi-generator python" gen_generator_python

step "definition schema" "$venv/bin/python" "$(dirname "$0")/definitions.py" "$bin" "$url"
