"""``ctxwin.Context``: one conversation's managed context window, kept in a state directory
(SQLite archive of every message, crash-safe checkpoints), a PostgreSQL database, or
memory."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from . import _native, _shapes
from ._trim import _counter
from .errors import UsageError

__all__ = ["Composed", "Context"]


@dataclass(frozen=True)
class Composed:
    """A composed payload: the request ``body`` (``messages``, and ``tools`` and for
    Anthropic ``system`` when there are any), its ``tokens`` as the context's counter counts
    them, the ``budget`` it was composed under, the units evicted to make room for the
    dynamic context, and the archived message ids recalled into it."""

    body: dict
    tokens: int
    budget: int
    evicted_units: int
    recalled: list[int] = field(default_factory=list)

    @property
    def messages(self) -> list[dict]:
        """The payload's messages (``body["messages"]``)."""
        return self.body["messages"]


class Context:
    """A conversation's context window over ctxwin's std session: every message pushed is
    archived before the window sees it, the window keeps what fits the budget (whole units:
    a tool call and its results go together), and :meth:`compose` gives this turn's request
    body for OpenAI or Anthropic.

    ``store``, as the CLI's ``[store] url``: a state directory (created if missing:
    ``archive.db``, ``checkpoints/``), a ``postgres://`` or ``postgresql://`` URL (the fleet
    store: archive and checkpoints in one database, shared by processes; ``tenant`` scopes
    every row), or ``":memory:"``. The newest checkpoint is restored when one exists. One
    ``Context`` per store, tenant and ``name`` at a time; a ``Context`` can be shared by
    threads (each call holds it alone and runs with the GIL released).

    ``window`` and ``reserve`` set the model's context window and the tokens kept for the
    reply; ``config`` any other field of the core's ``Config`` by name (``locked_tail``,
    ``strategy``, ...). ``tokenizer`` is a name or :class:`ctxwin.Tokenizer` (the built-in
    estimator by default). ``checkpoint_every`` writes a checkpoint every that many pushes.

    >>> import ctxwin
    >>> ctx = ctxwin.Context("demo", store=":memory:", window=4096, reserve=512)
    >>> ctx.push({"role": "system", "content": "You are terse."})
    [1]
    >>> ctx.push([{"role": "user", "content": "Is the build green?"},
    ...           {"role": "assistant", "content": "Yes: 42 tests passed."}])
    [2, 3]
    >>> payload = ctx.compose("anthropic")
    >>> payload.body["system"], [m["role"] for m in payload.messages]
    ('You are terse.', ['user', 'assistant'])
    >>> ctx.search("tests")[0]["content"]
    'Yes: 42 tests passed.'
    >>> ctx.stats()["core"]["counters"]["messages_pushed"]
    3
    """

    def __init__(
        self,
        name: str = "default",
        *,
        store: str | os.PathLike[str] = ".ctxwin",
        window: int | None = None,
        reserve: int | None = None,
        tokenizer: Any = None,
        config: dict[str, Any] | None = None,
        checkpoint_every: int | None = None,
        tenant: str | None = None,
        task_detection: str = "off",
    ) -> None:
        settings = dict(config or {})
        if window is not None:
            settings["context_window"] = window
        if reserve is not None:
            settings["reserved_for_reply"] = reserve
        native_tokenizer, function, _ = _counter(tokenizer)
        if function is not None:
            raise UsageError("a Context counts with a tokenizer name or ctxwin.Tokenizer, not a function")
        self._native = _native.Context(
            name,
            os.fspath(store),
            config=json.dumps(settings) if settings else None,
            tokenizer=native_tokenizer,
            checkpoint_every=checkpoint_every,
            tenant=tenant,
            task_detection=task_detection,
        )

    @property
    def name(self) -> str:
        """The session name (the key of its rows in the archive)."""
        return self._native.name

    def push(self, messages: Any, *, format: str | None = None) -> list[int]:
        """Adds a message or a list of messages (LangChain messages, OpenAI or Anthropic
        dicts); returns the ids they got (an Anthropic message with tool results gets one per
        result). A tool result must answer a call pushed before it."""
        if isinstance(messages, dict) or not isinstance(messages, Sequence):
            messages = [messages]
        messages = list(messages)
        if not messages:
            return []
        shape = format or _shapes.detect(messages)
        if shape == "responses":
            messages, _ = _shapes.responses_as_chat(messages)
            shape = "openai"
        return self._native.push_messages(messages, shape)

    def add_tool(self, name: str, description: str = "", parameters: dict | None = None) -> int:
        """Declares a tool the model may call (its definition is pinned in every payload)."""
        schema = parameters if parameters is not None else {"type": "object", "properties": {}}
        return self._native.add_tool(name, description, json.dumps(schema))

    def abort_pending_calls(self) -> None:
        """Gives calls still waiting for results a synthetic result, so that compose works."""
        self._native.abort_pending_calls()

    def compose(
        self, format: str = "openai", dynamic: Iterable[str] = (), *, query: str | None = None
    ) -> Composed:
        """This turn's payload for ``"openai"`` or ``"anthropic"``, with ``dynamic`` context
        (sent as system text) and, when the archive holds matches for ``query`` (by default
        the newest user message), recalled turns in the room left."""
        body, tokens, budget, evicted, recalled = self._native.compose(format, list(dynamic), query)
        return Composed(json.loads(body), tokens, budget, evicted, list(recalled))

    def stats(self) -> dict[str, Any]:
        """The session's statistics: the core's (tokens by level, counters), calibration,
        archive, checkpoints."""
        return json.loads(self._native.stats())

    def checkpoint(self) -> str:
        """Writes a checkpoint now; returns its id."""
        return self._native.checkpoint()

    def checkpoints(self) -> list[str]:
        """Checkpoint ids, newest first."""
        return self._native.checkpoints()

    def restore(self, checkpoint: str | None = None) -> str:
        """Goes back to ``checkpoint`` (the newest that restores by default); returns the id
        restored. Archived messages newer than it are kept aside, never lost."""
        return self._native.restore(checkpoint)

    def search(self, query: str, limit: int = 5) -> list[dict[str, Any]]:
        """Archived messages of this conversation matching ``query`` (full-text, BM25), best
        first: dicts with ``id``, ``unit``, ``role``, ``content``, ``snippet``, ``score``."""
        return self._native.search(query, limit)

    def forget(self, id: int | None = None, *, text: str | None = None) -> dict[str, Any]:
        """Forgets message ``id``, or every occurrence of ``text``: replaced by a marker in
        the window, the archive and every checkpoint."""
        if (id is None) == (text is None):
            raise UsageError("forget takes a message id or text=, one of them")
        messages, in_window, rewritten = self._native.forget(id, text)
        return {"messages": messages, "in_window": in_window, "checkpoints_rewritten": rewritten}

    def start_task(self, goal: str) -> int:
        """Starts a task with a short ``goal`` (64 bytes kept); returns its number. A task
        still running is finished first, and finished tasks' messages leave the window for
        the archive (the locked tail stays). Raises :class:`InvalidInputError` while tool
        calls wait for results.

        >>> import ctxwin
        >>> ctx = ctxwin.Context("tasks", store=":memory:")
        >>> ctx.start_task("fix the flaky net test")
        1
        >>> ctx.push([{"role": "user", "content": "tests/net.rs fails once in ten runs"},
        ...           {"role": "assistant", "content": "Decided to retry the bind in tests/net.rs."}])
        [1, 2]
        >>> ctx.current_task()["goal"]
        'fix the flaky net test'
        >>> done = ctx.finish_task("fixed")
        >>> done["number"], done["open"], "flaky net test" in done["summary"]
        (1, False, True)
        >>> ctx.start_task("write the changelog")
        2
        >>> [task["number"] for task in ctx.tasks()]
        [1, 2]
        """
        return self._native.start_task(goal)

    def finish_task(self, outcome: str | None = None) -> dict[str, Any]:
        """Finishes the running task with ``outcome`` (by default the summary takes the last
        answer's first sentence) and returns it as :meth:`tasks` does. Raises
        :class:`UsageError` when no task is running, :class:`InvalidInputError` while tool
        calls wait for results."""
        return self._native.finish_task(outcome)

    def tasks(self) -> list[dict[str, Any]]:
        """The tasks kept (the newest four), oldest first: dicts with ``number``, ``goal``,
        ``open``, ``first_id``, ``last_id`` (``None`` while open), ``summary_id`` and
        ``summary`` (its text while the window holds it, else ``None``), ``source_tokens``,
        ``summary_tokens`` and ``ratio`` (how many times smaller the summary is; ``None``
        without one)."""
        return self._native.tasks()

    def current_task(self) -> dict[str, Any] | None:
        """The task running now, as :meth:`tasks` gives it, or ``None``."""
        return self._native.current_task()

    def __repr__(self) -> str:
        return f"Context({self.name!r})"
