#!/usr/bin/env bash
# Cargo runner: boots an ELF on QEMU's mps2-an386 (Cortex-M4F) and decodes its defmt output.
# The firmware's semihosting exit code becomes this script's exit code; a hung firmware is
# killed after QEMU_TIMEOUT seconds (exit 124).
set -euo pipefail
elf="$1"
shift
timeout "${QEMU_TIMEOUT:-30}" qemu-system-arm -cpu cortex-m4 -machine mps2-an386 -nographic \
  -semihosting-config enable=on,target=native "$@" -kernel "$elf" \
  | defmt-print -e "$elf" --log-format '{L} {s}'
