"""A pytest plugin for the OpenAI Agents SDK's own session tests (from its source
distribution): every test module's ``SQLiteSession`` becomes a ``CtxwinSession`` with the
same constructor, so the SDK's tests exercise ctxwin's session. The budget is large: those
tests check storage and ordering, ctxwin's own tests check the window."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxwin.agents import CtxwinSession


class SQLiteSessionOnCtxwin(CtxwinSession):
    def __init__(
        self,
        session_id: str,
        db_path: Any = ":memory:",
        sessions_table: str | None = None,
        messages_table: str | None = None,
        session_settings: Any = None,
    ) -> None:
        store = ":memory:" if str(db_path) == ":memory:" else str(Path(db_path).with_suffix(".ctxwin"))
        super().__init__(session_id, store=store, max_tokens=10**9, session_settings=session_settings)

    def close(self) -> None:
        pass


def pytest_collection_modifyitems(session: Any, config: Any, items: list) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and hasattr(module, "SQLiteSession"):
            module.SQLiteSession = SQLiteSessionOnCtxwin
