#!/usr/bin/env bash
# Runs the README's "Trying it by hand" blocks as written: the block after
# `<!-- by-hand: server -->` in the background, the one after
# `<!-- by-hand: client -->` once the server answers, then stops the server.
# Twice: on the default port (when 8080 is free) and on another, where the
# README says to set COMPOSER_LISTEN for the server and COMPOSER_URL for the
# client. Each pass keeps its data in a temp dir of its own (COMPOSER_DATA_DIR).
# The last line is `tests: N passed, M failed`.
set -uo pipefail
cd "$(dirname "$0")/../.."

# block NAME: the shell lines of the fenced block after the marker NAME.
block() {
  awk -v marker="<!-- by-hand: $1 -->" '
    $0 == marker { found = 1; next }
    found && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' README.md
}
# As written, except that the release build the README reuses (scripts/demo
# made it) is the debug build the suite's `cargo test` made, and its build
# line is left out: a release build here would add minutes to every run of
# the suite for the same source, and so would a debug build of the binary
# alone (without the tests' dev-dependencies, tokio's features differ and
# the whole graph builds again).
debug() { sed -e '/^cargo build --release /d' -e 's|target/release|target/debug|g'; }
server=$(block server | debug)
client=$(block client | debug)
if [ -z "$server" ] || [ -z "$client" ]; then
  echo "README.md has no by-hand server or client block"
  echo "tests: 0 passed, 1 failed"
  exit 1
fi

free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

passed=0
failed=0
# pass NAME PORT SERVER_ENV...: one run of both blocks.
pass() {
  local name=$1 port=$2 data dev url log status
  shift 2
  data=$(mktemp -d)
  chmod 711 "$data"
  log="$data/server.log"
  url="http://127.0.0.1:$port"
  # The server block in a process group of its own, so that stopping it
  # stops `composer dev` too.
  setsid env COMPOSER_DATA_DIR="$data/.composer" "$@" bash -euo pipefail -c "$server" >"$log" 2>&1 &
  dev=$!
  local ready=""
  for _ in $(seq 1 1200); do
    if curl -fsS "$url/healthz" >/dev/null 2>&1; then ready=1; break; fi
    kill -0 "$dev" 2>/dev/null || break
    sleep 0.25
  done
  if [ -z "$ready" ]; then
    echo "FAILED $name: the server block did not answer on $url"; tail -20 "$log"
    status=1
  else
    # The client block, with COMPOSER_URL set only where the README says to.
    if [ "$port" = 8080 ]; then
      env -u COMPOSER_URL bash -euo pipefail -c "$client"
    else
      COMPOSER_URL=$url bash -euo pipefail -c "$client"
    fi
    status=$?
    [ "$status" = 0 ] && echo "ok $name" || echo "FAILED $name: the client block exited $status"
  fi
  kill -TERM -- "-$dev" 2>/dev/null
  wait "$dev" 2>/dev/null
  rm -rf "$data"
  if [ "$status" = 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

if free 8080; then
  pass "default port 8080" 8080 env -u COMPOSER_LISTEN
else
  echo "port 8080 is in use here: the default-port pass cannot run"
fi
other=18480
while ! free "$other"; do other=$((other + 1)); done
pass "port $other (COMPOSER_LISTEN, COMPOSER_URL)" "$other" env COMPOSER_LISTEN="127.0.0.1:$other"
echo "tests: $passed passed, $failed failed"
[ "$failed" = 0 ]
