#!/usr/bin/env bash
# llm-chat against a real llm-server: --once from a pipe, line mode with /reset, the API key, and
# clear failures (HTTP errors, server down, https).
# usage: test_llm_chat.sh LLM_SERVER_BIN LLM_CHAT_BIN   (models: $LLM_TEST_MODELS, default <repo>/../shared/models)
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 LLM_SERVER_BIN LLM_CHAT_BIN" >&2
  exit 2
fi
server_bin="$(realpath "$1")"
chat_bin="$(realpath "$2")"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
model="${LLM_TEST_MODELS:-$repo/../shared/models}/stories260K"
work="$(mktemp -d)"
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  for f in out err; do [ -s "$work/$f" ] && sed "s/^/  llm-chat $f: /" "$work/$f" >&2; done
  sed 's/^/  server: /' "$work/server.log" >&2 2>/dev/null || true
  exit 1
}
pass() { echo "ok: $*"; }

# Runs llm-chat with $input (plus a newline) on stdin; stdout/stderr land in $work/out and $work/err;
# sets $status.
chat() {
  status=0
  "$chat_bin" "$@" <<< "$input" > "$work/out" 2> "$work/err" || status=$?
}

# GET /health without curl: bash's /dev/tcp. Prints the status code, or nothing if unreachable.
health_status() {
  local host_port="${url#http://}" line
  exec 3<>"/dev/tcp/${host_port%:*}/${host_port##*:}" 2>/dev/null || return 0
  printf 'GET /health HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' "$host_port" >&3
  read -r line <&3 || true
  exec 3<&-
  echo "$line" | cut -d' ' -f2
}

[ -d "$model" ] || fail "test model not found at $model (set LLM_TEST_MODELS)"
# The server gets a key, so that llm-chat's --api-key and $LLM_API_KEY are exercised too.
env -u LLM_API_KEY "$server_bin" --model "$model" --host 127.0.0.1 --port 0 --threads 1 --api-key test-key \
  2> "$work/server.log" &
server_pid=$!
url=
for _ in $(seq 300); do
  url="$(grep -o 'listening on http://[^ ]*' "$work/server.log" | head -n 1 | cut -d' ' -f3 || true)"
  [ -n "$url" ] && break
  kill -0 "$server_pid" 2>/dev/null || fail "llm-server exited before listening"
  sleep 0.1
done
[ -n "$url" ] || fail "no 'listening on' line from llm-server within 30 s"
for _ in $(seq 600); do
  [ "$(health_status)" = 200 ] && break
  sleep 0.1
done
[ "$(health_status)" = 200 ] || fail "/health at $url did not turn 200 within 60 s"
pass "llm-server listening on $url"

input='Once upon a time'
LLM_API_KEY=test-key chat --once --temp 0 --max-tokens 16 --url "$url"
[ "$status" = 0 ] || fail "--once exited $status"
grep -q '[^[:space:]]' "$work/out" || fail "--once printed no reply"
once_reply="$(cat "$work/out")"
pass "--once streams a reply with the key from \$LLM_API_KEY: $once_reply"

LLM_API_KEY= chat --once --temp 0 --max-tokens 16 --url "$url" --api-key test-key
[ "$status" = 0 ] && [ "$(cat "$work/out")" = "$once_reply" ] || fail "--api-key: status $status, other reply"
pass "--api-key works; greedy replies repeat"

# Line mode (stdin not a terminal): one message per line; /reset forgets the first exchange, so the
# third line is answered exactly as the first.
input=$'Once upon a time\n/reset\nOnce upon a time'
LLM_API_KEY=test-key chat --temp 0 --max-tokens 16 --url "$url/v1"
[ "$status" = 0 ] || fail "line mode exited $status"
[ "$(cat "$work/out")" = "$(printf '%s\n%s' "$once_reply" "$once_reply")" ] || fail "line mode with /reset"
pass "line mode answers each line; /reset clears the history; a /v1 base URL works"

input=hi
LLM_API_KEY= chat --once --url "$url"
[ "$status" = 1 ] && grep -q 'HTTP 401' "$work/err" && grep -q 'LLM_API_KEY' "$work/err" ||
  fail "without a key: want status 1 and an HTTP 401 message with a hint"
pass "no key: $(head -n 1 "$work/err")"

LLM_API_KEY=test-key chat --once --model no-such-model --url "$url"
[ "$status" = 1 ] && grep -q 'HTTP 404.*model_not_found' "$work/err" || fail "unknown model: want a 404 message"
pass "unknown model: $(head -n 1 "$work/err")"

kill -TERM "$server_pid"
server_status=0
wait "$server_pid" || server_status=$?
server_pid=
[ "$server_status" = 0 ] || fail "llm-server exited $server_status on SIGTERM"
pass "llm-server exits 0 on SIGTERM"

LLM_API_KEY=test-key chat --once --url "$url"
[ "$status" != 0 ] && grep -q 'cannot connect' "$work/err" && grep -q 'is llm-server running' "$work/err" ||
  fail "server down: want a non-zero status and a connect error with a hint (status $status)"
pass "server down: $(head -n 1 "$work/err")"

chat --once --url https://127.0.0.1:1
[ "$status" = 2 ] && grep -q 'https:// is not supported' "$work/err" || fail "https:// URL: want status 2"
pass "https:// is refused clearly"
echo "all llm-chat checks passed"
