#!/usr/bin/env bash
# Coverage-guided fuzzing of the parsers and verifiers that take hostile input (fuzz/, cargo-fuzz).
#
#   scripts/fuzz.sh [SECONDS]      # SECONDS per target; default $FUZZ_SECONDS, else 20
#
# Builds every target of fuzz/ once, then runs each for SECONDS on a fresh temporary corpus, with
# the committed seeds (fuzz/seeds/<target>/) as a second, read-only corpus (libFuzzer only
# writes new inputs to the first one). Exits non-zero if any target crashes (panic, failed
# assertion, stack overflow, timeout, out of memory), after printing the artifact path and the
# command that reproduces it. Works from any directory.
#
# Environment:
#   FUZZ_SECONDS      seconds per target when no argument is given (20)
#   FUZZ_TOOLCHAIN    rustup toolchain to build with (default: nightly if installed, else stable,
#                     which works because no sanitizer is used, see FUZZ_BUILD_FLAGS)
#   FUZZ_BUILD_FLAGS  cargo-fuzz build flags. Default "-s none --dev": the fastest build (about
#                     half the time of an optimised one, a quarter of the default AddressSanitizer
#                     one) that still fuzzes with coverage; its executions per second are a few
#                     times lower, so for a long campaign use "-s none -O" (or "-s address" on
#                     nightly; the code is safe Rust, where ASan adds little)
#   FUZZ_TIMEOUT      seconds one input may take before it counts as a crash (10)
#   FUZZ_TARGETS      space-separated subset of targets (default: all of `cargo fuzz list`)
set -euo pipefail

ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
FUZZ_DIR="$ROOT/fuzz"
cd "$ROOT"

log() { printf '[fuzz.sh] %s\n' "$*" >&2; }

duration=${1:-${FUZZ_SECONDS:-20}}
if ! [[ $duration =~ ^[0-9]+$ ]] || ((duration < 1)); then
  log "usage: scripts/fuzz.sh [SECONDS]   (SECONDS: a positive integer, got '$duration')"
  exit 2
fi
timeout_secs=${FUZZ_TIMEOUT:-10}
read -r -a build_flags <<<"${FUZZ_BUILD_FLAGS:--s none --dev}"

# --- toolchain and cargo-fuzz -----------------------------------------------------------------
if [[ -n ${FUZZ_TOOLCHAIN:-} ]]; then
  toolchain=$FUZZ_TOOLCHAIN
elif rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  toolchain=nightly
else
  # cargo-fuzz needs nightly only for sanitizers (-Zsanitizer); the coverage instrumentation
  # it adds without one (-s none) consists of stable -C flags.
  toolchain=stable
  log "no nightly toolchain installed: building with stable (works with -s none only)"
fi
cargo=(cargo "+$toolchain")
if ! "${cargo[@]}" fuzz --version >/dev/null 2>&1; then
  log "installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

# --- build --------------------------------------------------------------------------------------
log "building all fuzz targets: ${cargo[*]} fuzz build ${build_flags[*]}"
build_start=$SECONDS
"${cargo[@]}" fuzz build --fuzz-dir "$FUZZ_DIR" "${build_flags[@]}"
log "build took $((SECONDS - build_start)) s"

if [[ -n ${FUZZ_TARGETS:-} ]]; then
  read -r -a targets <<<"$FUZZ_TARGETS"
else
  mapfile -t targets < <("${cargo[@]}" fuzz list --fuzz-dir "$FUZZ_DIR")
fi
((${#targets[@]} > 0)) || { log "no fuzz targets found in $FUZZ_DIR"; exit 1; }

# --- run ------------------------------------------------------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dedup-fuzz.XXXXXX")
trap 'rm -rf -- "$tmp"' EXIT
trap 'exit 130' INT TERM

summary=()
failed=()
for target in "${targets[@]}"; do
  seeds="$FUZZ_DIR/seeds/$target"
  corpus="$tmp/corpus/$target"
  mkdir -p "$corpus" # cargo-fuzz writes crash artifacts to fuzz/artifacts/<target>/
  corpora=("$corpus")
  [[ -d $seeds ]] && corpora+=("$seeds")
  out="$tmp/$target.log"
  log "fuzzing $target for ${duration} s"
  status=0
  "${cargo[@]}" fuzz run --fuzz-dir "$FUZZ_DIR" "${build_flags[@]}" "$target" "${corpora[@]}" -- \
    -max_total_time="$duration" -timeout="$timeout_secs" -print_final_stats=1 >"$out" 2>&1 || status=$?

  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$out" | tail -n1)
  added=$(sed -n 's/^stat::new_units_added: *//p' "$out" | tail -n1)
  cov=$(grep -o 'cov: [0-9]*' "$out" | tail -n1 | cut -d' ' -f2 || true)
  line=$(printf '%-20s %10s execs %8s exec/s  cov %6s  new units %5s' \
    "$target" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${added:-?}")

  if ((status == 0)); then
    summary+=("$line  ok")
    continue
  fi
  failed+=("$target")
  summary+=("$line  FAILED (exit $status)")
  # The failure itself (panic message, sanitizer report or libFuzzer's timeout/OOM report), not
  # cargo-fuzz's long footer after it.
  first=$(grep -n -m1 -E 'panicked at|overflowed its stack|==fuzz== SIGSEGV|==[0-9]+== *ERROR|ERROR: libFuzzer' "$out" |
    cut -d: -f1 || true)
  if [[ -n $first ]]; then
    log "$target FAILED (exit $status):"
    sed -n "${first},$((first + 40))p" "$out" >&2
  else
    log "$target FAILED (exit $status); last lines of its output:"
    tail -n 60 "$out" >&2
  fi
  artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$out" | tail -n1)
  if [[ -n $artifact ]]; then
    log "artifact: $artifact ($(wc -c <"$artifact") bytes)"
    log "reproduce: (cd $ROOT && ${cargo[*]} fuzz run ${build_flags[*]} $target $artifact)"
    log "minimise:  (cd $ROOT && ${cargo[*]} fuzz tmin ${build_flags[*]} $target $artifact)"
  else
    log "no artifact was written: the run itself failed, see the output above"
  fi
done

log "summary (${duration} s per target, ${cargo[*]} fuzz ${build_flags[*]}):"
printf '  %s\n' "${summary[@]}" >&2
if ((${#failed[@]} > 0)); then
  log "crashes in: ${failed[*]}"
  exit 1
fi
log "no crash in ${#targets[@]} targets"
