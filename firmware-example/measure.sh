#!/usr/bin/env bash
# Measures the three firmware binaries against the footprint targets (issue 16):
#   minimal           static manager, push + compose + write_openai, sliding window,
#                     no snapshot, no defmt                             flash <= 24 KiB
#   snapshot          minimal + snapshot save and restore               flash <= 36 KiB
#   firmware-example  the full example (defmt, outbox, summaries, snapshot) flash <= 48 KiB
# and for every binary worst-case stack <= 2 KiB, from three sources, the largest counting:
# stack painting in QEMU, static analysis of the release ELF (frames from prologues, call
# graph from the disassembly: stack.py) and, where a nightly toolchain with the thumbv7em
# target exists, static analysis of a `-Z emit-stack-sizes` build. Also: the message header
# (<= 32 B), the core alone (the panic-never binary), size per crate (if cargo-bloat is
# installed) and exact emulated instruction counts per operation (flat: max/min <= 1.1;
# ICOUNT=0 skips them, ~90 s).
# Flash = .vector_table + .text + .rodata + .data (its initial image); static RAM = .data + .bss.
# Prints each number against its target as OK or MISS; exits 1 if any target is missed, 2 if a
# binary fails its run.
set -euo pipefail
cd "$(dirname "$0")"

host=$(rustc -vV | sed -n 's/^host: //p')
tools="$(rustc --print sysroot)/lib/rustlib/$host/bin"
out=target/thumbv7em-none-eabihf/release
bins=(minimal snapshot firmware-example)
declare -A flash_target=([minimal]=24576 [snapshot]=36864 [firmware-example]=49152)
stack_target=2048
header_target=32
ratio_target=1.1

cargo build -q --release --bins

declare -A flash ram painted static_stable static_nightly
section() { awk -v s="$2" '$1 == s {print $2} END {}' <<<"$1" | head -1; }
for bin in "${bins[@]}"; do
  sections=$("$tools/llvm-size" -A "$out/$bin")
  v=$(section "$sections" .vector_table); t=$(section "$sections" .text)
  r=$(section "$sections" .rodata); d=$(section "$sections" .data); b=$(section "$sections" .bss)
  flash[$bin]=$((v + t + r + ${d:-0}))
  ram[$bin]=$((${d:-0} + b))
  echo "== $bin: flash ${flash[$bin]} B = vectors $v + code $t + rodata $r + data ${d:-0}; static RAM ${ram[$bin]} B = data ${d:-0} + bss $b"
done

echo
echo "== largest functions of each binary (llvm-nm --size-sort, fat LTO: callees inlined)"
for bin in "${bins[@]}"; do
  echo "-- $bin"
  "$tools/llvm-nm" -C --print-size --size-sort --radix=d "$out/$bin" | awk '$3 ~ /^[tT]$/' | tail -8 |
    awk '{size = $2; $1 = $2 = $3 = ""; sub(/^ +/, ""); sub(/::h[0-9a-f]{16}$/, ""); printf "%7d  %s\n", size, substr($0, 1, 110)}'
done

echo
echo "== runs in QEMU (stack painted at boot, scanned at the end)"
header=""
for bin in "${bins[@]}"; do
  if ! log=$(cargo run -q --release --bin "$bin" 2>&1); then
    echo "$log" | tail -20
    echo "$bin: non-zero exit"
    exit 2
  fi
  grep -q 'ALL OK' <<<"$log" || { echo "$log" | tail -20; echo "$bin: no ALL OK"; exit 2; }
  painted[$bin]=$(sed -n 's/.*stack high-water: \([0-9]*\) bytes.*/\1/p' <<<"$log" | tail -1)
  h=$(sed -n 's/.*message header: \([0-9]*\) B.*/\1/p' <<<"$log" | head -1)
  header=${header:-$h}
  echo "-- $bin: $(grep -E 'stack high-water|sizes:|ALL OK' <<<"$log" | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
done

echo
echo "== static stack analysis (stack.py: frames + call graph, worst path from reset)"
for bin in "${bins[@]}"; do
  echo "-- $bin, release ELF (frames from prologues)"
  report=$(./stack.py --top 4 "$out/$bin") || true
  echo "$report" | sed 's/^/   /'
  static_stable[$bin]=$(sed -n 's/^worst-case stack: \([0-9]*\) B$/\1/p' <<<"$report")
done
if cargo +nightly --version >/dev/null 2>&1 &&
  rustup target list --toolchain nightly --installed 2>/dev/null | grep -qx thumbv7em-none-eabihf; then
  RUSTFLAGS="-Z emit-stack-sizes" CARGO_TARGET_DIR=target/stack-sizes \
    cargo +nightly build -q --release --bins
  for bin in "${bins[@]}"; do
    echo "-- $bin, nightly build with -Z emit-stack-sizes"
    report=$(./stack.py --top 4 "target/stack-sizes/thumbv7em-none-eabihf/release/$bin") || true
    echo "$report" | sed 's/^/   /'
    static_nightly[$bin]=$(sed -n 's/^worst-case stack: \([0-9]*\) B$/\1/p' <<<"$report")
  done
else
  echo "   no nightly toolchain with thumbv7em-none-eabihf: -Z emit-stack-sizes skipped"
fi

echo
echo "== the core alone: panic-never binary (every API the firmware uses, no logging)"
(cd nopanic && cargo build -q --release)
"$tools/llvm-size" nopanic/target/thumbv7em-none-eabihf/release/ctxwin-nopanic | tail -1 |
  awk '{printf "text %d, data %d, bss %d: flash %d B\n", $1, $2, $3, $1 + $2}'

if command -v cargo-bloat >/dev/null; then
  echo
  echo "== size per crate of minimal (cargo-bloat without LTO; generic core code counts for its user)"
  CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
    cargo bloat -q --release --crates --target-dir target/nolto --bin minimal 2>/dev/null |
    sed -n '/Crate/,/section size/p'
fi

ratio=""
if [ "${ICOUNT:-1}" != 0 ]; then
  echo
  echo "== instructions per operation (QEMU -icount, exact guest instruction counts)"
  icount_out=$(./icount.py "$out/icount")
  echo "$icount_out"
  ratio=$(sed -n 's/^worst max\/min.*: \([0-9.]*\)$/\1/p' <<<"$icount_out")
fi

missed=0
# Sets `v` to OK or MISS (and `missed` on a miss); not in a subshell, so `missed` sticks.
verdict() {
  if [ "$1" = 1 ]; then v=OK; else
    v=MISS
    missed=1
  fi
}
echo
echo "== targets (thumbv7em-none-eabihf, release profile)"
for bin in "${bins[@]}"; do
  # The largest of the measurements; one that failed (unknown bound) counts as a miss.
  worst=${painted[$bin]:-99999}
  sources=("${static_stable[$bin]:-}")
  if [ -n "${static_nightly[$bin]+set}" ]; then sources+=("${static_nightly[$bin]}"); fi
  for s in "${sources[@]}"; do
    if [ -z "$s" ]; then worst=99999; elif [ "$s" -gt "$worst" ]; then worst=$s; fi
  done
  verdict $((flash[$bin] <= flash_target[$bin]))
  printf '%-17s flash %6d B <= %6d   %s\n' "$bin" "${flash[$bin]}" "${flash_target[$bin]}" "$v"
  verdict $((worst <= stack_target))
  printf '%-17s stack %6d B <= %6d   %s   (painted %s, static %s, emit-stack-sizes %s); static RAM %d B\n' \
    "$bin" "$worst" "$stack_target" "$v" "${painted[$bin]:-?}" \
    "${static_stable[$bin]:-?}" "${static_nightly[$bin]:-n/a}" "${ram[$bin]}"
done
verdict $((${header:-99999} <= header_target))
printf '%-17s       %6s B <= %6d   %s\n' "message header" "${header:-?}" "$header_target" "$v"
if [ -n "$ratio" ]; then
  verdict "$(awk -v r="$ratio" -v t="$ratio_target" 'BEGIN {print (r <= t) ? 1 : 0}')"
  printf '%-17s max/min %s <= %s   %s\n' "instructions flat" "$ratio" "$ratio_target" "$v"
fi
if [ "$missed" = 0 ]; then echo "all targets met"; else echo "some targets missed"; fi
exit "$missed"
