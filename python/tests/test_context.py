"""ctxwin.Context over the std session: push, compose for both providers, stats, checkpoints
and restore on disk, search, forget, and one Context shared by threads."""

import threading

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

import ctxwin


def test_a_state_directory_survives_the_process_object(tmp_path):
    store = tmp_path / "state"
    ctx = ctxwin.Context("agent", store=store, window=8_192, reserve=1_024)
    ctx.push({"role": "system", "content": "You keep CI green."})
    ctx.push([{"role": "user", "content": "Deploy the payments service to staging."},
              {"role": "assistant", "content": "Deployed build 4417."}])
    first = ctx.checkpoint()
    assert ctx.checkpoints() == [first]
    assert (store / "archive.db").exists() and (store / "checkpoints").is_dir()
    del ctx
    again = ctxwin.Context("agent", store=store, window=8_192, reserve=1_024)
    payload = again.compose("openai")
    assert [m["role"] for m in payload.messages] == ["system", "user", "assistant"]
    assert again.search("payments")[0]["content"].startswith("Deploy the payments")


def test_restore_goes_back_and_keeps_what_it_left_aside(tmp_path):
    ctx = ctxwin.Context("s", store=tmp_path)
    ctx.push({"role": "user", "content": "keep this"})
    mark = ctx.checkpoint()
    ctx.push({"role": "assistant", "content": "undo this"})
    assert len(ctx.compose().messages) == 2
    assert ctx.restore(mark) == mark
    assert [m["content"] for m in ctx.compose().messages] == ["keep this"]
    assert ctx.restore() == mark


def test_langchain_and_anthropic_messages_and_tools_compose_for_both_providers():
    ctx = ctxwin.Context("tools", store=":memory:")
    ctx.add_tool("df", "disk usage", {"type": "object", "properties": {"path": {"type": "string"}}})
    ctx.push([SystemMessage("Be brief."), HumanMessage("Disk?"),
              AIMessage("", tool_calls=[{"id": "c1", "name": "df", "args": {"path": "/"}}]),
              ToolMessage("91%", tool_call_id="c1")])
    ctx.push({"role": "assistant", "content": [{"type": "text", "text": "91% used."}]}, format="anthropic")
    anthropic = ctx.compose("anthropic").body
    assert anthropic["system"] == "Be brief."
    assert anthropic["tools"][0]["name"] == "df"
    assert anthropic["messages"][1]["content"][0]["type"] == "tool_use"
    openai = ctx.compose("openai")
    assert openai.messages[2]["tool_calls"][0]["function"]["name"] == "df"
    assert openai.tokens <= openai.budget


def test_the_window_evicts_to_the_archive_and_forget_scrubs_both():
    ctx = ctxwin.Context("small", store=":memory:", window=2_048, reserve=256, config={"locked_tail": 2})
    ids = []
    for turn in range(60):
        ids += ctx.push({"role": "user", "content": f"turn {turn}: the canary token is kiwi-{turn} " + "x" * 300})
    stats = ctx.stats()
    assert stats["core"]["counters"]["units_evicted"] > 0
    assert stats["archive"]["messages"] == 60
    assert len(ctx.compose().messages) < 60
    assert ctx.search("kiwi-3")[0]["id"] == ids[3]
    report = ctx.forget(ids[3])
    assert report["messages"] == [ids[3]]
    assert ctx.search("kiwi-3") == []
    assert ctx.forget(text="kiwi-59")["in_window"] is True


def test_refusals_and_stores_by_url_are_typed_errors(tmp_path):
    ctx = ctxwin.Context("e", store=":memory:")
    with pytest.raises(ctxwin.InvalidInputError):
        ctx.push({"role": "tool", "tool_call_id": "nobody", "content": "42"})
    ctx.push({"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
    with pytest.raises(ctxwin.InvalidInputError, match="tool call"):
        ctx.compose()
    ctx.abort_pending_calls()
    assert ctx.compose().messages[-1]["content"] == ctxwin.ABORTED_RESULT
    # A PostgreSQL URL is a store, as for the CLI; a server that is not there is a storage
    # error that does not show the password.
    with pytest.raises(ctxwin.StorageError) as refused:
        ctxwin.Context("pg", store="postgresql://nobody:secret@127.0.0.1:1/ctxwin?connect_timeout=2")
    assert "secret" not in str(refused.value)
    with pytest.raises(ctxwin.ConfigError):
        ctxwin.Context("bad", store=":memory:", config={"observation_limit": 1})
    with pytest.raises(ctxwin.UsageError):
        ctxwin.Context("m", store=":memory:").checkpoint()
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ctxwin.StorageError):
        ctxwin.Context("f", store=tmp_path / "file")


def test_threads_share_one_context():
    ctx = ctxwin.Context("shared", store=":memory:", window=200_000, reserve=1_000)
    errors = []

    def work(worker):
        try:
            for n in range(50):
                ctx.push({"role": "user", "content": f"worker {worker} message {n}"})
                ctx.compose()
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert ctx.stats()["core"]["counters"]["messages_pushed"] == 200



def test_a_context_on_postgresql_is_restored_by_the_next_process_object(pg_url):
    ctx = ctxwin.Context("agent", store=pg_url, tenant="acme", window=8_192, reserve=1_024)
    ctx.push([{"role": "user", "content": "Rotate the TLS certificate on edge-3."},
              {"role": "assistant", "content": "Rotated; expires in 90 days."}])
    mark = ctx.checkpoint()
    assert ctx.checkpoints() == [mark]
    del ctx
    again = ctxwin.Context("agent", store=pg_url, tenant="acme", window=8_192, reserve=1_024)
    assert [m["content"] for m in again.compose().messages][-1] == "Rotated; expires in 90 days."
    assert again.search("certificate")[0]["id"] == 1
    # Another tenant's conversation of the same name sees none of it.
    other = ctxwin.Context("agent", store=pg_url, tenant="globex")
    assert other.compose().messages == [] and other.search("certificate") == []
