#!/usr/bin/env bash
# Configures, builds and runs every test suite (ctest over the doctest suites and
# the command-line checks). Test data: ../shared/models beside the checkout, or
# $LLM_TEST_MODELS. Set LLM_SANITIZE=1 for an ASan+UBSan build in build-asan/.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
flags=(-DCMAKE_BUILD_TYPE=Release)
if [ "${LLM_SANITIZE:-0}" = 1 ]; then
  build=build-asan
  flags=(-DCMAKE_BUILD_TYPE=Debug -DLLM_SANITIZE=ON)
fi
models="${LLM_TEST_MODELS:-$(pwd)/../shared/models}"
if [ ! -d "$models/stories260K" ]; then
  echo "error: test models not found at $models (expected ../shared/models beside the checkout, or set LLM_TEST_MODELS)" >&2
  exit 1
fi
cmake -S . -B "$build" -G Ninja "${flags[@]}" -DLLM_TEST_MODELS_DIR="$models"
cmake --build "$build" -j "$(nproc)"
ctest --test-dir "$build" --output-on-failure -j "$(nproc)"
