"""Tasks through ctxwin.Context: a finished task's summary names its goal, the next task's
start moves the finished task's messages out of the window into the archive (where search
still finds them), refusals are typed errors, and detection starts tasks at new requests."""

import pytest

import ctxwin


def tool_loop(ctx, call_id, command, output):
    ctx.push([
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "shell", "arguments": f'{{"cmd": "{command}"}}'}}]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ])


def window_text(ctx):
    return "\n".join(str(m.get("content")) for m in ctx.compose("openai").messages)


def test_a_finished_task_leaves_the_window_for_its_summary_and_stays_searchable():
    ctx = ctxwin.Context("agent", store=":memory:", config={"locked_tail": 1})
    ctx.push({"role": "system", "content": "You fix builds."})
    assert ctx.current_task() is None
    assert ctx.start_task("fix the linker error") == 1
    running = ctx.current_task()
    assert (running["number"], running["goal"], running["open"]) == (1, "fix the linker error", True)
    assert running["last_id"] is None and running["summary"] is None
    ctx.push({"role": "user", "content": "cargo build fails with a linker error, fix it"})
    tool_loop(ctx, "c1", "cargo build", "error: linker `cc` not found (marker zebra-7731)")
    tool_loop(ctx, "c2", "apt-get install -y gcc", "Setting up gcc (4:12.2.0-3)")
    ctx.push({"role": "assistant", "content": "Installed gcc; cargo build passes now."})
    assert "zebra-7731" in window_text(ctx)

    done = ctx.finish_task("gcc installed")
    assert (done["number"], done["open"]) == (1, False)
    assert done["last_id"] is not None and done["summary_id"] is not None
    assert "fix the linker error" in done["summary"]
    assert done["source_tokens"] > done["summary_tokens"] > 0
    assert done["ratio"] == pytest.approx(done["source_tokens"] / done["summary_tokens"], rel=0.01)
    assert ctx.current_task() is None
    assert ctx.tasks() == [done]

    assert ctx.start_task("write the changelog") == 2
    ctx.push({"role": "user", "content": "Add the gcc fix to CHANGELOG.md"})
    messages = ctx.compose("openai").messages
    assert not [m for m in messages if m["role"] == "tool" or m.get("tool_calls")], \
        "the finished task's tool loop stayed in the window"
    assert "fix the linker error" in window_text(ctx), "the summary stands in for the task"
    hits = ctx.search("zebra-7731")
    assert hits and hits[0]["role"] == "tool" and "zebra-7731" in hits[0]["content"]
    assert [(t["number"], t["open"]) for t in ctx.tasks()] == [(1, False), (2, True)]
    assert ctx.stats()["tasks"]["tasks"][0]["goal"] == "fix the linker error"


def test_task_refusals_are_typed_errors():
    ctx = ctxwin.Context("refusals", store=":memory:")
    with pytest.raises(ctxwin.UsageError, match="no task"):
        ctx.finish_task()
    ctx.start_task("look at the disk")
    ctx.push({"role": "assistant", "content": "", "tool_calls": [
        {"id": "d", "type": "function", "function": {"name": "df", "arguments": "{}"}}]})
    with pytest.raises(ctxwin.InvalidInputError, match="tool call"):
        ctx.finish_task("done")
    with pytest.raises(ctxwin.InvalidInputError, match="tool call"):
        ctx.start_task("another")
    assert ctx.current_task()["number"] == 1, "a refused task operation changes nothing"
    ctx.push({"role": "tool", "tool_call_id": "d", "content": "91% used"})
    assert ctx.finish_task()["number"] == 1
    with pytest.raises(ctxwin.UsageError, match="no task"):
        ctx.finish_task()
    with pytest.raises(ctxwin.UsageError, match="task_detection"):
        ctxwin.Context("bad", store=":memory:", task_detection="always")


def test_task_detection_starts_a_task_at_a_new_request_not_at_a_reply():
    ctx = ctxwin.Context("detect", store=":memory:", task_detection="new-request")
    ctx.push({"role": "user", "content": "List the crates"})
    assert [t["goal"] for t in ctx.tasks()] == ["List the crates"]
    tool_loop(ctx, "a", "ls", "core cli proxy")
    ctx.push({"role": "assistant", "content": "Which one should I open?"})
    ctx.push({"role": "user", "content": "core"})
    assert len(ctx.tasks()) == 1
    tool_loop(ctx, "b", "cat core/src/lib.rs", "#![no_std]")
    ctx.push({"role": "assistant", "content": "core is the no_std crate."})
    ctx.push({"role": "user", "content": "Now bump the version"})
    assert [(t["goal"], t["open"]) for t in ctx.tasks()] == [
        ("List the crates", False), ("Now bump the version", True)]
    assert ctx.stats()["tasks"]["detection"] == "new-request"
    off = ctxwin.Context("off", store=":memory:")
    off.push({"role": "user", "content": "List the crates"})
    assert off.tasks() == []
