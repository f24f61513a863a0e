#!/usr/bin/env bash
# The public API of the two products, as `cargo public-api` lists it (rustdoc's JSON, so on the
# nightly toolchain), recorded in docs/public-api/: `dedup-worker.txt` (with the `testing`
# feature, the kit a handler crate's tests use) and `idempotency-key.txt`.
#
#   scripts/public_api.sh          writes both files again; `git diff docs/public-api` then
#                                  shows what a change added to or took from the surface
#   scripts/public_api.sh --check  fails, with the diff, if the surface is not the recorded one
#
# Installs cargo-public-api if it is missing. Not part of scripts/test.sh: the nightly rustdoc
# build of every dependency costs CI minutes; run it when a change touches `pub`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-public-api >/dev/null; then
  echo "[public_api.sh] installing cargo-public-api" >&2
  cargo install cargo-public-api --locked
fi

out=docs/public-api
mkdir -p "$out"
check=${1:-}
status=0
# The surface of one package: cargo-public-api's list.
surface() { # package, extra arguments
  local package=$1
  shift
  cargo +nightly public-api --package "$package" --simplified "$@"
}
# dedup-worker is a facade: it re-exports the engine's prelude, `Service`, the SQL macros and the
# test kit from crates/dedup-worker-core, and cargo-public-api does not follow a re-export into
# another crate. So its file is the facade's list, then the engine's items at exactly those paths
# (the rest of the engine is internal, not promised, and not recorded).
surface_of_dedup_worker() {
  surface dedup-worker --features testing
  echo "// behind those re-exports: dedup-worker-core's items at the paths re-exported"
  surface dedup-worker-core --features testing | python3 -c "$items_at_reexported_paths"
}
# Keeps the lines whose item (an impl's subject, else the first path) is at a re-exported path:
# `pub async fn dedup_worker_core::cli::run(dedup_worker_core::Service)` is not the kit's.
items_at_reexported_paths='
import re, sys
wanted = re.compile(r"dedup_worker_core::(prelude|testing|Service|execute|with_connection)\b")
for line in sys.stdin:
    if line.startswith("impl"):
        subject = line.split(" for ")[-1] if " for " in line else line.split(" ", 1)[-1]
    else:
        subject = line[line.find("dedup_worker_core::"):] if "dedup_worker_core::" in line else ""
    subject = re.split(r"[(< !]|(?<!:):(?!:)", subject.strip(), maxsplit=1)[0]
    if wanted.match(subject):
        sys.stdout.write(line)
'

record() { # file, the command that lists the surface, its arguments
  local file=$1
  shift
  local fresh
  fresh=$(mktemp)
  "$@" >"$fresh"
  if [ "$check" = --check ]; then
    if ! diff -u "$out/$file" "$fresh"; then
      echo "[public_api.sh] the public API is not the one in $out/$file" >&2
      status=1
    fi
    rm -f -- "$fresh"
  else
    mv -- "$fresh" "$out/$file"
  fi
}
record dedup-worker.txt surface_of_dedup_worker
record idempotency-key.txt surface idempotency-key
exit "$status"
