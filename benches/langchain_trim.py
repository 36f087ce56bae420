#!/usr/bin/env python3
"""LangChain's trim_messages on conv_10000 (issue 15's reference).

Parses the session into LangChain messages once, then times
trim_messages(messages, max_tokens=BUDGET, strategy="last",
token_counter=<len(content)//4 + 4 per message>, include_system=True,
start_on="human", allow_partial=False): median of N runs, in µs.
Prints `langchain_trim_us <median>` and `langchain_kept <indices>` (indices into the
file's messages, 0-based) for trim-vs-langchain.sh to read.

usage: langchain_trim.py FILE.jsonl[.gz] [BUDGET] [RUNS]
"""
import gzip
import json
import statistics
import sys
import time

from langchain_core.messages import (AIMessage, BaseMessage, HumanMessage,
                                     SystemMessage, ToolMessage, trim_messages)


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    messages = []
    with opener(path, "rt", encoding="utf-8") as f:
        for index, line in enumerate(f):
            if not line.strip():
                continue
            m = json.loads(line)
            role, content = m["role"], m.get("content") or ""
            meta = {"id": str(index)}
            if role == "system":
                messages.append(SystemMessage(content, **meta))
            elif role == "user":
                messages.append(HumanMessage(content, **meta))
            elif role == "assistant":
                calls = [
                    {
                        "id": c["id"],
                        "name": c["function"]["name"],
                        "args": json.loads(c["function"]["arguments"] or "{}"),
                        "type": "tool_call",
                    }
                    for c in m.get("tool_calls") or []
                ]
                messages.append(AIMessage(content, tool_calls=calls, **meta))
            elif role == "tool":
                messages.append(ToolMessage(content, tool_call_id=m["tool_call_id"], **meta))
    return messages


def counter(message: BaseMessage) -> int:
    # content-only len//4 + 4 per message, no framing (issue 15's rule); annotated with
    # BaseMessage so trim_messages treats it as a per-message counter and sums it
    return len(message.content) // 4 + 4


def main():
    path = sys.argv[1]
    budget = int(sys.argv[2]) if len(sys.argv) > 2 else 8000
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 21
    messages = load(path)

    def trim():
        return trim_messages(
            messages,
            max_tokens=budget,
            strategy="last",
            token_counter=counter,
            include_system=True,
            start_on="human",
            allow_partial=False,
        )

    kept = trim()
    times = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        trim()
        times.append((time.perf_counter_ns() - start) / 1000)
    import langchain_core

    print(f"langchain_core {langchain_core.__version__}, {len(messages)} messages, budget {budget}, {runs} runs")
    print(f"langchain_trim_us {statistics.median(times):.1f}")
    print(f"langchain_trim_min_us {min(times):.1f}")
    print("langchain_kept " + " ".join(m.id for m in kept))
    print(f"langchain_kept_tokens {sum(counter(m) for m in kept)}")


if __name__ == "__main__":
    main()
