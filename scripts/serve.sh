#!/usr/bin/env bash
# One command from a fresh Debian 12 checkout to a running server:
#   scripts/serve.sh [llm-server flags...]
# installs the build dependencies (first run only), builds llm-server (Release,
# build-release/), picks a model and serves it on http://127.0.0.1:8080
# (OpenAI base URL http://127.0.0.1:8080/v1). Extra arguments go to llm-server,
# e.g. --api-key KEY, --parallel 2, --ctx 2048.
#
# Model: $LLM_MODEL if set (model directory or .gguf file); else
# models/qwen2.5-0.5b-instruct, downloaded on first use (about 1 GB, see
# scripts/download-model.sh); without network, the tiny ../shared/models/stories260K
# test model if present. Env: LLM_HOST (default 127.0.0.1), LLM_PORT (8080).
set -euo pipefail
# A relative LLM_MODEL means the caller's directory, not the repository's.
if [ -n "${LLM_MODEL:-}" ] && [[ $LLM_MODEL != /* ]]; then LLM_MODEL=$PWD/$LLM_MODEL; fi
cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { echo "serve: $*" >&2; }
die() { echo "serve: error: $*" >&2; exit 1; }

build=build-release  # not build/, which scripts/test.sh configures with tests on

# A configured build directory (build.ninja is written only when configuring
# succeeded) means the dependencies are there: later runs skip apt and sudo.
if [ ! -f "$build/build.ninja" ]; then
  say "installing build dependencies (Debian 12 packages)"
  bash scripts/install-deps.sh
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLM_BUILD_TESTS=OFF
fi
# Incremental: a no-op when nothing changed.
cmake --build "$build" --target llm-server llm-chat

default_model=models/qwen2.5-0.5b-instruct
fallback_model=../shared/models/stories260K
if [ -n "${LLM_MODEL:-}" ]; then
  [ -e "$LLM_MODEL" ] || die "LLM_MODEL=$LLM_MODEL does not exist"
  model=$LLM_MODEL
  why="from LLM_MODEL"
elif [ -d "$default_model" ]; then
  model=$default_model
  why="the default model, already downloaded"
else
  say "downloading the default model Qwen/Qwen2.5-0.5B-Instruct into $default_model"
  if bash scripts/download-model.sh Qwen/Qwen2.5-0.5B-Instruct "$default_model"; then
    model=$default_model
    why="the default model, just downloaded"
  elif [ -d "$fallback_model" ]; then
    model=$fallback_model
    why="FALLBACK because the download failed: a tiny test model that only writes children's stories; set LLM_MODEL or fix the download (network, HF_ENDPOINT, HF_TOKEN) for a real model"
  else
    die "no model: the download failed and $fallback_model does not exist; set LLM_MODEL to a model directory or .gguf file"
  fi
fi

host=${LLM_HOST:-127.0.0.1}
port=${LLM_PORT:-8080}
say "serving $model ($why)"
if [ "$port" != 0 ]; then  # 0: the server picks one and logs it
  say "on http://$host:$port (OpenAI base URL http://$host:$port/v1); Ctrl-C stops it"
fi
exec "$build/server/llm-server" --model "$model" --host "$host" --port "$port" "$@"
