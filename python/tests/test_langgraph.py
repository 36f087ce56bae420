"""ctxwin.langgraph.CtxwinSaver: the langgraph-checkpoint-conformance suite on memory, a state
directory (SQLite) and PostgreSQL, and what the element store saves on a long thread."""

from __future__ import annotations

import itertools
import os
import sqlite3
import tempfile
import warnings

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.graph import START, MessagesState, StateGraph

from ctxwin.langgraph import CtxwinSaver


@checkpointer_test(name="CtxwinSaver(:memory:)")
async def memory_saver():
    yield CtxwinSaver(":memory:")


@checkpointer_test(name="CtxwinSaver(directory)")
async def file_saver():
    with tempfile.TemporaryDirectory(prefix="ctxwin-saver-") as directory:
        yield CtxwinSaver(directory)


async def _passes(registered):
    report = await validate(registered, progress=ProgressCallbacks.verbose())
    report.print_report()
    failures = {
        name: [r for r in result.results if not r.passed] if hasattr(result, "results") else result
        for name, result in report.results.items()
        if not getattr(result, "passed", True)
    }
    assert report.passed_all(), failures
    assert report.conformance_level() != "NONE"


@pytest.mark.parametrize("registered", [memory_saver, file_saver], ids=["memory", "directory"])
async def test_the_conformance_suite_passes(registered):
    await _passes(registered)


async def test_the_conformance_suite_passes_on_postgresql(pg_url):
    tenants = itertools.count()

    @checkpointer_test(name="CtxwinSaver(postgresql)")
    async def postgres_saver():
        # One schema for the run: each saver the suite makes a tenant of its own.
        yield CtxwinSaver(pg_url, tenant=f"suite-{next(tenants)}")

    await _passes(postgres_saver)


def test_tenants_of_one_postgresql_store_never_meet(pg_url):
    config = {"configurable": {"thread_id": "t"}}
    acme, other = CtxwinSaver(pg_url, tenant="acme"), CtxwinSaver(pg_url, tenant="other")
    _graph(acme).invoke({"messages": [HumanMessage("for acme only")]}, config)
    assert _graph(other).get_state(config).values == {}
    assert list(other.list(None)) == []
    assert len(list(acme.list(None))) >= 2


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
    assert (tmp_path / "archive.db").exists() and not (tmp_path / "langgraph.db").exists()


def test_an_old_langgraph_db_is_left_alone_and_named_in_a_warning(tmp_path):
    old = tmp_path / "langgraph.db"
    old.write_bytes(b"an earlier saver's file")
    with pytest.warns(UserWarning, match="not carried over"):
        CtxwinSaver(tmp_path)
    assert old.read_bytes() == b"an earlier saver's file"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        CtxwinSaver(tmp_path / "fresh")


def test_each_message_is_stored_once_however_many_checkpoints_hold_it(tmp_path):
    turns = 60
    config = {"configurable": {"thread_id": "long"}}
    graph = _graph(CtxwinSaver(tmp_path))
    for turn in range(turns):
        graph.invoke({"messages": [HumanMessage(f"turn {turn}")]}, config)
    # Read behind the store's back: the records table of the state directory's archive.
    db = sqlite3.connect(tmp_path / "archive.db")

    def count(collection):
        return db.execute(
            "SELECT COUNT(*), SUM(LENGTH(value)) FROM records WHERE namespace = ? AND collection = ?",
            (b"long", collection.encode()),
        ).fetchone()

    elements, stored = count("element")
    checkpoints, _ = count("checkpoint")
    assert elements == 2 * turns, elements
    assert checkpoints >= 3 * turns
    # The whole history once: about 2 × 60 messages of ~450 bytes, not 60 × that.
    assert stored < 2 * turns * 2_000, stored
    assert len(graph.get_state(config).values["messages"]) == 2 * turns
    size = os.path.getsize(tmp_path / "archive.db")
    print(f"{turns} turns, {checkpoints} checkpoints: {elements} elements, {stored} bytes of them, archive.db {size} bytes")
