#!/usr/bin/env bash
# Cargo runner: boots an ELF on QEMU's mps2-an386 (Cortex-M4F) and prints its output: defmt
# frames decoded by defmt-print, or plain semihosting text as is for an ELF without a
# `.defmt` section (the `minimal` and `snapshot` binaries).
# The firmware's semihosting exit code becomes this script's exit code; a hung firmware is
# killed after QEMU_TIMEOUT seconds (exit 124).
set -euo pipefail
elf="$1"
shift
qemu() {
  timeout "${QEMU_TIMEOUT:-30}" qemu-system-arm -cpu cortex-m4 -machine mps2-an386 -nographic \
    -semihosting-config enable=on,target=native "$@" -kernel "$elf"
}
host=$(rustc -vV | sed -n 's/^host: //p')
readobj="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-readobj"
# (grep without -q: an early exit would fail the pipe under pipefail)
if [ -x "$readobj" ] && ! "$readobj" --sections "$elf" | grep 'Name: \.defmt ' >/dev/null; then
  qemu "$@"
else
  qemu "$@" | defmt-print -e "$elf" --log-format '{L} {s}'
fi
