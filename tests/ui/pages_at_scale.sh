#!/usr/bin/env bash
# How fast the UI's pages answer with many runs in the database.
#
#   tests/ui/pages_at_scale.sh [COMPOSER_BINARY] [RUNS]
#
# Makes a database of its own on PostgreSQL at $PGURL (default
# postgres://postgres@127.0.0.1:5432), starts `composer dev` on it and on
# Redis at $REDIS_URL (default redis://127.0.0.1:6379, keys under a prefix of
# its own), runs one 3-step workflow, copies that run RUNS times (default
# 1,000,000, made over the last 9 hours), vacuums as autovacuum would, and
# prints the median of 5 requests of each page. Drops its database at the end.
set -euo pipefail
bin=$(realpath "${1:-target/release/composer}")
runs=${2:-1000000}
pg=${PGURL:-postgres://postgres@127.0.0.1:5432}
redis=${REDIS_URL:-redis://127.0.0.1:6379}
db="composer_scale_$$"
prefix="scale$$:"
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
psql "$pg/postgres" -qc "CREATE DATABASE $db"
cleanup() {
  [[ -n "${dev:-}" ]] && kill "$dev" 2>/dev/null && wait "$dev" 2>/dev/null || true
  psql "$pg/postgres" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
  redis-cli -u "$redis" --scan --pattern "$prefix*" | xargs -r redis-cli -u "$redis" del >/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
COMPOSER_LOG=warn COMPOSER_ADDR_FILE="$work/addr" "$bin" dev --database-url "$pg/$db" --redis-url "$redis" \
  --redis-prefix "$prefix" --listen 127.0.0.1:0 >"$work/dev.log" 2>&1 &
dev=$!
for _ in $(seq 300); do [[ -s "$work/addr" ]] && break; sleep 0.1; done
url=$(cat "$work/addr"); [[ $url == http* ]] || url="http://$url"
export COMPOSER_URL=$url
cat >"$work/wf.json" <<'JSON'
{"name": "three", "tags": {"customer": "${ .input.customer }"}, "nodes": [
 {"id": "a", "type": "TRANSFORM", "config": {"output": 1}},
 {"id": "b", "type": "TRANSFORM", "config": {"output": 2}},
 {"id": "c", "type": "TRANSFORM", "config": {"output": 3}}],
 "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "c"}]}
JSON
"$bin" workflow apply --file "$work/wf.json" -o json >/dev/null
"$bin" run start three --input '{"customer": "1"}' --wait -o json >/dev/null 2>&1
# Over the last 9 hours, but not before this month began (its partition is
# the oldest a new database has).
month_ms=$(( ($(date -u +%s) - $(date -u -d "$(date -u +%Y-%m-01)" +%s) - 60) * 1000 ))
window_ms=$(( month_ms < 9 * 3600 * 1000 ? month_ms : 9 * 3600 * 1000 ))
span_ms=$(( window_ms / runs )); (( span_ms > 0 )) || span_ms=1
echo "making $runs runs …" >&2
psql "$pg/$db" -q -v ON_ERROR_STOP=1 -v runs="$runs" -v span_ms="$span_ms" -f "$here/runs_at_scale.sql" >/dev/null
psql "$pg/$db" -qc "VACUUM ANALYZE workflow_runs" -c "VACUUM ANALYZE task_instances"
run=$(psql "$pg/$db" -Atc "SELECT id FROM workflow_runs WHERE status = 'FAILED' ORDER BY id DESC OFFSET 100 LIMIT 1")
since=$(date -u -d '-5 hours' +%Y-%m-%dT%H:00); until=$(date -u -d '-4 hours' +%Y-%m-%dT%H:00)
for p in "/ui/overview" "/ui/runs" "/ui/runs?status=FAILED" "/ui/runs?workflow=three&status=CANCELLED" \
         "/ui/runs?tag=customer%3D42" "/ui/runs?since=$since&until=$until" "/ui/runs/$run" "/ui/queues" \
         "/v1/runs?tag.customer=42&status=FAILED" "/v1/runs/$run/explain"; do
  # The overview is made at most every 10 s: its first request after that is the one that counts.
  [[ $p == /ui/overview ]] && sleep 11
  ts=()
  for _ in 1 2 3 4 5; do
    [[ $p == /ui/overview ]] && sleep 10.5
    ts+=("$(curl -s -o /dev/null -w '%{http_code} %{time_total}' "$url$p" | awk '$1 != 200 { print "HTTP" $1; next } { printf "%.0f", $2 * 1000 }')")
  done
  printf '%6s ms  %s   (%s)\n' "$(printf '%s\n' "${ts[@]}" | sort -n | sed -n 3p)" "$p" "${ts[*]}"
done
