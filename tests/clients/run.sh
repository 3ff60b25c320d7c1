#!/usr/bin/env bash
# Runs test_openai_sdk.mjs (node:test) against a real llm-server with the official OpenAI Node SDK.
# usage: run.sh LLM_SERVER_BIN     (models: $LLM_TEST_MODELS, default <repo>/../shared/models)
# The SDK is installed into tests/clients/node_modules from package-lock.json on first use.
# Exit status: the test result; 77 (ctest SKIP_RETURN_CODE) when Node.js is not installed.
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 LLM_SERVER_BIN" >&2
  exit 2
fi
server_bin="$(realpath "$1")"
cd "$(dirname "$0")"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "skipped: node and npm are needed (Node.js >= 20)" >&2
  exit 77
fi
# Reinstall when the lock changed since the last install (npm keeps a copy in node_modules).
if [ ! -d node_modules/openai ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  if [ -f package-lock.json ]; then
    npm ci --no-audit --no-fund >&2
  else
    npm install --no-audit --no-fund >&2
  fi
fi
LLM_SERVER_BIN="$server_bin" exec node --test test_openai_sdk.mjs
