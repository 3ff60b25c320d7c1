#!/usr/bin/env bash
# Installs the Debian 12 packages needed to build and test llm-server.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends \
  build-essential cmake ninja-build pkg-config git ca-certificates curl \
  libboost-dev libboost-system-dev nlohmann-json3-dev libopenblas-dev libspdlog-dev doctest-dev \
  libpcre2-dev libutf8proc-dev python3 python3-numpy
# The openai SDK test needs Node.js and npm; the machine images ship them, a
# bare Debian 12 gets Debian's.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  $SUDO apt-get install -y -q --no-install-recommends nodejs npm
fi
