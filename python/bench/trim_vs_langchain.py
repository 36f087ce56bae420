#!/usr/bin/env python3
"""ctxwin.trim against LangChain's trim_messages on conv_10000 at 8,000 tokens, in one
process (issue 29's targets). Prints a table with each target's verdict.

Both trims get the same LangChain messages (the 10,000-message session parsed once) and the
same keywords (include_system=True, start_on="human", strategy="last"):

* built-in counters: ctxwin's estimator (token_counter=None) against LangChain's
  count_tokens_approximately (token_counter="approximate"); target ≥ 50× faster;
* a Python counter, the same function for both (len(content) // 4 + 4, annotated
  BaseMessage so that LangChain calls it per message, as ctxwin does); target ≥ 5× faster,
  and both keep the same messages.

usage: trim_vs_langchain.py [RUNS]   (python/bench/trim-vs-langchain.sh sets everything up)
"""

import gzip
import json
import statistics
import sys
import time
from pathlib import Path

import langchain_core
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage, trim_messages

import ctxwin

DATA = Path(__file__).resolve().parents[2] / "benches" / "data" / "conv_10000.jsonl.gz"
BUDGET = 8_000


def load() -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    with gzip.open(DATA, "rt", encoding="utf-8") as lines:
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            m = json.loads(line)
            role, content, meta = m["role"], m.get("content") or "", {"id": str(index)}
            if role == "system":
                messages.append(SystemMessage(content, **meta))
            elif role == "user":
                messages.append(HumanMessage(content, **meta))
            elif role == "assistant":
                calls = [
                    {"id": c["id"], "name": c["function"]["name"],
                     "args": json.loads(c["function"]["arguments"] or "{}"), "type": "tool_call"}
                    for c in m.get("tool_calls") or []
                ]
                messages.append(AIMessage(content, tool_calls=calls, **meta))
            elif role == "tool":
                messages.append(ToolMessage(content, tool_call_id=m["tool_call_id"], **meta))
    return messages


def counter(message: BaseMessage) -> int:
    return len(message.content) // 4 + 4


def median_ms(function, runs: int) -> tuple[float, list]:
    result = function()
    times = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        function()
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times), result


def main() -> int:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 21
    messages = load()
    keywords = dict(max_tokens=BUDGET, include_system=True, start_on="human", strategy="last")
    lc_builtin, lc_kept_b = median_ms(lambda: trim_messages(messages, token_counter="approximate", **keywords), runs)
    cw_builtin, cw_kept_b = median_ms(lambda: ctxwin.trim(messages, **keywords), runs)
    lc_callable, lc_kept_c = median_ms(lambda: trim_messages(messages, token_counter=counter, **keywords), runs)
    cw_callable, cw_kept_c = median_ms(lambda: ctxwin.trim(messages, token_counter=counter, **keywords), runs)
    same = [m.id for m in lc_kept_c] == [m.id for m in cw_kept_c]
    verdict = lambda ok: "met" if ok else "MISSED"
    print(f"conv_10000 ({len(messages):,} LangChain messages), max_tokens={BUDGET:,}, include_system, "
          f"start_on=human; median of {runs} runs; langchain-core {langchain_core.__version__}")
    print(f"{'counter':<44} {'ctxwin.trim':>12} {'trim_messages':>14} {'ratio':>8}  target")
    b, c = lc_builtin / cw_builtin, lc_callable / cw_callable
    print(f"{'built-in (estimator vs count_tokens_approx.)':<44} {cw_builtin:>9.3f} ms {lc_builtin:>11.2f} ms {b:>7.1f}x  ≥ 50x: {verdict(b >= 50)}")
    print(f"{'Python callable len(content)//4+4':<44} {cw_callable:>9.3f} ms {lc_callable:>11.2f} ms {c:>7.1f}x  ≥ 5x: {verdict(c >= 5)}")
    print(f"kept, built-in: ctxwin {len(cw_kept_b)} messages, LangChain {len(lc_kept_b)} (different counters)")
    print(f"kept, callable: ctxwin {len(cw_kept_c)}, LangChain {len(lc_kept_c)}; same messages: {same}")
    return 0 if b >= 50 and c >= 5 and same else 1


if __name__ == "__main__":
    sys.exit(main())
