"""Drop-in for LangGraph: :class:`CtxwinSaver`, a checkpoint saver (``BaseCheckpointSaver``)
in SQLite that stores each element of a list channel (``messages``) once per thread.

LangGraph writes a new version of the ``messages`` channel at every step, the whole list each
time: a stock saver stores the history again with every checkpoint, so a 500-turn thread
holds hundreds of megabytes. ``CtxwinSaver`` stores a list channel's version as the list of
its elements' content hashes and each distinct element once, so the thread grows with its
messages, not with messages × steps. Everything else is stored as LangGraph gives it; the
saver passes ``langgraph-checkpoint-conformance``, every capability.

Unlike :class:`ctxwin.Context` and :class:`ctxwin.agents.CtxwinSession`, the saver keeps its
own SQLite file (``langgraph.db``) rather than going through ctxwin's storage ports, because
LangGraph's data model is not what those ports hold. The checkpoint port stores opaque
snapshots under ids it assigns, newest first, and deletes only "all but the newest N";
LangGraph addresses checkpoints by its own ids (``get_tuple`` of any past ``checkpoint_id``
would read every newer snapshot of the thread), deletes single checkpoints
(``delete_for_runs``), and lists and filters by metadata across every thread (the port
cannot enumerate threads). Pending writes (upserted by checkpoint, task and index),
channel values by version and the content-addressed message elements are keyed records the
archive port, whose rows are chat messages indexed for search, has no place for. Holding them
there would mean a new port with SQLite and PostgreSQL adapters, not a thin layer.

>>> from langgraph.graph import START, MessagesState, StateGraph
>>> from langchain_core.messages import AIMessage
>>> from ctxwin.langgraph import CtxwinSaver
>>> def reply(state):
...     return {"messages": [AIMessage(f"reply {len(state['messages'])}")]}
>>> builder = StateGraph(MessagesState)
>>> _ = builder.add_node("reply", reply).add_edge(START, "reply")
>>> graph = builder.compile(checkpointer=CtxwinSaver(":memory:"))
>>> config = {"configurable": {"thread_id": "t1"}}
>>> for turn in range(3):
...     _ = graph.invoke({"messages": [("user", f"turn {turn}")]}, config)
>>> [m.content for m in graph.get_state(config).values["messages"]][-2:]
['turn 2', 'reply 5']
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from .errors import StorageError

__all__ = ["CtxwinSaver"]

# A list channel's version stored as the hashes of its elements (see the module docs).
_ELEMENTS = "ctxwin.elements"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (
    thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
    parent_id TEXT, checkpoint_type TEXT NOT NULL, checkpoint BLOB NOT NULL,
    metadata_type TEXT NOT NULL, metadata BLOB NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id));
CREATE TABLE IF NOT EXISTS channel_values (
    thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, channel TEXT NOT NULL,
    version TEXT NOT NULL, value_type TEXT NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, channel, version));
CREATE TABLE IF NOT EXISTS elements (
    thread_id TEXT NOT NULL, hash TEXT NOT NULL, value_type TEXT NOT NULL, value BLOB NOT NULL,
    PRIMARY KEY (thread_id, hash));
CREATE TABLE IF NOT EXISTS writes (
    thread_id TEXT NOT NULL, checkpoint_ns TEXT NOT NULL, checkpoint_id TEXT NOT NULL,
    task_id TEXT NOT NULL, idx INTEGER NOT NULL, channel TEXT NOT NULL,
    value_type TEXT NOT NULL, value BLOB NOT NULL, task_path TEXT NOT NULL,
    PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx));
"""


def _hash(value_type: str, value: bytes) -> str:
    return hashlib.sha256(value_type.encode() + b"\0" + value).hexdigest()


class CtxwinSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpoint saver in SQLite: ``store`` is a state directory (the saver
    uses ``langgraph.db`` in it; created if missing) or ``":memory:"``. Every query is
    scoped to its thread in SQL. Safe to share between threads; the async methods run the
    same work in a worker thread."""

    def __init__(self, store: str | os.PathLike[str] = ".ctxwin", *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        store = os.fspath(store)
        if store == ":memory:":
            path = store
        else:
            Path(store).mkdir(parents=True, exist_ok=True)
            path = str(Path(store) / "langgraph.db")
        try:
            self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            if path != ":memory:":
                self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.executescript(_SCHEMA)
        except sqlite3.Error as error:
            raise StorageError(f"cannot open the checkpoint database {path}: {error}") from error
        self._lock = threading.RLock()

    # -- storage -----------------------------------------------------------------------------

    def _transaction(self, work: Any) -> Any:
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                result = work(self._conn)
                self._conn.execute("COMMIT")
                return result
            except BaseException as error:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(error, sqlite3.Error):
                    raise StorageError(f"checkpoint database: {error}") from error
                raise

    def _read(self, work: Any) -> Any:
        with self._lock:
            try:
                return work(self._conn)
            except sqlite3.Error as error:
                raise StorageError(f"checkpoint database: {error}") from error

    def _dump_value(self, conn: sqlite3.Connection, thread_id: str, value: Any) -> tuple[str, bytes]:
        if type(value) is list and value:
            hashes = []
            for element in value:
                element_type, element_bytes = self.serde.dumps_typed(element)
                digest = _hash(element_type, element_bytes)
                conn.execute(
                    "INSERT OR IGNORE INTO elements VALUES (?, ?, ?, ?)",
                    (thread_id, digest, element_type, element_bytes),
                )
                hashes.append(digest)
            return _ELEMENTS, "\n".join(hashes).encode()
        return self.serde.dumps_typed(value)

    def _load_value(self, conn: sqlite3.Connection, thread_id: str, value_type: str, value: bytes) -> Any:
        if value_type != _ELEMENTS:
            return self.serde.loads_typed((value_type, value))
        hashes = value.decode().split("\n")
        rows = {}
        for start in range(0, len(hashes), 500):
            chunk = hashes[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for digest, element_type, element_bytes in conn.execute(
                f"SELECT hash, value_type, value FROM elements WHERE thread_id = ? AND hash IN ({marks})",
                (thread_id, *chunk),
            ):
                rows[digest] = (element_type, element_bytes)
        return [self.serde.loads_typed(rows[digest]) for digest in hashes]

    def _tuple(self, conn: sqlite3.Connection, row: tuple) -> CheckpointTuple:
        thread_id, ns, checkpoint_id, parent_id, ctype, cbytes, mtype, mbytes = row
        checkpoint: Checkpoint = self.serde.loads_typed((ctype, cbytes))
        values = {}
        for channel, version in checkpoint["channel_versions"].items():
            found = conn.execute(
                "SELECT value_type, value FROM channel_values WHERE thread_id = ? AND"
                " checkpoint_ns = ? AND channel = ? AND version = ?",
                (thread_id, ns, channel, str(version)),
            ).fetchone()
            if found is None or found[0] == "empty":
                continue
            values[channel] = self._load_value(conn, thread_id, found[0], found[1])
        writes = conn.execute(
            "SELECT task_id, idx, channel, value_type, value, task_path FROM writes WHERE"
            " thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
            (thread_id, ns, checkpoint_id),
        ).fetchall()
        writes.sort(key=lambda w: writes_sort_key(w[5], w[0], w[1]))
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}
        parent = (
            {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent_id}}
            if parent_id
            else None
        )
        return CheckpointTuple(
            config=config,
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self.serde.loads_typed((mtype, mbytes)),
            parent_config=parent,
            pending_writes=[(w[0], w[2], self.serde.loads_typed((w[3], w[4]))) for w in writes],
        )

    # -- BaseCheckpointSaver -------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        ns = configurable.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)

        def work(conn: sqlite3.Connection) -> CheckpointTuple | None:
            if checkpoint_id:
                row = conn.execute(
                    "SELECT * FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                    (thread_id, ns, checkpoint_id),
                ).fetchone()
            else:
                row = conn.execute(
                    "SELECT * FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ?"
                    " ORDER BY checkpoint_id DESC LIMIT 1",
                    (thread_id, ns),
                ).fetchone()
            return None if row is None else self._tuple(conn, row)

        return self._read(work)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        yield from self._list(config, filter, before, limit)

    def _list(self, config: Any, filter: Any, before: Any, limit: Any) -> list[CheckpointTuple]:
        clauses, params = [], []
        if config:
            configurable = config["configurable"]
            clauses.append("thread_id = ?")
            params.append(configurable["thread_id"])
            if configurable.get("checkpoint_ns") is not None:
                clauses.append("checkpoint_ns = ?")
                params.append(configurable["checkpoint_ns"])
            if checkpoint_id := get_checkpoint_id(config):
                clauses.append("checkpoint_id = ?")
                params.append(checkpoint_id)
        if before and (before_id := get_checkpoint_id(before)):
            clauses.append("checkpoint_id < ?")
            params.append(before_id)
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""

        def work(conn: sqlite3.Connection) -> list[CheckpointTuple]:
            out: list[CheckpointTuple] = []
            if limit is not None and limit <= 0:
                return out
            rows = conn.execute(
                f"SELECT * FROM checkpoints {where} ORDER BY thread_id, checkpoint_ns, checkpoint_id DESC",
                params,
            )
            for row in rows.fetchall():
                if filter:
                    metadata = self.serde.loads_typed((row[6], row[7]))
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                out.append(self._tuple(conn, row))
                if limit is not None and len(out) >= limit:
                    break
            return out

        return self._read(work)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        ns = configurable.get("checkpoint_ns", "")
        stored = checkpoint.copy()
        values: dict[str, Any] = stored.pop("channel_values")  # type: ignore[misc]

        def work(conn: sqlite3.Connection) -> None:
            for channel, version in new_versions.items():
                if channel in values:
                    value_type, value = self._dump_value(conn, thread_id, values[channel])
                else:
                    value_type, value = "empty", b""
                conn.execute(
                    "INSERT OR REPLACE INTO channel_values VALUES (?, ?, ?, ?, ?, ?)",
                    (thread_id, ns, channel, str(version), value_type, value),
                )
            ctype, cbytes = self.serde.dumps_typed(stored)
            mtype, mbytes = self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))
            conn.execute(
                "INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (thread_id, ns, checkpoint["id"], configurable.get("checkpoint_id"), ctype, cbytes, mtype, mbytes),
            )

        self._transaction(work)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        configurable = config["configurable"]
        key = (configurable["thread_id"], configurable.get("checkpoint_ns", ""), configurable["checkpoint_id"])

        def work(conn: sqlite3.Connection) -> None:
            for position, (channel, value) in enumerate(writes):
                idx = WRITES_IDX_MAP.get(channel, position)
                value_type, data = self.serde.dumps_typed(value)
                # Special channels (negative index) replace; others keep their first write.
                verb = "INSERT OR REPLACE" if idx < 0 else "INSERT OR IGNORE"
                conn.execute(
                    f"{verb} INTO writes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*key, task_id, idx, channel, value_type, data, task_path),
                )

        self._transaction(work)

    def delete_thread(self, thread_id: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            for table in ("checkpoints", "channel_values", "elements", "writes"):
                conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))

        self._transaction(work)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        def work(conn: sqlite3.Connection) -> None:
            for table in ("checkpoints", "channel_values", "elements", "writes"):
                columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
                rest = ", ".join(c for c in columns if c != "thread_id")
                conn.execute(
                    f"INSERT OR REPLACE INTO {table} (thread_id, {rest})"
                    f" SELECT ?, {rest} FROM {table} WHERE thread_id = ?",
                    (target_thread_id, source_thread_id),
                )

        self._transaction(work)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")

        def work(conn: sqlite3.Connection) -> None:
            for thread_id in thread_ids:
                if strategy == "delete":
                    for table in ("checkpoints", "channel_values", "elements", "writes"):
                        conn.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
                    continue
                latest = conn.execute(
                    "SELECT checkpoint_ns, MAX(checkpoint_id) FROM checkpoints WHERE thread_id = ?"
                    " GROUP BY checkpoint_ns",
                    (thread_id,),
                ).fetchall()
                keep_versions: set[tuple[str, str, str]] = set()
                for ns, checkpoint_id in latest:
                    conn.execute(
                        "DELETE FROM checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id != ?",
                        (thread_id, ns, checkpoint_id),
                    )
                    conn.execute(
                        "DELETE FROM writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id != ?",
                        (thread_id, ns, checkpoint_id),
                    )
                    row = conn.execute(
                        "SELECT checkpoint_type, checkpoint FROM checkpoints WHERE thread_id = ?"
                        " AND checkpoint_ns = ? AND checkpoint_id = ?",
                        (thread_id, ns, checkpoint_id),
                    ).fetchone()
                    versions = self.serde.loads_typed((row[0], row[1]))["channel_versions"]
                    keep_versions.update((ns, ch, str(v)) for ch, v in versions.items())
                for ns, channel, version in conn.execute(
                    "SELECT checkpoint_ns, channel, version FROM channel_values WHERE thread_id = ?",
                    (thread_id,),
                ).fetchall():
                    if (ns, channel, version) not in keep_versions:
                        conn.execute(
                            "DELETE FROM channel_values WHERE thread_id = ? AND checkpoint_ns = ?"
                            " AND channel = ? AND version = ?",
                            (thread_id, ns, channel, version),
                        )
                used: set[str] = set()
                for value_type, value in conn.execute(
                    "SELECT value_type, value FROM channel_values WHERE thread_id = ?", (thread_id,)
                ):
                    if value_type == _ELEMENTS:
                        used.update(value.decode().split("\n"))
                for (digest,) in conn.execute(
                    "SELECT hash FROM elements WHERE thread_id = ?", (thread_id,)
                ).fetchall():
                    if digest not in used:
                        conn.execute("DELETE FROM elements WHERE thread_id = ? AND hash = ?", (thread_id, digest))

        self._transaction(work)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = set(run_ids)
        if not runs:
            return

        def work(conn: sqlite3.Connection) -> None:
            rows = conn.execute(
                "SELECT thread_id, checkpoint_ns, checkpoint_id, metadata_type, metadata FROM checkpoints"
            ).fetchall()
            for thread_id, ns, checkpoint_id, mtype, mbytes in rows:
                if self.serde.loads_typed((mtype, mbytes)).get("run_id") not in runs:
                    continue
                for table in ("checkpoints", "writes"):
                    conn.execute(
                        f"DELETE FROM {table} WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?",
                        (thread_id, ns, checkpoint_id),
                    )

        self._transaction(work)

    def get_next_version(self, current: str | None, channel: None) -> str:
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- async twins -----------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        for item in await asyncio.to_thread(self._list, config, filter, before, limit):
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)

    def close(self) -> None:
        """Closes the database."""
        with self._lock:
            self._conn.close()
