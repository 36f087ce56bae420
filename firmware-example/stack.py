#!/usr/bin/env python3
"""Worst-case stack of a Cortex-M ELF by static analysis: frame sizes plus the call graph.

Frame of each function: from the `.stack_sizes` section when the ELF was built with
`-Z emit-stack-sizes` (nightly), otherwise (and for functions the section does not cover,
e.g. compiler-builtins' assembly) from its prologue: `push`/`push.w`/`stmdb sp!` registers,
`vpush` registers and `sub sp, #n`. Call graph: every `bl`/`blx <imm>` and every branch to
the start of another function (a tail call) in `llvm-objdump -d`. The worst path from the
entry (`main`, cortex-m-rt's `Reset` and `__stext`) is the bound; exception handlers run on
the same stack and are added on top (the firmware takes none). Indirect calls (`blx rN`) and
recursion make the bound unknown: both are reported, the run fails. One exception: the panic
machinery (a panic handler logging, which could panic again) is counted once on a path, a
second panic is cut there. The bound does not depend on the order calls are visited in
(results that cut a cycle above them are not cached; `STACK_DEBUG=1` prints the raw path).

usage: stack.py ELF [--top N]   prints the worst path and its total in bytes, last line
`worst-case stack: <n> B`.
"""
import argparse
import os
import re
import struct
import subprocess
import sys


def llvm_tool(name):
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True,
                             check=True).stdout.strip()
    host = re.search(r"host: (\S+)", subprocess.run(["rustc", "-vV"], capture_output=True,
                                                    text=True, check=True).stdout).group(1)
    return os.path.join(sysroot, "lib", "rustlib", host, "bin", name)


def run(*args):
    return subprocess.run(args, capture_output=True, text=True, check=True).stdout


def stack_sizes(elf):
    """Function name -> frame bytes from `.stack_sizes` (empty without the section)."""
    out = run(llvm_tool("llvm-readobj"), "--stack-sizes", elf)
    sizes = {}
    for names, size in re.findall(r"Functions: \[([^\]]*)\]\s*\n\s*Size: (0x[0-9A-Fa-f]+)", out):
        for name in names.split(","):
            sizes[name.strip()] = int(size, 16)
    return sizes


def loaded_words(elf):
    """Address -> 32-bit little-endian word of every allocated section with contents (ELF32),
    and the set of those addresses inside `.text` (literal pools)."""
    with open(elf, "rb") as f:
        data = f.read()
    shoff, = struct.unpack_from("<I", data, 0x20)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x2E)
    shstrndx, = struct.unpack_from("<H", data, 0x32)
    strtab = struct.unpack_from("<IIIIII", data, shoff + shstrndx * shentsize)[4]
    words, text_words = {}, set()
    for i in range(shnum):
        name, kind, flags, addr, offset, size = struct.unpack_from("<IIIIII", data, shoff + i * shentsize)
        section = data[strtab + name:data.index(b"\0", strtab + name)]
        # The vector table's handlers are entered by the hardware, not through pointers.
        if kind == 1 and flags & 2 and section != b".vector_table":  # SHT_PROGBITS, SHF_ALLOC
            for at in range(0, size - size % 4, 4):
                words[addr + at], = struct.unpack_from("<I", data, offset + at)
                if section == b".text":
                    text_words.add(addr + at)
    return words, text_words


# Condition suffixes: a `bleq` inside an IT block is a call too.
COND = "eq|ne|cs|hs|cc|lo|mi|pl|vs|vc|hi|ls|ge|lt|gt|le|al"

REG_LIST = re.compile(r"\{([^}]*)\}")


def count_regs(regs):
    n = 0
    for part in regs.split(","):
        part = part.strip()
        m = re.fullmatch(r"([a-z]+)(\d+)-[a-z]+(\d+)", part)
        n += int(m.group(3)) - int(m.group(2)) + 1 if m else 1
    return n


def prologue_frame(lines):
    """Bytes a function's prologue reserves (pushes, vpush, sub sp)."""
    frame = 0
    for line in lines[:12]:
        ins = line.split("@")[0]
        m = re.match(r"\s*(push(?:\.w)?|stmdb(?:\.w)?\s+sp!,)\s*(\{[^}]*\})", ins)
        if m:
            frame += 4 * count_regs(REG_LIST.search(m.group(2)).group(1))
            continue
        m = re.match(r"\s*(?:str(?:\.w)?\s+\w+,\s*\[sp,\s*#-(0x[0-9a-f]+|\d+)\]!)", ins)
        if m:
            frame += int(m.group(1), 0)
            continue
        m = re.match(r"\s*vpush(?:\.\d+)?\s*\{([^}]*)\}", ins)
        if m:
            regs = count_regs(m.group(1))
            frame += (8 if "d" in m.group(1) else 4) * regs
            continue
        m = re.match(r"\s*sub(?:\.w|w)?\s+sp,\s*(?:sp,\s*)?#(0x[0-9a-f]+|\d+)", ins)
        if m:
            frame += int(m.group(1), 0)
            continue
    return frame


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("elf")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--top", type=int, default=12, help="frames of the worst path to print")
    args = parser.parse_args()

    dis = run(llvm_tool("llvm-objdump"), "-d", "--no-show-raw-insn", args.elf)
    funcs = {}  # name -> (addr, [instruction lines])
    current = None
    for line in dis.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.+)>:$", line)
        if m:
            current = m.group(2)
            funcs[current] = (int(m.group(1), 16), [])
        elif current and re.match(r"^\s+[0-9a-f]+:\s", line):
            funcs[current][1].append(line.split(":", 1)[1])
    starts = {addr: name for name, (addr, _) in funcs.items()}

    sizes = stack_sizes(args.elf)
    frames, source = {}, {}
    for name, (_, lines) in funcs.items():
        if name in sizes:
            frames[name], source[name] = sizes[name], "stack-sizes"
        else:
            frames[name], source[name] = prologue_frame(lines), "prologue"

    # Indirect calls (`blx rN`, a tail call `bx rN`; opt-level "z" calls hot functions through
    # a register loaded from a literal pool): the target is the literal loaded into rN earlier
    # in the same function (or, for a machine-outlined fragment ending in `bx rN`, in its
    # caller) if there is one. Otherwise it is any address-taken function: one whose address
    # is stored in a data section (vtables, function-pointer tables) or loaded from a literal
    # pool and not called right there (a function pointer handed on). That bounds every
    # function pointer of the program.
    words, text_words = loaded_words(args.elf)
    by_start = {addr & ~1: name for addr, name in starts.items()}

    def function_at(word):
        return by_start.get(word & ~1) if word is not None and word & 1 else None

    address_taken = {function_at(w) for a, w in words.items() if a not in text_words} - {None}
    outlined_tail = {}  # outlined fragment -> register it tail-calls
    for name, (_, lines) in funcs.items():
        if name.startswith("OUTLINED_FUNCTION") and lines:
            m = re.match(r"\s*bx(?:" + COND + r")?\s+(r\d+)", lines[-1])
            if m:
                outlined_tail[name] = m.group(1)
    calls, indirect = {}, {}
    for name, (_, lines) in funcs.items():
        targets = set()
        literal = {}  # register -> function loaded from a literal pool
        loaded, consumed = set(), set()
        unresolved = []
        for ins in lines:
            m = re.match(r"\s*(blx?(?:" + COND + r")?|b(?:" + COND + r")?(?:\.w|\.n)?|cbn?z\s+\w+,)\s+0x([0-9a-f]+)\b", ins)
            if m:
                target = starts.get(int(m.group(2), 16))
                if target and target != name:
                    targets.add(target)
                    reg = outlined_tail.get(target)
                    if reg in literal:
                        targets.add(literal[reg])
                        consumed.add(literal[reg])
                continue
            m = re.match(r"\s*ldr(?:\.w)?\s+(r\d+|lr),\s*\[pc,.*@\s*0x([0-9a-f]+)", ins)
            if m:
                target = function_at(words.get(int(m.group(2), 16)))
                if target:
                    literal[m.group(1)] = target
                    loaded.add(target)
                else:
                    literal.pop(m.group(1), None)
                continue
            m = re.match(r"\s*(?:blx|bx)(?:" + COND + r")?\s+(r\d+)", ins)
            if m:
                if m.group(1) in literal:
                    targets.add(literal[m.group(1)])
                    consumed.add(literal[m.group(1)])
                elif not (name in outlined_tail and ins is lines[-1]):
                    unresolved.append(ins.strip())
                continue
            m = re.match(r"\s*mov(?:\.w)?\s+(r\d+|lr),\s*(r\d+|lr)\s*$", ins)
            if m:  # a register copy carries the literal (`mov r2, r9` ... `blx r2`)
                if m.group(2) in literal:
                    literal[m.group(1)] = literal[m.group(2)]
                else:
                    literal.pop(m.group(1), None)
                continue
            m = re.match(r"\s*\w+(?:\.w)?\s+(r\d+|lr)\b", ins)
            if m and not ins.strip().startswith(("str", "cmp", "tst", "push", "stm", "b")):
                literal.pop(m.group(1), None)  # the register was overwritten
        address_taken |= loaded - consumed
        calls[name] = targets
        if unresolved:
            indirect[name] = unresolved
    for name in indirect:
        calls[name] |= address_taken - {name}

    on_path = set()
    cycles = []
    memo = {}

    # A result that cut a cycle at a function still on the path above is only valid on this
    # path: cached, it would undercount the other paths (and the bound would depend on the
    # order the calls are visited in). Only results whose cuts are all at the function itself
    # are cached; the rest are recomputed (the cycles are the panic machinery's, small).
    # A panic inside the panic machinery (the handler logging) would panic again: its first
    # entry on a path counts, a second one (any copy of the panic functions) is cut there.
    panics = []

    def worst(name):
        # Inside a panic the same function reaches less (no second panic): cached apart.
        key = (name, bool(panics))
        if key in memo:
            return memo[key]
        panic = "panic" in name
        if name in on_path or (panic and panics):
            cycles.append(name)
            return 0, (), frozenset(["<panic>" if panic and panics else name])
        on_path.add(name)
        if panic:
            panics.append(name)
        best, path, cuts = 0, (), frozenset()
        for callee in sorted(calls.get(name, ())):
            total, sub, cut = worst(callee)
            cuts |= cut
            if total > best:
                best, path = total, sub
        on_path.discard(name)
        cuts -= {name}
        if panic:
            panics.pop()
            if not panics:
                cuts -= {"<panic>"}
        result = (frames.get(name, 0) + best, (name,) + path, cuts)
        if not cuts:
            memo[key] = result
        return result

    sys.setrecursionlimit(100000)
    entries = [e for e in ("__stext", "Reset", "main") if e in funcs]
    total, path, _ = max(worst(e) for e in entries)
    by_addr = {}
    for line in run(llvm_tool("llvm-nm"), "-C", args.elf).splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and re.fullmatch(r"[0-9a-f]+", parts[0]):
            by_addr.setdefault(int(parts[0], 16) & ~1, parts[2])
    demangled = {n: by_addr.get(funcs[n][0], n) for n in path}
    if os.environ.get("STACK_DEBUG"):
        print("path:", " -> ".join(path))
    with_sizes = sum(1 for s in source.values() if s == "stack-sizes")
    print(f"frames: {with_sizes} of {len(funcs)} functions from .stack_sizes, "
          f"{len(funcs) - with_sizes} from their prologue")
    print(f"worst path from {path[0] if path else '?'} ({len(path)} frames, top {args.top}):")
    for name in sorted(path, key=lambda n: -frames[n])[:args.top]:
        label = re.sub(r"::h[0-9a-f]{16}$", "", demangled.get(name, name))
        for code, char in (("$LT$", "<"), ("$GT$", ">"), ("$u20$", " "), ("$C$", ","),
                           ("..", "::"), ("_<", "<")):
            label = label.replace(code, char)
        print(f"  {frames[name]:6d}  {label[:100]}")
    bad = False
    reachable = set()
    stack = list(entries)
    while stack:
        n = stack.pop()
        if n not in reachable:
            reachable.add(n)
            stack.extend(calls.get(n, ()))
    ind = {n: v for n, v in indirect.items() if n in reachable}
    if ind:
        print(f"  {sum(map(len, ind.values()))} indirect calls in {len(ind)} functions bounded by the "
              f"{len(address_taken)} address-taken functions")
        if args.verbose:
            for n, v in ind.items():
                print(f"    {n}: {v}")
            print(f"    address-taken: {sorted(address_taken)}")
    if cycles:
        names = sorted(set(cycles))
        # A cycle through the panic machinery (the handler logging, which could panic again)
        # runs only after a panic, which ends the program: cut there, counted once.
        if all(re.search(r"panic|fmt|defmt|semihosting", n) for n in names):
            print(f"  recursion cut (panic path only): {len(names)} functions")
        else:
            bad = True
            print(f"  recursion through: {names[:5]}")
    print(f"worst-case stack: {total if not bad else 'unknown (indirect calls or recursion)'} B")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
