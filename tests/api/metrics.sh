#!/usr/bin/env bash
# The metrics as Prometheus scrapes them from a live `composer dev`, whose
# coordinator and worker share one process: each listener (the API's and the
# worker's --worker-listen) answers text/plain; version=0.0.4; charset=utf-8
# that `promtool check metrics` passes, serves its own role's metrics only
# (so scraping both counts nothing twice), and exports a labelled counter
# from zero for each value it knows, never as a bare `name 0`.
# Usage: tests/api/metrics.sh COMPOSER_BINARY
set -euo pipefail
bin=$(realpath "$1")
work=$(mktemp -d)
chmod 755 "$work"  # run as root, the embedded PostgreSQL runs as postgres
trap 'kill "$dev" 2>/dev/null; wait "$dev" 2>/dev/null; rm -rf "$work"' EXIT
worker_addr=127.0.0.1:$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$work" && exec env -u COMPOSER_API_TOKEN COMPOSER_LISTEN=127.0.0.1:0 COMPOSER_ADDR_FILE="$work/addr" \
  COMPOSER_WORKER_LISTEN="$worker_addr" COMPOSER_LOG=error COMPOSER_DATA_DIR="$work/data" \
  "$bin" dev >"$work/dev.log" 2>&1) &
dev=$!
for _ in $(seq 1 300); do [ -s "$work/addr" ] && break; sleep 0.2; done
url=$(cat "$work/addr")

fail() { echo "metrics: $*" >&2; exit 1; }
# One run through the worker (an HTTP step against the coordinator itself),
# so that both roles have counted something.
"$bin" workflow --url "$url" apply -f - >/dev/null <<JSON
{"name": "scraped", "nodes": [{"id": "ping", "type": "HTTP", "config": {"url": "$url/healthz"}}]}
JSON
"$bin" run --url "$url" start scraped --input '{}' --wait --timeout 60s >/dev/null

for role in coordinator worker; do
  case $role in coordinator) from=$url/metrics ;; worker) from=http://$worker_addr/metrics ;; esac
  curl -fsS -D "$work/$role.headers" "$from" -o "$work/$role.txt"
  grep -qi '^content-type: text/plain; version=0.0.4; charset=utf-8' "$work/$role.headers" \
    || fail "$role: $(grep -i '^content-type' "$work/$role.headers")"
  promtool check metrics <"$work/$role.txt" || fail "$role: promtool check metrics"
  grep -q "role=\"$role\"} 1" "$work/$role.txt" || fail "$role: no composer_build_info of its role"
  # A counter with labels is never shown without them.
  awk '/^# TYPE .* counter$/ { counter[$3] = 1 } /^[a-z_]+\{/ { split($0, a, "{"); labelled[a[1]] = 1 }
       /^[a-z_]+ / { bare[$1] = 1 } END { for (m in bare) if (m in counter && m in labelled) { print m; bad = 1 } exit bad }' \
    "$work/$role.txt" || fail "$role: a labelled counter is also written without labels"
done
grep -q '^composer_schedule_fires_total{outcome="started"} 0$' "$work/coordinator.txt" \
  || fail "coordinator: a labelled counter does not start at zero"
grep -q '^composer_tasks_executed_total{node_type="HTTP"} 1$' "$work/worker.txt" \
  || fail "worker: the run's HTTP step is not counted once"
if grep -q '^composer_runs_started_total' "$work/worker.txt"; then fail "worker: serves the coordinator's metrics"; fi
if grep -q '^composer_tasks_executed_total' "$work/coordinator.txt"; then fail "coordinator: serves the worker's metrics"; fi
echo "metrics: both roles' texts pass promtool, each its own, labelled counters from zero"
