# llm-server container image.
#
#   docker build -t llm-server .
#   docker run --init -p 8080:8080 -v /path/to/model:/models/default:ro llm-server
#
# /models/default is a Hugging Face model directory (config.json, *.safetensors,
# tokenizer files) or a single .gguf file; the server tells them apart itself.
# Flags given after the image name are appended to the server's command line,
# e.g. `... llm-server --model-alias qwen2.5-0.5b-instruct --parallel 2`.
# See docker/README.md.

# ---- build stage: full toolchain and -dev packages, thrown away afterwards ----
FROM debian:bookworm AS build

# The same script users and CI run, so the image cannot drift from the
# documented build environment. Copied on its own so that this slow layer stays
# cached across source changes.
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN bash /tmp/install-deps.sh && apt-get clean && rm -rf /var/lib/apt/lists/*

WORKDIR /src
# .dockerignore keeps build trees, models, tests and docs out of the context.
COPY . .
# Tests are off: their data (../shared/models) is not part of the image.
# Only the server target is built; `install -s` strips the symbol table.
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLM_BUILD_TESTS=OFF \
 && cmake --build build --target llm-server \
 && install -D -m 0755 -s build/server/llm-server /out/llm-server

# ---- runtime stage: shared libraries only ----
FROM debian:bookworm-slim

# Runtime counterparts of the -dev packages the binary links against
# (libstdc++6 and libgcc-s1 are already in the base image). libopenblas0-pthread
# is the variant libopenblas-dev builds against by default on Debian 12. Boost
# (Beast, Asio, System) is header-only here: no runtime package. apt-get clean:
# the downloaded .debs and package caches would otherwise add ~80 MB on bases
# without Docker's apt clean-up hook (e.g. one made with debootstrap).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libopenblas0-pthread libspdlog1.10 libfmt9 libpcre2-8-0 libutf8proc2 \
 && apt-get clean && rm -rf /var/lib/apt/lists/*

# Health probe, a command of its own so that HEALTHCHECK, compose files and
# Kubernetes exec probes can all name it without shell quoting: exit 0 iff
# GET /health answers 200, i.e. the model is loaded (503 while loading). bash's
# /dev/tcp speaks enough HTTP for this, so the image needs no curl (16 more
# packages, 12 MB, OpenSSL and Kerberos included, for one status line).
RUN printf '%s\n' \
      '#!/bin/bash' \
      '# Usage: llm-healthcheck [PORT]. Exit 0 iff GET /health answers 200.' \
      'exec 3<>"/dev/tcp/127.0.0.1/${1:-8080}" || exit 1' \
      'printf "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n" >&3' \
      'read -r -t 4 status <&3 && [[ $status == "HTTP/1."[01]" 200 "* ]]' \
      >/usr/local/bin/llm-healthcheck \
 && chmod 0755 /usr/local/bin/llm-healthcheck

# A fixed numeric uid lets orchestrators verify runAsNonRoot without /etc/passwd
# lookups. The server only reads the model, so it owns nothing in the image;
# mounted models just need to be world-readable (the usual 0644/0755).
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin llm

# Last, so that a new binary rebuilds only these two layers.
COPY --from=build /out/llm-server /usr/local/bin/llm-server
# Fail the build, not the first `docker run`, if the package list above
# misses a library the binary needs.
RUN if ldd /usr/local/bin/llm-server | grep 'not found'; then exit 1; fi

USER 10001:10001
EXPOSE 8080
# start-period covers loading large checkpoints; failures during it don't count.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 CMD ["llm-healthcheck"]

# Exec form: the server is the container's main process and receives SIGTERM
# directly; it drains running requests (--shutdown-timeout-seconds, default 10)
# and exits 0. Run with --init (compose: init: true) so a tiny init reaps and
# forwards signals. The port is fixed inside the container (the health probe
# relies on it); remap it with -p. The API key comes from LLM_API_KEY, which the
# server reads itself, so it stays out of the process list.
ENTRYPOINT ["llm-server", "--model", "/models/default", "--host", "0.0.0.0", "--port", "8080"]
CMD []
