"""ctxwin.langgraph.CtxwinSaver: the langgraph-checkpoint-conformance suite, file and memory
stores, and what the element store saves on a long thread."""

from __future__ import annotations

import os
import sqlite3

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.graph import START, MessagesState, StateGraph

from ctxwin.langgraph import CtxwinSaver


@checkpointer_test(name="CtxwinSaver(:memory:)")
async def memory_saver():
    yield CtxwinSaver(":memory:")


_file_dirs: list[str] = []


@checkpointer_test(name="CtxwinSaver(directory)")
async def file_saver():
    import tempfile

    directory = tempfile.mkdtemp(prefix="ctxwin-saver-")
    _file_dirs.append(directory)
    saver = CtxwinSaver(directory)
    yield saver
    saver.close()


@pytest.mark.parametrize("registered", [memory_saver, file_saver], ids=["memory", "directory"])
async def test_the_conformance_suite_passes(registered):
    report = await validate(registered, progress=ProgressCallbacks.verbose())
    report.print_report()
    failures = {
        name: [r for r in result.results if not r.passed] if hasattr(result, "results") else result
        for name, result in report.results.items()
        if not getattr(result, "passed", True)
    }
    assert report.passed_all(), failures
    assert report.conformance_level() != "NONE"


def _graph(saver):
    def reply(state):
        return {"messages": [AIMessage(f"reply to {state['messages'][-1].content} " + "x" * 400)]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=saver)


def test_a_thread_survives_a_new_saver_on_the_same_directory(tmp_path):
    config = {"configurable": {"thread_id": "t"}}
    graph = _graph(CtxwinSaver(tmp_path))
    graph.invoke({"messages": [HumanMessage("one")]}, config)
    graph = _graph(CtxwinSaver(tmp_path))
    graph.invoke({"messages": [HumanMessage("two")]}, config)
    contents = [m.content.split(" x")[0] for m in graph.get_state(config).values["messages"]]
    assert contents == ["one", "reply to one", "two", "reply to two"]


def test_each_message_is_stored_once_however_many_checkpoints_hold_it(tmp_path):
    turns = 60
    config = {"configurable": {"thread_id": "long"}}
    graph = _graph(CtxwinSaver(tmp_path))
    for turn in range(turns):
        graph.invoke({"messages": [HumanMessage(f"turn {turn}")]}, config)
    db = sqlite3.connect(tmp_path / "langgraph.db")
    elements = db.execute("SELECT COUNT(*) FROM elements").fetchone()[0]
    checkpoints = db.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0]
    stored = db.execute("SELECT SUM(LENGTH(value)) FROM elements").fetchone()[0]
    assert elements == 2 * turns, elements
    assert checkpoints >= 3 * turns
    # The whole history once: about 2 × 60 messages of ~450 bytes, not 60 × that.
    assert stored < 2 * turns * 2_000, stored
    assert len(graph.get_state(config).values["messages"]) == 2 * turns
    size = os.path.getsize(tmp_path / "langgraph.db")
    print(f"{turns} turns, {checkpoints} checkpoints: {elements} elements, {stored} bytes of them, db {size} bytes")
