#!/usr/bin/env bash
# Downloads the files llm-server needs from a Hugging Face model repository:
#   scripts/download-model.sh [REPO_ID] [DEST]
# REPO_ID defaults to Qwen/Qwen2.5-0.5B-Instruct, DEST to models/qwen2.5-0.5b-instruct
# (relative to the repository root).
#
# Env: HF_TOKEN (sent as a Bearer token: gated or private repositories),
#      HF_ENDPOINT (mirror base URL, default https://huggingface.co).
#
# Files land in DEST.partial/ and the directory is renamed to DEST only when
# complete, so DEST is never half there. Running the script again resumes an
# interrupted download. Needs curl and python3.
set -euo pipefail

usage() {
  sed -n '2,4s/^# \{0,1\}//p' "$0" >&2
  exit "$1"
}
case "${1:-}" in -h | --help) usage 0 ;; esac
[ $# -le 2 ] || usage 2

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repo_id=${1:-Qwen/Qwen2.5-0.5B-Instruct}
dest=${2:-$repo_root/models/qwen2.5-0.5b-instruct}
endpoint=${HF_ENDPOINT:-https://huggingface.co}
endpoint=${endpoint%/}

die() { echo "download-model: error: $*" >&2; exit 1; }
say() { echo "download-model: $*" >&2; }

[[ $repo_id =~ ^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$ ]] ||
  die "'$repo_id' is not a Hugging Face repository id like Qwen/Qwen2.5-0.5B-Instruct"
if [ -e "$dest" ]; then
  say "$dest already exists; delete it to download again"
  exit 0
fi
command -v curl >/dev/null || die "curl is not installed"

part=$dest.partial
mkdir -p "$part"
# Resume only the same repository's files: mixing two models would load badly.
if [ -f "$part/.repo" ] && [ "$(cat "$part/.repo")" != "$repo_id" ]; then
  die "$part holds a partial download of $(cat "$part/.repo"); delete it first"
fi
echo "$repo_id" >"$part/.repo"
errors=$(mktemp)
# No staging directory left behind without downloaded files in it.
trap 'rm -f "$errors"; [ -n "$(ls -A "$part" 2>/dev/null | grep -vx .repo)" ] || rm -rf "$part"' EXIT

curl_args=(--location --fail --silent --show-error --connect-timeout 10
  # Abort a stalled transfer (rerun to resume) rather than hang forever.
  --speed-limit 1024 --speed-time 60)
# Passed via a config on stdin, so the token stays out of the process list.
# curl sends it to the endpoint only, not to the CDN that weights redirect to.
auth_config=""
[ -z "${HF_TOKEN:-}" ] || auth_config="header = \"Authorization: Bearer $HF_TOKEN\""

# fetch FILE [optional]: downloads FILE into $part unless already complete.
# Returns 1 for a missing optional file; any other failure is fatal.
fetch() {
  local file=$1 optional=${2:-} url=$endpoint/$repo_id/resolve/main/$1 code rc=0
  local progress=() stderr=$errors
  [ ! -f "$part/$file" ] || return 0
  # curl's messages are kept aside: HTTP errors get a clearer one below, and an
  # optional file's 404 is no error. Weights are large, though: on a terminal,
  # let curl draw a progress bar there.
  : >"$errors"
  if [[ $file == *.safetensors && -t 2 ]]; then
    progress=(--progress-bar) stderr=/dev/stderr
    say "$file"
  fi
  # Written under a temporary name: a file under its final name is complete;
  # -C - continues an interrupted one.
  code=$(curl "${curl_args[@]}" "${progress[@]}" "${retry[@]}" --config - -C - \
    -o "$part/$file.incomplete" -w '%{http_code}' "$url" <<<"$auth_config" 2>"$stderr") || rc=$?
  if [ "$rc" = 0 ]; then
    mv "$part/$file.incomplete" "$part/$file"
    return 0
  fi
  case $code in
    404)
      rm -f "$part/$file.incomplete"
      [ -z "$optional" ] || return 1
      die "$repo_id has no $file ($url)" ;;
    401 | 403) die "access to $repo_id denied (HTTP $code): a gated or private repository needs HF_TOKEN (and accepting its licence on the website)" ;;
    416) # Nothing left past the resume offset (or the file changed): start over.
      rm -f "$part/$file.incomplete"
      fetch "$@"
      return ;;
    000) cat "$errors" >&2
      die "cannot reach $endpoint (curl exit $rc): no network, a proxy needed (https_proxy), or set HF_ENDPOINT to a mirror" ;;
    *) cat "$errors" >&2
      die "downloading $url failed (HTTP $code, curl exit $rc); run again to resume" ;;
  esac
}

say "downloading $repo_id from $endpoint into $dest"
# The first request runs without retries so that a machine without network
# fails within the connect timeout; the rest retry transient errors.
retry=()
fetch config.json
retry=(--retry 3)
fetch tokenizer.json
fetch tokenizer_config.json
fetch generation_config.json optional || say "no generation_config.json (optional)"

# Weights: one file, or an index naming the shards.
if fetch model.safetensors.index.json optional; then
  shards=$(/usr/bin/python3 -c '
import json, re, sys
names = sorted(set(json.load(open(sys.argv[1]))["weight_map"].values()))
# The names become paths: accept plain file names only.
bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9._-]+\.safetensors", n) or n.startswith(".")]
if bad or not names:
    sys.exit(f"unexpected shard names in the index: {bad or names}")
print("\n".join(names))' "$part/model.safetensors.index.json") || die "bad model.safetensors.index.json"
  for shard in $shards; do fetch "$shard"; done
else
  fetch model.safetensors
fi

rm "$part/.repo"
mv -T "$part" "$dest"
say "done: $dest ($(du -sh "$dest" | cut -f1))"
