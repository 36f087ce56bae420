#!/usr/bin/env bash
# Issue 29's targets for ctxwin.trim, in one Python process against LangChain's trim_messages:
#
#   python/bench/trim-vs-langchain.sh          # from anywhere in the repository
#   RUNS=51 python/bench/trim-vs-langchain.sh  # more timing runs (default 21)
#
# Makes target/python-bench-venv (once), installs langchain-core and the package itself with
# `pip install ./python` (the release `wheel` profile; rebuilt when the sources changed), then
# runs python/bench/trim_vs_langchain.py. Exits 1 when a target is missed.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
venv="$target/python-bench-venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check maturin==1.16.0 langchain-core==1.8.3
fi
PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="$target/python-build" "$venv/bin/pip" install -q --disable-pip-version-check \
    --no-build-isolation --no-deps --force-reinstall "$root/python"
cd "$target"  # not python/, whose ctxwin/ has no native module
exec "$venv/bin/python" "$root/python/bench/trim_vs_langchain.py" "${RUNS:-21}"
