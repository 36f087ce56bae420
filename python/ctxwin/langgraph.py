"""Drop-in for LangGraph: :class:`CtxwinSaver`, a checkpoint saver (``BaseCheckpointSaver``)
that keeps LangGraph's checkpoints in ctxwin's store and each element of a list channel
(``messages``) once per thread.

LangGraph writes a new version of the ``messages`` channel at every step, the whole list each
time: a stock saver stores the history again with every checkpoint, so a 500-turn thread
holds hundreds of megabytes. ``CtxwinSaver`` stores a list channel's version as the list of
its elements' content hashes and each distinct element once, so the thread grows with its
messages, not with messages × steps. Everything else is stored as LangGraph gives it; the
saver passes ``langgraph-checkpoint-conformance``, every capability.

The saver stores through ctxwin's record port (``ctxwin._native.Records``): keyed records of
a tenant's namespaces, one namespace per LangGraph thread, in the store a
:class:`ctxwin.Context` would use for the same ``store`` argument — table ``records`` of a
state directory's ``archive.db`` (SQLite), of a PostgreSQL database (``postgres://…``, shared
by processes; ``tenant`` scopes every record), or memory. Every lookup (a checkpoint by
LangGraph's id, the newest of a thread, a listing before an id, a metadata filter, the
pending writes of a checkpoint) is a keyed or ranged query of the store scoped to the thread,
metadata filters included (the JSON-serializable top-level metadata values are matched in the
store; a filter on any other value matches nothing). The records of a thread:

==============  ===================================  ==========================================
collection      key                                  value
==============  ===================================  ==========================================
``checkpoint``  ns ␟ checkpoint id                   checkpoint and metadata (serde), parent id
``namespace``   ns                                   (empty) the thread's checkpoint namespaces
``channel``     ns ␟ channel ␟ version               the channel's value, or element hashes
``element``     content hash                         one element of a list channel
``write``       ns ␟ checkpoint id ␟ task ␟ index    a pending write
==============  ===================================  ==========================================

(␟ is U+001F, which a checkpoint namespace may therefore not hold.) Earlier versions of the
saver kept a ``langgraph.db`` of their own in the state directory; it is not read (its
threads are not carried over) and the saver warns once when it finds one: delete it when its
threads are no longer needed.

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
import json
import os
import random
import warnings
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

from ._native import Records
from .errors import UsageError

__all__ = ["CtxwinSaver"]

# Collections of a thread's namespace (see the module docs).
_CHECKPOINT = "checkpoint"
_NAMESPACE = "namespace"
_CHANNEL = "channel"
_ELEMENT = "element"
_WRITE = "write"
_SEP = "\x1f"
# Records read per call while paging.
_PAGE = 500
# A list channel's version stored as the hashes of its elements (see the module docs).
_ELEMENTS = "ctxwin.elements"


def _key(*parts: str) -> str:
    return _SEP.join(parts)


def _pack(header: dict[str, Any], *blobs: bytes) -> bytes:
    """A record's value: a JSON header line (with the blobs' sizes), then the blobs."""
    header = {**header, "sizes": [len(blob) for blob in blobs]}
    return json.dumps(header).encode() + b"\n" + b"".join(blobs)


def _unpack(value: bytes) -> tuple[dict[str, Any], list[bytes]]:
    line, _, rest = value.partition(b"\n")
    header = json.loads(line)
    blobs, start = [], 0
    for size in header["sizes"]:
        blobs.append(rest[start : start + size])
        start += size
    return header, blobs


def _json(value: Any) -> str:
    return json.dumps(value, default=str, allow_nan=False, sort_keys=True)


def _fields(metadata: dict[str, Any]) -> str | None:
    """The metadata values the store can match: those that are JSON (others as their text)."""
    fields = {}
    for name, value in metadata.items():
        try:
            _json(value)
        except (TypeError, ValueError):
            continue
        fields[name] = value
    return _json(fields) if fields else None


def _hash(value_type: str, value: bytes) -> str:
    return hashlib.sha256(value_type.encode() + b"\0" + value).hexdigest()


class CtxwinSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpoint saver in ctxwin's store: ``store`` as :class:`ctxwin.Context`
    takes it — a state directory (created if missing; the records go in its ``archive.db``), a
    ``postgres://`` or ``postgresql://`` URL, or ``":memory:"``. ``tenant`` scopes every
    record (threads of two tenants never meet). Safe to share between threads; the async
    methods run the same work in a worker thread."""

    def __init__(
        self,
        store: str | os.PathLike[str] = ".ctxwin",
        *,
        tenant: str = "",
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        store = os.fspath(store)
        if store != ":memory:" and "://" not in store and (Path(store) / "langgraph.db").exists():
            warnings.warn(
                f"{Path(store) / 'langgraph.db'} was written by an earlier ctxwin saver and is not"
                " read: its threads are not carried over (delete it once they are not needed)",
                stacklevel=2,
            )
        self._records = Records(store, tenant=tenant)

    # -- storage -----------------------------------------------------------------------------

    def _all(self, thread: str, collection: str, prefix: str = "", fields: str | None = None) -> Iterator[tuple]:
        """Every record of ``collection`` under ``prefix``, in key order, a page per call."""
        after = None
        while True:
            page = self._records.list(thread, collection, limit=_PAGE, prefix=prefix, after=after, fields=fields)
            yield from page
            if len(page) < _PAGE:
                return
            after = page[-1][0]

    def _threads(self) -> Iterator[str]:
        after = None
        while True:
            page = self._records.namespaces(limit=_PAGE, after=after)
            yield from page
            if len(page) < _PAGE:
                return
            after = page[-1]

    def _namespaces(self, thread: str) -> list[str]:
        return [key for key, _, _ in self._all(thread, _NAMESPACE)]

    def _dump_value(self, value: Any, writes: list[tuple]) -> tuple[str, bytes]:
        if type(value) is list and value:
            hashes = []
            for element in value:
                element_type, element_bytes = self.serde.dumps_typed(element)
                digest = _hash(element_type, element_bytes)
                writes.append(("insert", _ELEMENT, digest, _pack({"type": element_type}, element_bytes), None))
                hashes.append(digest)
            return _ELEMENTS, "\n".join(hashes).encode()
        return self.serde.dumps_typed(value)

    def _tuple(self, thread: str, ns: str, record: tuple) -> CheckpointTuple:
        key, value, _ = record
        checkpoint_id = key[len(ns) + 1 :]
        header, (cbytes, mbytes) = _unpack(value)
        checkpoint: Checkpoint = self.serde.loads_typed((header["checkpoint_type"], cbytes))
        versions = checkpoint["channel_versions"]
        wanted = {_key(ns, channel, str(version)): channel for channel, version in versions.items()}
        stored = {}
        for found_key, found_value, _ in self._records.get(thread, _CHANNEL, list(wanted)):
            found_header, (data,) = _unpack(found_value)
            if found_header["type"] != "empty":
                stored[wanted[found_key]] = (found_header["type"], data)
        hashes = {
            digest
            for value_type, data in stored.values()
            if value_type == _ELEMENTS
            for digest in data.decode().split("\n")
        }
        elements = {}
        if hashes:
            for digest, element_value, _ in self._records.get(thread, _ELEMENT, sorted(hashes)):
                element_header, (element_bytes,) = _unpack(element_value)
                elements[digest] = (element_header["type"], element_bytes)
        values = {}
        for channel, (value_type, data) in stored.items():
            if value_type == _ELEMENTS:
                values[channel] = [self.serde.loads_typed(elements[d]) for d in data.decode().split("\n")]
            else:
                values[channel] = self.serde.loads_typed((value_type, data))
        writes_prefix = _key(ns, checkpoint_id) + _SEP
        writes = []
        for write_key, write_value, _ in self._all(thread, _WRITE, writes_prefix):
            task_id, idx = write_key[len(writes_prefix) :].rsplit(_SEP, 1)
            write_header, (data,) = _unpack(write_value)
            writes.append((write_header["task_path"], task_id, int(idx), write_header, data))
        writes.sort(key=lambda w: writes_sort_key(w[0], w[1], w[2]))
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}}
        parent_id = header.get("parent")
        parent = (
            {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": parent_id}}
            if parent_id
            else None
        )
        return CheckpointTuple(
            config=config,
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self.serde.loads_typed((header["metadata_type"], mbytes)),
            parent_config=parent,
            pending_writes=[(w[1], w[3]["channel"], self.serde.loads_typed((w[3]["type"], w[4]))) for w in writes],
        )

    @staticmethod
    def _where(config: RunnableConfig) -> tuple[str, str]:
        configurable = config["configurable"]
        ns = configurable.get("checkpoint_ns", "") or ""
        if _SEP in ns:
            raise UsageError(f"a checkpoint namespace may not hold U+001F: {ns!r}")
        return str(configurable["thread_id"]), ns

    # -- BaseCheckpointSaver -------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread, ns = self._where(config)
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            found = self._records.get(thread, _CHECKPOINT, [_key(ns, checkpoint_id)])
        else:
            found = self._records.list(thread, _CHECKPOINT, limit=1, prefix=ns + _SEP, descending=True)
        return self._tuple(thread, ns, found[0]) if found else None

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints by thread, then namespace, newest first within a namespace; every
        condition is part of the store's query."""
        if limit is not None and limit <= 0:
            return
        try:
            fields = _json(filter) if filter else None
        except (TypeError, ValueError):
            return  # a value that is not JSON matches no stored metadata
        before_id = get_checkpoint_id(before) if before else None
        checkpoint_id = get_checkpoint_id(config) if config else None
        if config:
            threads: Iterator[str] = iter([str(config["configurable"]["thread_id"])])
        else:
            threads = self._threads()
        given_ns = config["configurable"].get("checkpoint_ns") if config else None
        left = limit
        for thread in threads:
            namespaces = [self._where(config)[1]] if given_ns is not None else self._namespaces(thread)
            for ns in namespaces:
                if checkpoint_id:
                    if before_id is not None and checkpoint_id >= before_id:
                        continue
                    exact = _key(ns, checkpoint_id)
                    found = self._records.list(thread, _CHECKPOINT, limit=1, prefix=exact, fields=fields)
                    pages: Iterator[list] = iter([[r for r in found if r[0] == exact]])
                else:
                    pages = self._newest(thread, ns, before_id, fields)
                for page in pages:
                    for record in page:
                        yield self._tuple(thread, ns, record)
                        if left is not None:
                            left -= 1
                            if left == 0:
                                return

    def _newest(self, thread: str, ns: str, before_id: str | None, fields: str | None) -> Iterator[list]:
        bound = _key(ns, before_id) if before_id else None
        while True:
            page = self._records.list(
                thread, _CHECKPOINT, limit=_PAGE, prefix=ns + _SEP, before=bound, descending=True, fields=fields
            )
            yield page
            if len(page) < _PAGE:
                return
            bound = page[-1][0]

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread, ns = self._where(config)
        stored = checkpoint.copy()
        values: dict[str, Any] = stored.pop("channel_values")  # type: ignore[misc]
        writes: list[tuple] = []
        for channel, version in new_versions.items():
            if channel in values:
                value_type, value = self._dump_value(values[channel], writes)
            else:
                value_type, value = "empty", b""
            writes.append(("put", _CHANNEL, _key(ns, channel, str(version)), _pack({"type": value_type}, value), None))
        ctype, cbytes = self.serde.dumps_typed(stored)
        full_metadata = get_checkpoint_metadata(config, metadata)
        mtype, mbytes = self.serde.dumps_typed(full_metadata)
        header = {"parent": config["configurable"].get("checkpoint_id"), "checkpoint_type": ctype, "metadata_type": mtype}
        writes.append(("put", _CHECKPOINT, _key(ns, checkpoint["id"]), _pack(header, cbytes, mbytes), _fields(full_metadata)))
        writes.append(("put", _NAMESPACE, ns, b"", None))
        self._records.apply(thread, writes)
        return {"configurable": {"thread_id": thread, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        thread, ns = self._where(config)
        checkpoint_id = config["configurable"]["checkpoint_id"]
        records = []
        for position, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, position)
            value_type, data = self.serde.dumps_typed(value)
            # Special channels (negative index) replace; others keep their first write.
            op = "put" if idx < 0 else "insert"
            header = {"channel": channel, "type": value_type, "task_path": task_path}
            records.append((op, _WRITE, _key(ns, checkpoint_id, task_id, str(idx)), _pack(header, data), None))
        self._records.apply(thread, records)

    def delete_thread(self, thread_id: str) -> None:
        self._records.delete_namespace(str(thread_id))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source = str(source_thread_id)
        writes = [
            ("put", collection, key, value, fields)
            for collection in (_NAMESPACE, _CHECKPOINT, _CHANNEL, _ELEMENT, _WRITE)
            for key, value, fields in self._all(source, collection)
        ]
        self._records.apply(str(target_thread_id), writes)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            thread = str(thread_id)
            if strategy == "delete":
                self._records.delete_namespace(thread)
                continue
            writes: list[tuple] = []
            keep: set[str] = set()
            for ns in self._namespaces(thread):
                latest = self._records.list(thread, _CHECKPOINT, limit=1, prefix=ns + _SEP, descending=True)
                if not latest:
                    continue
                for key, _, _ in self._all(thread, _CHECKPOINT, ns + _SEP):
                    if key != latest[0][0]:
                        writes.append(("delete", _CHECKPOINT, key, None, None))
                        writes.append(("delete_prefix", _WRITE, key + _SEP, None, None))
                header, (cbytes, _) = _unpack(latest[0][1])
                versions = self.serde.loads_typed((header["checkpoint_type"], cbytes))["channel_versions"]
                keep.update(_key(ns, channel, str(version)) for channel, version in versions.items())
            used: set[str] = set()
            for key, value, _ in self._all(thread, _CHANNEL):
                if key not in keep:
                    writes.append(("delete", _CHANNEL, key, None, None))
                    continue
                header, (data,) = _unpack(value)
                if header["type"] == _ELEMENTS:
                    used.update(data.decode().split("\n"))
            for key, _, _ in self._all(thread, _ELEMENT):
                if key not in used:
                    writes.append(("delete", _ELEMENT, key, None, None))
            self._records.apply(thread, writes)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = list(dict.fromkeys(run_ids))
        if not runs:
            return
        for thread in list(self._threads()):
            writes = []
            for ns in self._namespaces(thread):
                for run in runs:
                    for key, _, _ in self._all(thread, _CHECKPOINT, ns + _SEP, _json({"run_id": run})):
                        writes.append(("delete", _CHECKPOINT, key, None, None))
                        writes.append(("delete_prefix", _WRITE, key + _SEP, None, None))
            if writes:
                self._records.apply(thread, writes)

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
        found = await asyncio.to_thread(lambda: [*self.list(config, filter=filter, before=before, limit=limit)])
        for item in found:
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
