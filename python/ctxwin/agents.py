"""Drop-ins for the OpenAI Agents SDK (``openai-agents``).

* :class:`CtxwinSession` implements the SDK's ``Session`` protocol. It keeps every item
  exactly as added (through ctxwin's archive: a state directory's SQLite file, a PostgreSQL
  database, or memory) and ``get_items`` returns the
  managed window: the newest items that fit ``max_tokens``, never a tool call without its
  output or an output without its call.
* :class:`TrimInputFilter` is a ``RunConfig.call_model_input_filter``: it trims what each
  model call sends (instructions included in the count) without touching the session.

>>> import asyncio
>>> from ctxwin.agents import CtxwinSession
>>> session = CtxwinSession("user-42", store=":memory:", max_tokens=60)
>>> asyncio.run(session.add_items([
...     {"role": "user", "content": "Summarize the incident report. " * 20},
...     {"role": "assistant", "content": "Disk full on db-2."},
...     {"type": "function_call", "call_id": "c1", "name": "df", "arguments": "{}"},
...     {"type": "function_call_output", "call_id": "c1", "output": "91% used"},
... ]))
>>> [item.get("type", item.get("role")) for item in asyncio.run(session.get_items())]
['assistant', 'function_call', 'function_call_output']
>>> len(asyncio.run(session.all_items()))
4
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from typing import Any

from ._trim import trim
from ._native import ItemLog

__all__ = ["CtxwinSession", "TrimInputFilter"]

DEFAULT_MAX_TOKENS = 64_000


class _ItemLog:
    """The native item log of a store, one per store in a process (so the sessions that use
    one state directory share one SQLite connection, or one PostgreSQL pool)."""

    _open: dict[str, ItemLog] = {}
    _open_lock = threading.Lock()

    @classmethod
    def at(cls, store: str) -> ItemLog:
        if store == ":memory:":
            return ItemLog(store)
        key = store if "://" in store else os.path.realpath(store)
        with cls._open_lock:
            log = cls._open.get(key)
            if log is None:
                log = cls._open[key] = ItemLog(store)
            return log


def _pending_tail(items: list[Any]) -> int:
    """Where the trailing calls that have no output yet start (``len(items)`` if none): the
    SDK stores a turn's calls before their outputs, and a run paused for approval leaves
    them so."""
    answered = {
        item.get("call_id")
        for item in items
        if isinstance(item.get("type"), str) and item["type"].endswith("_call_output")
    }
    cut = len(items)
    while cut > 0:
        item = items[cut - 1]
        kind = item.get("type")
        if isinstance(kind, str) and kind.endswith("_call") and item.get("call_id") not in answered:
            cut -= 1
        else:
            break
    return cut


def _window(items: list[Any], max_tokens: int, token_counter: Any, instructions: str | None = None) -> list[Any]:
    """The newest items that fit, whole units only; trailing calls still waiting for their
    outputs are kept as they are, after the window."""
    cut = _pending_tail(items)
    head, pending = items[:cut], items[cut:]
    prefix = [{"role": "system", "content": instructions}] if instructions else []
    if not head:
        return pending
    kept = trim(
        prefix + head,
        max_tokens=max_tokens,
        token_counter=token_counter,
        include_system=bool(prefix),
        format="responses",
    )
    return kept[len(prefix) :] + pending


class CtxwinSession:
    """An Agents SDK session whose ``get_items`` is a managed context window.

    Every item is kept as added, in ctxwin's archive (one row per item, its JSON unchanged,
    searchable like any archived message): ``store`` is a state directory (its
    ``archive.db``; created if missing), a ``postgres://`` URL (the fleet store), or
    ``":memory:"``. The session's conversation in the archive is ``agents/<session_id>``. ``get_items`` returns the
    newest items that fit ``max_tokens`` (ctxwin's estimator by default, or ``token_counter``
    as for :func:`ctxwin.trim`) — a function call and its output are kept or dropped together
    — then applies ``limit`` (the latest N, as every SDK session does).
    :meth:`all_items` returns everything stored. Safe to share between threads and tasks.
    """

    session_settings: Any = None

    def __init__(
        self,
        session_id: str,
        *,
        store: str | os.PathLike[str] = ".ctxwin",
        max_tokens: int = DEFAULT_MAX_TOKENS,
        token_counter: Any = None,
        session_settings: Any = None,
    ) -> None:
        self.session_id = session_id
        self.max_tokens = max_tokens
        self.token_counter = token_counter
        if session_settings is not None:
            from agents.memory.session_settings import coerce_session_settings

            session_settings = coerce_session_settings(session_settings)
        else:
            try:
                from agents.memory.session_settings import SessionSettings

                session_settings = SessionSettings()
            except ImportError:
                session_settings = None
        self.session_settings = session_settings
        self._log = _ItemLog.at(os.fspath(store))
        self._conversation = f"agents/{session_id}"

    async def all_items(self) -> list[Any]:
        """Every item stored for this session, oldest first."""
        rows = await asyncio.to_thread(self._log.items, self._conversation)
        return [json.loads(row) for row in rows]

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The managed window: the newest items that fit ``max_tokens``, whole units only;
        with ``limit`` (or the session settings' limit) the latest ``limit`` of them."""
        if limit is None and self.session_settings is not None:
            limit = getattr(self.session_settings, "limit", None)
        items = await self.all_items()
        window = await asyncio.to_thread(_window, items, self.max_tokens, self.token_counter)
        if limit is not None:
            window = window[-limit:] if limit > 0 else ([] if limit == 0 else window)
        return window

    async def add_items(self, items: list[Any]) -> None:
        """Stores ``items`` after the others."""
        if not items:
            return
        rows = [json.dumps(item) for item in items]
        await asyncio.to_thread(self._log.add, self._conversation, rows)

    async def pop_item(self) -> Any | None:
        """Removes and returns the newest item (``None`` when there is none)."""
        row = await asyncio.to_thread(self._log.pop, self._conversation)
        return None if row is None else json.loads(row)

    async def clear_session(self) -> None:
        """Removes every item of this session."""
        await asyncio.to_thread(self._log.clear, self._conversation)


class TrimInputFilter:
    """A ``RunConfig.call_model_input_filter`` that sends each model call the newest input
    items that fit ``max_tokens`` together with the agent's instructions (whole units only:
    a function call and its output stay together). It changes what the model sees, not what
    the session stores.

    >>> from agents import RunConfig
    >>> from ctxwin.agents import TrimInputFilter
    >>> config = RunConfig(call_model_input_filter=TrimInputFilter(max_tokens=8_000))
    """

    def __init__(self, max_tokens: int, *, token_counter: Any = None) -> None:
        self.max_tokens = max_tokens
        self.token_counter = token_counter

    def __call__(self, data: Any) -> Any:
        from agents.run_config import ModelInputData

        model_data = data.model_data
        instructions = model_data.instructions
        window = _window(list(model_data.input), self.max_tokens, self.token_counter, instructions)
        return ModelInputData(input=window, instructions=instructions)
