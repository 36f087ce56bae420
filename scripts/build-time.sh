#!/usr/bin/env bash
# Fresh-build time of README's first command (or the test command) in a new, empty target
# directory, as a newcomer on a fresh clone meets it. Prints the machine (cores, load), wall
# time, CPU time (user + system: what the build costs whatever else runs), cargo's sum of unit
# times, an estimate of the wall time on idle cores (each unit's own CPU time, scheduled as
# cargo unblocked them), the costliest units, then deletes the target directory. On a shared
# machine the wall time measures the neighbours too: read the CPU and idle figures.
#
#   scripts/build-time.sh          # README's first command (the build, then the command)
#   scripts/build-time.sh test     # README's test command, built only (--no-run)
#   scripts/build-time.sh wheel    # the Python wheel's Rust build, as `pip install ./python`
#                                  # runs it (maturin: the `wheel` profile, the crate's default
#                                  # features, abi3, no libpython linked)
#
# Crates already in ~/.cargo/registry are not downloaded again (a fresh machine downloads
# about 10 MB for the first command); BUILD_TIME_TARGET picks the directory [mktemp -d],
# BUILD_TIME_KEEP=1 keeps it.
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-first}
# README's commands, read from README.md so that this measures what it says.
first=$(sed -n '/^## Quick start/,/^## /{/^cargo run /{p;q;}}' README.md)
test_cmd=$(sed -n '/^Run the test suite/,/^## /{/^cargo test /{p;q;}}' README.md)
case "$what" in
  first)
    [ -n "$first" ] || { echo "no cargo run command under README's Quick start" >&2; exit 2; }
    # The same build cargo run does, with --timings; then the command itself (built by now).
    build=${first%% -- *}
    build="${build/cargo run/cargo build --timings}"
    ;;
  test)
    [ -n "$test_cmd" ] || { echo "no cargo test command in README" >&2; exit 2; }
    build="$test_cmd --no-run --timings"
    ;;
  wheel)
    # What maturin runs for `pip install ./python` (`cargo rustc --profile wheel --lib`),
    # with the environment it sets for an extension module.
    export PYO3_BUILD_EXTENSION_MODULE=1
    build="cargo build -p ctxwin-python --lib --profile wheel --timings"
    ;;
  *) echo "usage: $0 [first|test|wheel]" >&2; exit 2 ;;
esac

target=${BUILD_TIME_TARGET:-$(mktemp -d /tmp/ctxwin-build-time.XXXXXX)}
[ -n "${BUILD_TIME_KEEP:-}" ] || trap 'rm -rf "$target"' EXIT
mkdir -p "$target"
export CARGO_TARGET_DIR=$target

# Each rustc's own CPU time (user + system, its threads included), by package and crate.
export BUILD_TIME_CPU_LOG=$target/rustc-cpu.log
cat >"$target/rustc-cpu.sh" <<'WRAPPER'
#!/usr/bin/env bash
"$@"
rc=$?
crate=-
for ((i = 1; i < $#; i++)); do
  if [ "${!i}" = --crate-name ]; then j=$((i + 1)); crate=${!j}; fi
done
# `times` in this shell (not in a command substitution's subshell): rustc's user and system.
times >"$BUILD_TIME_CPU_LOG.$$"
echo "${CARGO_PKG_NAME:--} ${CARGO_PKG_VERSION:--} $crate $(tail -1 "$BUILD_TIME_CPU_LOG.$$")" >>"$BUILD_TIME_CPU_LOG"
rm -f "$BUILD_TIME_CPU_LOG.$$"
exit $rc
WRAPPER
chmod +x "$target/rustc-cpu.sh"
export RUSTC_WRAPPER=$target/rustc-cpu.sh

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) before"
echo "build:   $build   (fresh CARGO_TARGET_DIR=$target)"
times_before=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
start=$(date +%s.%N)
bash -c "$build" 2> >(grep -v '^ *Compiling\|^ *Timing report' >&2)
built=$(date +%s.%N)
if [ "$what" = first ]; then
  echo "run:     $first"
  bash -c "$first" >/dev/null
fi
end=$(date +%s.%N)
# Waited-for children's user + system time in clock ticks (cargo, rustc, cc, linkers).
times_after=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
echo "machine: load average $(cut -d' ' -f1-3 /proc/loadavg) after"

python3 "$(dirname "$0")/build-time.py" "$target/cargo-timings/cargo-timing.html" \
  "$BUILD_TIME_CPU_LOG" "$start" "$built" "$end" \
  "$(awk -v t="$((times_after - times_before))" -v hz="$(getconf CLK_TCK)" 'BEGIN { print t / hz }')" \
  "$(nproc)"
