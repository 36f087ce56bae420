"""Type stubs of the Rust module under ``ctxwin`` (python/src/)."""

from typing import Any, Callable, Optional

ABORTED_RESULT: str

class Tokenizer:
    """A token counter: ``"estimator"`` (built in), ``"cl100k"``, ``"smollm2"`` or the path of a
    Hugging Face ``tokenizer.json``."""

    def __init__(self, name: str = "estimator") -> None: ...
    def count(self, text: str) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...

def trim(
    messages: list[Any],
    shape: str,
    max_tokens: int,
    *,
    tokenizer: Optional[Tokenizer] = None,
    message_counter: Optional[Callable[[Any], Any]] = None,
    counter_takes_message: bool = False,
    strategy: str = "last",
    include_system: bool = False,
    allow_partial: bool = False,
    end: Optional[int] = None,
) -> tuple[list[tuple[int, Any, Optional[dict[int, str]]]], int]: ...

class Context:
    def __init__(
        self,
        name: str,
        store: str,
        *,
        config: Optional[str] = None,
        tokenizer: Optional[Tokenizer] = None,
        checkpoint_every: Optional[int] = None,
        tenant: Optional[str] = None,
    ) -> None: ...
    @property
    def name(self) -> str: ...
    def push_messages(self, messages: list[Any], shape: str) -> list[int]: ...
    def add_tool(self, name: str, description: str, parameters: str) -> int: ...
    def abort_pending_calls(self) -> None: ...
    def compose(
        self, format: str, dynamic: list[str], query: Optional[str] = None
    ) -> tuple[str, int, int, int, list[int]]: ...
    def stats(self) -> str: ...
    def checkpoint(self) -> str: ...
    def checkpoints(self) -> list[str]: ...
    def restore(self, id: Optional[str] = None) -> str: ...
    def search(self, query: str, limit: int) -> list[dict[str, Any]]: ...
    def forget(
        self, id: Optional[int] = None, text: Optional[str] = None
    ) -> tuple[list[int], bool, int]: ...

class ItemLog:
    """Items by conversation, oldest first, through the archive port of a store (a state
    directory, a ``postgres://`` URL, or ``":memory:"``)."""

    def __init__(self, store: str, *, tenant: str = "") -> None: ...
    def add(self, conversation: str, items: list[str]) -> None: ...
    def items(self, conversation: str) -> list[str]: ...
    def pop(self, conversation: str) -> Optional[str]: ...
    def clear(self, conversation: str) -> None: ...

class Records:
    """Keyed records of a tenant's namespaces through the record port of a store (a state
    directory's ``archive.db``, a ``postgres://`` URL, or ``":memory:"``). A record is
    ``(key, value, fields)``: ``fields`` the JSON text of an object, or ``None``."""

    def __init__(self, store: str, *, tenant: str = "") -> None: ...
    def apply(
        self,
        namespace: str,
        writes: list[tuple[str, str, str, Optional[bytes], Optional[str]]],
    ) -> None: ...
    def get(
        self, namespace: str, collection: str, keys: list[str]
    ) -> list[tuple[str, bytes, Optional[str]]]: ...
    def list(
        self,
        namespace: str,
        collection: str,
        *,
        limit: int,
        prefix: str = "",
        after: Optional[str] = None,
        before: Optional[str] = None,
        descending: bool = False,
        fields: Optional[str] = None,
    ) -> list[tuple[str, bytes, Optional[str]]]: ...
    def delete_namespace(self, namespace: str) -> int: ...
    def namespaces(self, *, limit: int, after: Optional[str] = None) -> list[str]: ...
