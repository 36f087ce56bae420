#!/usr/bin/env bash
# Cold trim of conv_10000 at an 8,000-token budget: ctxwin against LangChain's trim_messages
# (issue 15). Prints one table with both sides and each target's ratio.
#
#   benches/trim-vs-langchain.sh            # from anywhere in the repository
#   RUNS=31 benches/trim-vs-langchain.sh    # more timing runs (default 21)
#
# Needs python3 with venv (installed with apt-get when missing) and PyPI access for
# langchain-core==1.7.2 (into target/trim-vs-langchain-venv, made once). Builds the `ctxwin`
# binary with `cargo build --release --bin ctxwin` (whichever package holds it) and the
# `cold_trim` bench.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
runs="${RUNS:-21}"
budget=8000
data_gz="$here/data/conv_10000.jsonl.gz"
venv="$target/trim-vs-langchain-venv"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# --- the session, uncompressed (what a user hands the CLI) ------------------------------
gzip -dc "$data_gz" > "$work/conv_10000.jsonl"

# --- LangChain -------------------------------------------------------------------------
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    echo "installing python3-venv" >&2
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import langchain_core, sys; sys.exit(langchain_core.__version__ != "1.7.2")' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check langchain-core==1.7.2
fi
"$venv/bin/python" "$here/langchain_trim.py" "$work/conv_10000.jsonl" "$budget" "$runs" > "$work/langchain.txt"
lc_us=$(awk '/^langchain_trim_us/ {print $2}' "$work/langchain.txt")
lc_kept=$(sed -n 's/^langchain_kept //p' "$work/langchain.txt")

# --- ctxwin, in memory (cold_trim bench) -----------------------------------------------
LANGCHAIN_KEPT="$lc_kept" cargo bench -q -p ctxwin-benches --bench cold_trim > "$work/ctxwin.txt" 2>"$work/ctxwin.err" \
    || { cat "$work/ctxwin.err" >&2; exit 1; }
value() { awk -v k="$1" '$1 == k {print $2}' "$work/ctxwin.txt"; }
cold_us=$(value ctxwin_cold_us)
push_us=$(value ctxwin_push_us_per_msg)
est_us=$(value ctxwin_estimator_us_per_msg)
trim_us=$(value ctxwin_trim_us)
kept=$(sed -n 's/^ctxwin_kept //p' "$work/ctxwin.txt")
trim_kept=$(sed -n 's/^ctxwin_trim_kept //p' "$work/ctxwin.txt")

# --- ctxwin trim, end to end (CLI) -----------------------------------------------------
cargo build -q --release --bin ctxwin
ctxwin="$target/release/ctxwin"
"$ctxwin" trim --budget "$budget" "$work/conv_10000.jsonl" > "$work/trim.out"
if command -v hyperfine >/dev/null; then
    hyperfine -N -w 2 -r "$runs" --export-json "$work/hf.json" \
        "$ctxwin trim --budget $budget $work/conv_10000.jsonl" >/dev/null
    cli_ms=$(python3 -c 'import json,sys; print("%.1f" % (json.load(open(sys.argv[1]))["results"][0]["median"]*1000))' "$work/hf.json")
    how="hyperfine median of $runs"
else
    "$ctxwin" trim --budget "$budget" "$work/conv_10000.jsonl" > /dev/null
    for _ in $(seq "$runs"); do
        start=$(date +%s%N)
        "$ctxwin" trim --budget "$budget" "$work/conv_10000.jsonl" > /dev/null
        echo $(( $(date +%s%N) - start ))
    done | sort -n > "$work/cli.ns"
    cli_ms=$(awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]/1e6}' "$work/cli.ns")
    how="date +%s%N loop, median of $runs"
fi

# --- the table ---------------------------------------------------------------------------
python3 - "$cold_us" "$lc_us" "$push_us" "$est_us" "$trim_us" "$cli_ms" "$how" "$kept" "$lc_kept" "$runs" "$trim_kept" <<'PY'
import sys
cold, lc, push, est, trim, cli, how, kept, lc_kept, runs, trim_kept = sys.argv[1:]
cold, lc, push, est, cli = map(float, (cold, lc, push, est, cli))

def expand(ranges):
    out = []
    for part in ranges.split():
        if "..=" in part:
            a, b = part.split("..=")
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out

def show(indices):
    out, i = [], 0
    while i < len(indices):
        j = i
        while j + 1 < len(indices) and indices[j + 1] == indices[j] + 1:
            j += 1
        out.append(str(indices[i]) if i == j else f"{indices[i]}..={indices[j]}")
        i = j + 1
    return " ".join(out)

kept = expand(kept)
lc_kept = [int(x) for x in lc_kept.split()]
expected = [0] + list(range(9938, 10000))
mark = lambda ok: "met" if ok else "MISSED"
print(f"conv_10000, budget 8,000, len//4+4 per message; in-memory timings median of {runs} runs")
print(f"{'measure':<48} {'ctxwin':>14} {'LangChain':>12}  target / verdict")
print(f"{'cold: fresh manager + push all + compose':<48} {cold/1000:>11.2f} ms {lc/1000:>9.2f} ms  "
      f"ctxwin/LangChain = {cold/lc:.2f}x slower" if cold > lc else
      f"{'cold: fresh manager + push all + compose':<48} {cold/1000:>11.2f} ms {lc/1000:>9.2f} ms  {lc/cold:.1f}x faster")
if trim == "n/a":
    print(f"{'cold: core trim (issue 15)':<48} {'not yet':>14} {lc/1000:>9.2f} ms  target ≥ 100x faster: not yet available")
else:
    t = float(trim)
    print(f"{'cold: core trim (issue 15)':<48} {t/1000:>11.3f} ms {lc/1000:>9.2f} ms  "
          f"{lc/t:.1f}x faster; target ≥ 100x: {mark(lc/t >= 100)}")
print(f"{'sliding-window push, per message':<48} {push:>11.3f} µs {'':>12}  target ≤ 0.5 µs: {push/0.5:.2f}x of it, {mark(push <= 0.5)}")
print(f"{'  default estimator alone, per message':<48} {est:>11.3f} µs {'':>12}  (counted separately)")
print(f"{'ctxwin trim --budget 8000 (CLI, end to end)':<48} {cli:>11.1f} ms {'':>12}  target ≤ 40 ms: {cli/40:.2f}x, {mark(cli <= 40)} ({how})")
# The stateful manager compacts to its low-water mark (50% by default) when the high one is
# passed, so its cold kept set is shorter than a trim's by design; the target is the trim's.
print(f"kept by ctxwin (cold push+compose, compacted to the low-water mark): {len(kept)} messages: {show(kept)}")
print(f"kept by LangChain:                  {len(lc_kept)} messages: {show(lc_kept)}")
print(f"expected pair-safe suffix:          {len(expected)} messages: {show(expected)}")
print(f"manager's set is a suffix of expected: {set(kept) <= set(expected)}; ctxwin == LangChain: {kept == lc_kept}; "
      f"LangChain + assistant 9938 == expected: {sorted(lc_kept + [9938]) == expected}")
if trim_kept:
    trim_kept = expand(trim_kept)
    print(f"kept by ctxwin core trim (content-only len//4+4): {len(trim_kept)} messages: {show(trim_kept)}")
    print(f"core trim == expected: {mark(trim_kept == expected)}")
PY
