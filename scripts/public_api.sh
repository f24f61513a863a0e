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
record() { # package, file, extra arguments
  local package=$1 file=$2
  shift 2
  local fresh
  fresh=$(mktemp)
  cargo +nightly public-api --package "$package" --simplified "$@" >"$fresh"
  if [ "$check" = --check ]; then
    if ! diff -u "$out/$file" "$fresh"; then
      echo "[public_api.sh] $package's public API is not the one in $out/$file" >&2
      status=1
    fi
    rm -f -- "$fresh"
  else
    mv -- "$fresh" "$out/$file"
  fi
}
record dedup-worker dedup-worker.txt --features testing
record idempotency-key idempotency-key.txt
exit "$status"
