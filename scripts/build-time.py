"""The report of scripts/build-time.sh: wall and CPU time of a build, and an estimate of its
wall time on idle cores.

Arguments: cargo's timing report (HTML), the log of each rustc's CPU time (package, version,
crate, then bash's `times` line of its children), the build's start, end of build and end of
run (epoch seconds), the build's CPU seconds, and the number of cores.

The idle estimate replays the build: every unit takes its own CPU time (rustc's user + system,
codegen threads included: conservative when a unit had a core to itself), starts when the unit
that unblocked it in the real build has finished (its metadata, for pipelined dependents: the
frontend's share of that unit), and at most one unit runs per core. Build scripts that ran
(not rustc) take their share of the measured CPU time.
"""

import heapq
import json
import re
import sys


def seconds(field):
    minutes, rest = field.split("m")
    return 60 * float(minutes) + float(rest.rstrip("s"))


def rustc_cpu(log):
    cpu = {}
    for line in open(log):
        package, version, crate, user, system = line.split()
        if package != "-":
            key = (package, version, crate)
            cpu[key] = cpu.get(key, 0.0) + seconds(user) + seconds(system)
    return cpu


def crate_of(unit):
    """The crate rustc compiled for `unit` (None: not rustc, a build script that ran)."""
    target = unit["target"].strip()
    if unit["mode"] == "run-custom-build":
        return None
    if target == "build-script":
        return "build_script_build"
    if "bin" in target.replace('"', " ").split():
        # ` bin "name"` (older cargo) or ` name "bin"`.
        words = [w for w in target.replace('"', " ").split() if w != "bin"]
        return words[0].replace("-", "_") if words else None
    return unit["name"].replace("-", "_")


def replay(units, costs, cores):
    after = {}
    for u in units:
        frontend = 1.0
        for name, span in u.get("sections") or []:
            if name == "frontend" and u["duration"]:
                frontend = span["end"] / u["duration"]
        for j in u["unblocked_units"]:
            after[j] = (u["i"], 1.0)
        for j in u["unblocked_rmeta_units"]:
            after[j] = (u["i"], frontend)
    start_of = {u["i"]: u["start"] for u in units}
    pending = set(start_of)
    started, queue, running = {}, [], []
    clock, free = 0.0, cores
    while pending or running or queue:
        for i in sorted(p for p in pending if p not in after or after[p][0] in started):
            when = 0.0
            if i in after:
                blocker, share = after[i]
                when = started[blocker] + share * costs[blocker]
            heapq.heappush(queue, (when, start_of[i], i))
            pending.discard(i)
        if queue and free and queue[0][0] <= clock:
            _, _, i = heapq.heappop(queue)
            free -= 1
            started[i] = clock
            heapq.heappush(running, (clock + costs[i], i))
            continue
        nexts = [running[0][0]] if running else []
        if queue and free:
            nexts.append(queue[0][0])
        clock = max(clock, min(nexts))
        while running and running[0][0] <= clock:
            heapq.heappop(running)
            free += 1
    return clock


def main():
    html, log, start, built, end, cpu_total, cores = sys.argv[1:]
    start, built, end, cpu_total, cores = (
        float(start), float(built), float(end), float(cpu_total), int(cores))
    text = open(html).read()
    units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", text, re.S).group(1))
    summed = sum(u["duration"] for u in units)
    cpu = rustc_cpu(log)
    scale = cpu_total / summed if summed else 1.0  # no rustc log: every unit alike
    costs = {u["i"]: cpu.get((u["name"], u["version"], crate_of(u)), u["duration"] * scale)
             for u in units}
    # What rustc did not run (build scripts running) costs its share of the rest.
    measured = sum(c for u in units if (c := cpu.get((u["name"], u["version"], crate_of(u)))))
    rest = sum(u["duration"] for u in units if (u["name"], u["version"], crate_of(u)) not in cpu)
    if rest:
        share = max(cpu_total - measured, 0.0) / rest
        for u in units:
            if (u["name"], u["version"], crate_of(u)) not in cpu:
                costs[u["i"]] = u["duration"] * min(share, 1.0)
    print(f"wall:    {built - start:.1f} s build, {end - start:.1f} s with the command")
    print(f"cpu:     {cpu_total:.1f} s user + system")
    print(f"units:   {len(units)} compiled, {summed:.1f} s of unit wall time summed (--timings)")
    print(f"idle:    {replay(units, costs, cores):.1f} s estimated on {cores} idle cores "
          f"(each unit's CPU time, in cargo's order)")
    for u in sorted(units, key=lambda u: -costs[u["i"]])[:12]:
        kind = (" " + u["target"].strip()) if u["target"].strip() else ""
        print(f"  {costs[u['i']]:6.1f} s CPU ({u['duration']:6.1f} s wall)  "
              f"{u['name']} {u['version']}{kind}")


main()
