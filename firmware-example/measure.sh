#!/usr/bin/env bash
# Measures the firmware: flash and RAM, the largest functions, the core's own footprint (the
# panic-never binary), size per crate (if cargo-bloat is installed), the stack high-water
# mark, and exact emulated instruction counts per operation at several history lengths.
# Prints each target as OK or MISS. Usage: ./measure.sh   (FEATURES=snapshot ./measure.sh)
set -euo pipefail
cd "$(dirname "$0")"

host=$(rustc -vV | sed -n 's/^host: //p')
tools="$(rustc --print sysroot)/lib/rustlib/$host/bin"
elf=target/thumbv7em-none-eabihf/release/firmware-example
features=${FEATURES:-}
feature_args=()
if [ -n "$features" ]; then feature_args=(--features "$features"); fi

cargo build -q --release "${feature_args[@]}"

echo "== sections ($elf${features:+, features: $features})"
"$tools/llvm-size" -A "$elf" | grep -E '^\.(vector_table|text|rodata|data|bss|uninit) '
read -r text data bss _ < <("$tools/llvm-size" "$elf" | tail -1)
flash=$((text + data))
ram=$((data + bss))
declared=$("$tools/llvm-nm" -C --print-size --radix=d "$elf" |
  awk '$4 ~ /^firmware_example::(MANAGER|PAYLOAD|RESTORED|SNAPSHOT)::/ {sum += $2} END {print sum + 0}')
"$tools/llvm-nm" -C --print-size --radix=d "$elf" |
  awk '$4 ~ /^firmware_example::(MANAGER|PAYLOAD|RESTORED|SNAPSHOT)::/ {printf "  static %-40s %6d B (%s)\n", $4, $2, $3 == "d" ? ".data: image in flash too" : ".bss"}'
echo "flash: $flash B = text $text (vectors + code + rodata) + data $data (initial image of .data)"
echo "RAM:   $ram B = data $data + bss $bss; declared buffers $declared B, overhead $((ram - declared)) B"

echo
echo "== largest functions (llvm-nm --size-sort, fat LTO: callees are inlined into callers)"
"$tools/llvm-nm" -C --print-size --size-sort --radix=d "$elf" | awk '$3 ~ /^[tT]$/' | tail -15 |
  awk '{size = $2; $1 = $2 = $3 = ""; sub(/^ +/, ""); sub(/::h[0-9a-f]{16}$/, ""); printf "%7d  %s\n", size, substr($0, 1, 110)}'

echo
echo "== the core alone: panic-never binary (every API the firmware uses, no logging)"
(cd nopanic && cargo build -q --release)
"$tools/llvm-size" nopanic/target/thumbv7em-none-eabihf/release/ctxwin-nopanic | tail -1 |
  awk '{printf "text %d, data %d, bss %d: flash %d B\n", $1, $2, $3, $1 + $2}'

if command -v cargo-bloat >/dev/null; then
  echo
  echo "== size per crate (cargo-bloat without LTO; generic core code counts for its user)"
  CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    cargo bloat -q --release --crates --target-dir target/nolto --bin firmware-example \
    "${feature_args[@]}" 2>/dev/null | sed -n '/Crate/,/section size/p'
fi

echo
echo "== stack (painted at boot, scanned at the end)"
run_log=$(cargo run -q --release --bin firmware-example "${feature_args[@]}" 2>&1)
grep -E 'stack high-water|ALL OK|FAILED' <<<"$run_log"
stack=$(sed -n 's/.*stack high-water: \([0-9]*\) bytes.*/\1/p' <<<"$run_log")

echo
echo "== instructions per operation (QEMU -icount, exact guest instruction counts)"
icount_out=$(./icount.py target/thumbv7em-none-eabihf/release/icount)
echo "$icount_out"
ratio=$(sed -n 's/^worst max\/min.*: \([0-9.]*\)$/\1/p' <<<"$icount_out")

verdict() { if [ "$1" = 1 ]; then echo OK; else echo MISS; fi; }
echo
echo "== targets"
echo "flash <= 24 KiB:               $flash B   $(verdict $((flash <= 24576)))"
echo "RAM <= buffers + 512 B:        $ram B = $declared + $((ram - declared))   $(verdict $((ram - declared <= 512)))"
echo "stack high-water <= 2 KiB:     ${stack:-?} B   $(verdict $((${stack:-99999} <= 2048)))"
echo "per-operation cost flat:       max/min $ratio once the rings are full (>= 100 messages)"
