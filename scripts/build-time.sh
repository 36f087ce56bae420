#!/usr/bin/env bash
# Fresh-build time of README's first command (or the test command) in a new, empty target
# directory, as a newcomer on a fresh clone meets it. Prints the machine (cores, load), wall
# time, CPU time (user + system: what the build costs whatever else runs), cargo's sum of unit
# times and its slowest units, then deletes the target directory.
#
#   scripts/build-time.sh          # README's first command (the build, then the command)
#   scripts/build-time.sh test     # README's test command, built only (--no-run)
#
# Crates already in ~/.cargo/registry are not downloaded again (a fresh machine downloads
# about 10 MB for the first command); BUILD_TIME_TARGET picks the directory [mktemp -d].
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
  *) echo "usage: $0 [first|test]" >&2; exit 2 ;;
esac

target=${BUILD_TIME_TARGET:-$(mktemp -d /tmp/ctxwin-build-time.XXXXXX)}
trap 'rm -rf "$target"' EXIT
export CARGO_TARGET_DIR=$target

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
# Children's user + system time in clock ticks (cargo, rustc, cc, linkers).
times_after=$(awk '{print $14+$15+$16+$17}' /proc/$$/stat)
ticks=$(getconf CLK_TCK)

python3 - "$target/cargo-timings/cargo-timing.html" "$start" "$built" "$end" \
  "$(( times_after - times_before ))" "$ticks" <<'EOF'
import json, re, sys
html, start, built, end, cpu_ticks, tck = sys.argv[1:]
start, built, end = float(start), float(built), float(end)
units = json.loads(re.search(r'const UNIT_DATA = (\[.*?\]);\n', open(html).read(), re.S).group(1))
total = sum(u["duration"] for u in units)
print(f"wall:    {built - start:.1f} s build, {end - start:.1f} s with the command")
print(f"cpu:     {int(cpu_ticks) / int(tck):.1f} s user + system")
print(f"units:   {len(units)} compiled, {total:.1f} s summed (cargo --timings)")
for u in sorted(units, key=lambda u: -u["duration"])[:12]:
    kind = (" " + u["target"].strip()) if u.get("target", "").strip() else ""
    print(f"  {u['duration']:6.1f} s  {u['name']} {u['version']}{kind}")
EOF
echo "machine: load average $(cut -d' ' -f1-3 /proc/loadavg) after"
