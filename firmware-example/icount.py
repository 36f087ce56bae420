#!/usr/bin/env python3
"""Exact emulated instruction counts per operation, from QEMU's execution trace.

Runs the `icount` firmware under `qemu -icount ... -singlestep -d exec,nochain` (one trace
line per executed guest instruction), streams the trace through a FIFO (it is ~2 GB), counts
the lines from each entry of `ctxwin_bench_start` to the next entry of `ctxwin_bench_end`,
and pairs the counts, in order, with the `REGION <op> <messages>` lines the firmware logs
through defmt after each region.

usage: icount.py ELF [--max-ratio R]
Prints one row per operation, one column per history length, and max/min per row. With
--max-ratio, exits 1 if any row's max/min over the full-ring checkpoints (>= 100 messages)
exceeds R.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import threading


def llvm_tool(name):
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True,
                             check=True).stdout.strip()
    host = re.search(r"host: (\S+)", subprocess.run(["rustc", "-vV"], capture_output=True,
                                                    text=True, check=True).stdout).group(1)
    return os.path.join(sysroot, "lib", "rustlib", host, "bin", name)


def marker_addresses(elf):
    out = subprocess.run([llvm_tool("llvm-nm"), elf], capture_output=True, text=True,
                         check=True).stdout
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] in ("ctxwin_bench_start", "ctxwin_bench_end"):
            found[parts[2]] = int(parts[0], 16) & ~1  # Thumb bit
    if len(found) != 2:
        sys.exit(f"icount.py: marker symbols missing in {elf}: {found}")
    return found["ctxwin_bench_start"], found["ctxwin_bench_end"]


def run(elf, timeout):
    start, end = marker_addresses(elf)
    with tempfile.TemporaryDirectory() as tmp:
        fifo = os.path.join(tmp, "exec.fifo")
        os.mkfifo(fifo)
        qemu = subprocess.Popen(
            ["timeout", str(timeout), "qemu-system-arm", "-cpu", "cortex-m4", "-machine",
             "mps2-an386", "-nographic", "-semihosting-config", "enable=on,target=native",
             "-icount", "shift=0,align=off,sleep=off", "-singlestep", "-d", "exec,nochain",
             "-D", fifo, "-kernel", elf],
            stdout=subprocess.PIPE)
        decoder = subprocess.Popen(["defmt-print", "-e", elf, "--log-format", "{L} {s}"],
                                   stdin=qemu.stdout, stdout=subprocess.PIPE, text=True)
        qemu.stdout.close()
        log = []
        reader = threading.Thread(target=lambda: log.extend(decoder.stdout))
        reader.start()
        counts, inside, n = [], False, 0
        # "Trace 0: 0x7f.. [00800408/00000400/00000110/ff020201] Reset": the PC is field 2.
        with open(fifo, "rb") as trace:
            for line in trace:
                if not line.startswith(b"Trace"):
                    continue
                pc = int(line.split(b"/", 2)[1], 16)
                if pc == start:
                    inside, n = True, 0
                elif pc == end and inside:
                    counts.append(n)
                    inside = False
                n += 1
        qemu_rc = qemu.wait()
        decoder.wait()
        reader.join()
    return qemu_rc, counts, log


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("elf")
    parser.add_argument("--max-ratio", type=float)
    parser.add_argument("--timeout", type=int, default=300)
    args = parser.parse_args()
    qemu_rc, counts, log = run(args.elf, args.timeout)
    labels = [m.groups() for m in (re.search(r"REGION (\w+) (\d+)", l) for l in log) if m]
    if qemu_rc != 0 or not any("ICOUNT DONE" in l for l in log):
        sys.stdout.writelines(log)
        sys.exit(f"icount.py: firmware failed (qemu exit {qemu_rc})")
    if len(labels) != len(counts):
        sys.exit(f"icount.py: {len(counts)} measured regions but {len(labels)} REGION lines")

    # Key each region by operation and its occurrence within the checkpoint (Drain runs twice
    # in a turn that summarizes).
    table = collections.defaultdict(dict)
    seen = collections.Counter()
    checkpoints = []
    for (op, at), count in zip(labels, counts):
        at = int(at)
        if at not in checkpoints:
            checkpoints.append(at)
        seen[(op, at)] += 1
        key = op if seen[(op, at)] == 1 else f"{op}#{seen[(op, at)]}"
        table[key][at] = count

    header = f"{'operation':<14}" + "".join(f"{f'@{c} msgs':>13}" for c in checkpoints)
    print(header + f"{'max/min':>10}{'max/min >=100':>15}")
    worst = 0.0
    for op, row in table.items():
        values = [row.get(c) for c in checkpoints]
        cells = "".join(f"{v:>13}" if v is not None else f"{'-':>13}" for v in values)
        present = [v for v in values if v]
        full = [row[c] for c in checkpoints if c >= 100 and row.get(c)]
        ratio = max(present) / min(present) if present else 0
        ratio_full = max(full) / min(full) if len(full) > 1 else 1.0
        worst = max(worst, ratio_full)
        print(f"{op:<14}{cells}{ratio:>10.3f}{ratio_full:>15.3f}")
    print(f"worst max/min across history lengths >= 100 messages: {worst:.3f}")
    if args.max_ratio is not None and worst > args.max_ratio:
        sys.exit(f"icount.py: cost grows with the session (max/min {worst:.3f} > {args.max_ratio})")


if __name__ == "__main__":
    main()
