#!/usr/bin/env bash
# Container test: builds the image from the repository's Dockerfile with podman,
# serves the stories260K test model from it and checks /health, the image's
# HEALTHCHECK, the non-root user, one chat completion and a clean SIGTERM shutdown.
#
# There is no Docker engine or registry on the CI machines, so podman is set up
# by the recipe in ../shared/docs/containers.md (runc, explicit ulimits, a
# debian:bookworm base image made locally with debootstrap). Every step is
# skipped when already done, so the script is cheap to run again.
#
# Env: LLM_TEST_MODELS (default <repo>/../shared/models), LLM_CTR_DIR (podman
# config and image store, default /tmp/ctr), LLM_DOCKER_TIMEOUT (seconds to
# wait for /health, default 120).
# Last line: `docker: 1 passed, 0 failed` or `docker: 0 passed, 1 failed`.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
models=${LLM_TEST_MODELS:-$repo/../shared/models}
ctr=${LLM_CTR_DIR:-/tmp/ctr}
timeout=${LLM_DOCKER_TIMEOUT:-120}
image=localhost/llm-server:test
name=llm-server-test-$$  # unique: a concurrent run must not remove ours
tmp=$(mktemp -d)
passed=0

log() { echo "docker: $*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

# Runs on every exit: removes what this run created and reports failures in the
# summary format CI reads, whatever command failed under `set -e`.
cleanup() {
  local rc=$?
  podman rm --force --time 0 "$name" >/dev/null 2>&1 || true
  rm -rf "$tmp"
  if [ "$passed" != 1 ]; then
    [ "$rc" != 0 ] || rc=1
    echo "docker: 0 passed, 1 failed"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM  # run the EXIT trap on interruption too

model=$models/stories260K
[ -f "$model/config.json" ] ||
  fail "test model not found at $model (set LLM_TEST_MODELS or put ../shared/models beside the checkout)"

# ---- podman set-up (containers.md) ----
export DEBIAN_FRONTEND=noninteractive
if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v debootstrap >/dev/null; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  log "installing podman, runc, debootstrap"
  { $sudo apt-get update -q && $sudo apt-get install -y -q podman runc debootstrap; } >"$tmp/apt.log" 2>&1 ||
    { tail -n 20 "$tmp/apt.log" >&2; fail "could not install podman, runc, debootstrap"; }
fi

mkdir -p "$ctr"
# Root here cannot raise RLIMIT_NOFILE (podman's default ulimits would make the
# OCI runtime fail) and cgroups are hybrid (crun fails): runc and explicit
# ulimits. Rewritten each time; the content only depends on this machine.
cat >"$ctr/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=32768:32768"]
[engine]
runtime = "runc"
EOF
printf '[storage]\ndriver = "overlay"\ngraphroot = "%s/storage"\nrunroot = "%s/run"\n' \
  "$ctr" "$ctr" >"$ctr/storage.conf"
export CONTAINERS_CONF=$ctr/containers.conf CONTAINERS_STORAGE_CONF=$ctr/storage.conf

# No registry: FROM debian:bookworm(-slim) must resolve to a local image, built
# from the Debian mirror apt already uses.
if ! podman image exists localhost/debian:bookworm; then
  mirror=$(grep -rhoE 'https?://[^ ]*/debian/?$' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null | head -1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  log "making the debian:bookworm base image with debootstrap from $mirror"
  rootfs=$tmp/rootfs
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$ctr/debootstrap.log" 2>&1 ||
    { tail -n 20 "$ctr/debootstrap.log" >&2; fail "debootstrap failed (full log: $ctr/debootstrap.log)"; }
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" >"$rootfs/etc/apt/sources.list"
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --quiet --change 'CMD ["/bin/bash"]' - localhost/debian:bookworm >/dev/null
  rm -rf "$rootfs"
fi
for tag in docker.io/library/debian:bookworm docker.io/library/debian:bookworm-slim; do
  podman image exists "$tag" || podman tag localhost/debian:bookworm "$tag"
done

# ---- build ----
log "building $image"
start=$SECONDS
# Docker format: the OCI image format has no HEALTHCHECK. Host network: the
# build's apt-get needs the mirror, and the default build network may not reach it.
podman build --format docker --network=host -t "$image" -f "$repo/Dockerfile" "$repo" >"$ctr/build.log" 2>&1 ||
  { tail -n 40 "$ctr/build.log" >&2; fail "image build failed (full log: $ctr/build.log)"; }
log "image built in $((SECONDS - start)) s, $(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1 / 1e6}')"
# Each source change leaves an untagged compile layer (~20 MB) behind. Bound
# the store on long-lived machines: drop such leftovers older than a day;
# layers still in use (the install-deps one) and recent ones stay as cache.
podman image prune --force --filter until=24h >/dev/null 2>&1 || true

# ---- run ----
# --init as documented for users; 127.0.0.1:: lets podman pick a free host
# port, so parallel runs and busy ports don't collide.
# (podman's stderr is shown only on failure: without systemd, podman run, stop
# and rm log errors about the healthcheck timers they cannot manage.)
podman run -d --init --name "$name" -p 127.0.0.1::8080 -v "$model:/models/default:ro" "$image" \
  >/dev/null 2>"$tmp/run.err" || { cat "$tmp/run.err" >&2; fail "podman run failed"; }
port=$(podman port "$name" 8080/tcp | head -1)
port=${port##*:}
base=http://127.0.0.1:$port

logs() { log "container logs:"; podman logs "$name" 2>&1 | tail -n 50 | sed 's/^/  | /' >&2; }

deadline=$((SECONDS + timeout))
until [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$base/health")" = 200 ]; do
  if [ "$(podman inspect --format '{{.State.Running}}' "$name")" != true ]; then
    logs; fail "container exited before /health returned 200"
  fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    logs; fail "/health did not return 200 within ${timeout} s"
  fi
  sleep 0.5
done
log "/health 200 on $base"

# podman runs HEALTHCHECKs from systemd timers, absent here; run it by hand to
# check the image's own health command (bash /dev/tcp) works.
podman healthcheck run "$name" >/dev/null || { logs; fail "the image's HEALTHCHECK reports unhealthy"; }
[ "$(podman exec "$name" id -u)" != 0 ] || fail "the server runs as root"

body=$tmp/response.json
status=$(curl -sS -o "$body" -w '%{http_code}' --max-time 60 "$base/v1/chat/completions" \
  -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 16, "temperature": 0}') ||
  { logs; fail "chat completion request failed"; }
[ "$status" = 200 ] || { logs; fail "chat completion: HTTP $status: $(head -c 500 "$body")"; }
/usr/bin/python3 - "$body" <<'EOF' || fail "chat completion: unexpected response: $(head -c 500 "$body")"
import json, sys
r = json.load(open(sys.argv[1]))
content = r["choices"][0]["message"]["content"]
tokens = r["usage"]["completion_tokens"]
assert isinstance(content, str) and content, "empty content"
assert isinstance(tokens, int) and tokens > 0, "no completion tokens"
print(f"docker: chat completion: {tokens} tokens: {content!r}", file=sys.stderr)
EOF

# ---- shutdown ----
# The server handles SIGTERM and exits 0 at once when idle; podman stop would
# SIGKILL after 10 s (exit code 137) if the signal went unhandled.
start=$(date +%s%N)
podman stop --time 10 "$name" >/dev/null 2>"$tmp/stop.err" || { cat "$tmp/stop.err" >&2; fail "podman stop failed"; }
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
code=$(podman inspect --format '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { logs; fail "container exited with code $code after SIGTERM (expected 0)"; }
[ "$elapsed_ms" -lt 5000 ] || { logs; fail "container took ${elapsed_ms} ms to stop after SIGTERM"; }
log "stopped by SIGTERM in ${elapsed_ms} ms, exit code 0"
podman rm "$name" >/dev/null 2>&1

passed=1
echo "docker: 1 passed, 0 failed"
