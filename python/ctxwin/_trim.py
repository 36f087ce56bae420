"""``ctxwin.trim``: LangChain's ``trim_messages``, keyword for keyword, over ctxwin's core."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Sequence

from . import _native, _shapes
from .errors import UsageError

__all__ = ["trim"]


@functools.lru_cache(maxsize=16)
def _tokenizer(name: str) -> _native.Tokenizer:
    return _native.Tokenizer(name)


def _counter(token_counter: Any) -> tuple[Any, Any, bool]:
    """``(tokenizer, message_counter, counter_takes_message)`` for ``token_counter``."""
    if token_counter is None:
        return None, None, False
    if isinstance(token_counter, _native.Tokenizer):
        return token_counter, None, False
    if isinstance(token_counter, str):
        if token_counter in ("approximate", "estimator"):
            return None, None, False
        return _tokenizer(token_counter), None, False
    if hasattr(token_counter, "get_num_tokens_from_messages"):
        return None, token_counter.get_num_tokens_from_messages, False
    if callable(token_counter):
        return None, token_counter, _takes_message(token_counter)
    raise UsageError(
        "token_counter must be a tokenizer name, a ctxwin.Tokenizer, a callable or a chat "
        f"model, not {type(token_counter).__name__}"
    )


def _takes_message(function: Callable[..., Any]) -> bool:
    """LangChain's rule: a counter whose first parameter is annotated ``BaseMessage`` counts
    one message; any other counts a list."""
    try:
        first = next(iter(inspect.signature(function).parameters.values()))
    except (StopIteration, TypeError, ValueError):
        return False
    annotation = first.annotation
    if isinstance(annotation, str):
        return annotation.rsplit(".", 1)[-1] == "BaseMessage"
    return getattr(annotation, "__name__", None) == "BaseMessage" and getattr(
        annotation, "__module__", ""
    ).startswith("langchain_core")


def trim(
    messages: Sequence[Any] | None = None,
    *,
    max_tokens: int,
    token_counter: Any = None,
    strategy: str = "last",
    allow_partial: bool = False,
    end_on: Any = None,
    start_on: Any = None,
    include_system: bool = False,
    text_splitter: Any = None,
    format: str | None = None,
) -> Any:
    """Trim ``messages`` to ``max_tokens``: LangChain's ``trim_messages`` with the same
    keywords, but a tool call and its results are kept or dropped together.

    ``messages`` are LangChain messages, OpenAI chat-completions dicts, Anthropic Messages
    dicts or OpenAI Responses items (the Agents SDK's); the result is a list of the same
    objects (the ones kept, unchanged, in order), plus what ctxwin had to make: the result of
    a call that never got one (``ctxwin.ABORTED_RESULT``), and with ``allow_partial`` a tool
    output reduced to its first and last lines. ``format`` names the shape when the
    messages do not tell (``"langchain"``, ``"openai"``, ``"anthropic"``, ``"responses"``).
    Without ``messages``, returns a function of them (a LangChain ``Runnable`` when
    langchain-core is installed), as ``trim_messages`` does.

    ``token_counter``: ``None`` or ``"approximate"`` for ctxwin's built-in estimator (no
    tokenizer file; it errs high), an exact tokenizer by name (``"cl100k"``, ``"smollm2"``,
    the path of a ``tokenizer.json``) or a :class:`ctxwin.Tokenizer`, or a Python function
    called as LangChain calls a ``token_counter``: with one message when its first parameter
    is annotated ``BaseMessage``, else with a list holding one message (``len`` counts
    messages). ctxwin adds the counts of the messages it keeps, calling the function once per
    message it reads, newest first, never on the whole list.

    ``strategy="last"`` keeps the newest messages that fit, ``"first"`` the oldest;
    ``include_system`` keeps a system message at index 0 (``"last"`` only); ``end_on`` drops
    messages after the last one of the given types first, ``start_on`` drops kept messages
    before the first one of the given types (``"last"`` only). Types are LangChain's names
    (``"human"``, ``"ai"``, ``"system"``, ``"tool"``) or message classes.

    Where the result differs from ``trim_messages`` (each time because a call would lose its
    results or a result its call, which a provider refuses):

    * a unit (an assistant message with tool calls and their results) that does not fit is
      dropped whole; ``trim_messages`` can keep the results without their call;
    * ``start_on`` and ``end_on`` never cut inside a unit: a matching message is used only
      where the cut leaves every call with its results;
    * ``allow_partial`` reduces a tool result that does not fit to its first and last lines
      (with a ``[Data Truncated]`` marker) so that its unit fits; other messages are never
      split (``trim_messages`` splits the first message that does not fit at newlines;
      ``text_splitter`` is accepted for compatibility and not used);
    * while a unit's result is counted, room stays for each of its results still to come at
      their smallest reduced size (32 tokens; as a stateful ``Context`` keeps it, not seeing
      them yet): a unit with several results needs up to that much more than its own tokens;
    * a call that a later message leaves without a result gets ``ctxwin.ABORTED_RESULT``;
    * an orphan tool result or calls still waiting at the end raise
      :class:`ctxwin.InvalidInputError`; a system message at index 0 that alone exceeds
      ``max_tokens`` (with ``include_system``) raises :class:`ctxwin.BudgetError`.

    >>> import ctxwin
    >>> history = [
    ...     {"role": "system", "content": "You are terse."},
    ...     {"role": "user", "content": "List the files. " * 40},
    ...     {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
    ...         "function": {"name": "ls", "arguments": "{}"}}]},
    ...     {"role": "tool", "tool_call_id": "c1", "content": "Cargo.toml\\nsrc/"},
    ...     {"role": "user", "content": "Which one is the manifest?"},
    ... ]
    >>> kept = ctxwin.trim(history, max_tokens=100, include_system=True)
    >>> [m["role"] for m in kept]
    ['system', 'assistant', 'tool', 'user']
    >>> kept[1] is history[2]
    True
    >>> [m["role"] for m in ctxwin.trim(history, max_tokens=100, include_system=True, start_on="human")]
    ['system', 'user']
    """
    if messages is None:
        keywords = dict(
            max_tokens=max_tokens,
            token_counter=token_counter,
            strategy=strategy,
            allow_partial=allow_partial,
            end_on=end_on,
            start_on=start_on,
            include_system=include_system,
            text_splitter=text_splitter,
            format=format,
        )
        bound = functools.partial(trim, **keywords)
        try:
            from langchain_core.runnables import RunnableLambda
        except ImportError:
            return bound
        return RunnableLambda(bound, name="trim")
    if strategy == "first" and start_on:
        raise UsageError("start_on is only valid with strategy='last'")
    if strategy == "first" and include_system:
        raise UsageError("include_system is only valid with strategy='last'")
    if hasattr(messages, "to_messages"):  # a LangChain PromptValue
        messages = messages.to_messages()
    if not isinstance(messages, list):
        messages = list(messages)
    if not messages or max_tokens <= 0:
        return []
    shape = format or _shapes.detect(messages)
    if shape not in _shapes.SHAPES:
        raise UsageError(f"unknown format {shape!r}: use one of {', '.join(_shapes.SHAPES)}")
    tokenizer, message_counter, takes_message = _counter(token_counter)
    originals = messages
    sources = None
    if shape == "responses":
        messages, sources = _shapes.responses_as_chat(messages)
        native_shape = "openai"
    else:
        native_shape = shape
    end = None
    if end_on is not None and strategy == "last":
        end = _end_at(originals if sources is None else messages, "openai" if sources else shape, end_on)
        if end == 0:
            return []
    if message_counter is not None and sources is not None:
        message_counter = _count_items(message_counter, originals, sources, takes_message, messages)
        takes_message = True
    entries, _tokens = _native.trim(
        messages,
        native_shape,
        min(int(max_tokens), 2**32 - 1),
        tokenizer=tokenizer,
        message_counter=message_counter,
        counter_takes_message=takes_message,
        strategy=strategy,
        include_system=include_system,
        allow_partial=allow_partial,
        end=end,
    )
    if start_on is not None and strategy == "last":
        entries = _start_at(entries, messages, native_shape, start_on, include_system)
    if end_on is not None and strategy == "first":
        entries = _end_entries_at(entries, messages, native_shape, end_on)
    if sources is not None:
        return _shapes.chat_entries_as_items(originals, sources, entries)
    return _shapes.rebuild(messages, shape, entries)


def _end_at(messages: list, shape: str, end_on: Any) -> int:
    """Where ``end_on`` ends the messages: after the last matching message whose unit ends
    there (the next message is not a tool result); 0 when there is none."""
    for index in range(len(messages) - 1, -1, -1):
        if _shapes.matches(messages[index], shape, end_on) and (
            index + 1 == len(messages) or not _shapes.starts_with_result(messages[index + 1], shape)
        ):
            return index + 1
    return 0


def _entry_type(entry: tuple, messages: list, shape: str) -> tuple[Any, bool]:
    """An entry's message and whether it opens with a tool result."""
    index, blocks, _ = entry
    if index < 0:
        return None, True
    message = messages[index]
    if blocks is not None and shape == "anthropic":
        # A partial Anthropic message opens with a result when it kept one.
        return message, any(b >= 0 for b in blocks)
    return message, _shapes.starts_with_result(message, shape)


def _start_at(entries: list, messages: list, shape: str, start_on: Any, include_system: bool) -> list:
    first = 0
    if include_system and entries and entries[0][0] == 0 and len(messages) > 0:
        message = messages[0]
        if _shapes.message_type(message, shape) == "system":
            first = 1
    for position in range(first, len(entries)):
        message, opens_with_result = _entry_type(entries[position], messages, shape)
        if message is not None and not opens_with_result and _shapes.matches(message, shape, start_on):
            return entries[:first] + entries[position:]
    return entries[:first]


def _end_entries_at(entries: list, messages: list, shape: str, end_on: Any) -> list:
    for position in range(len(entries) - 1, -1, -1):
        message, _ = _entry_type(entries[position], messages, shape)
        following_is_result = position + 1 < len(entries) and _entry_type(
            entries[position + 1], messages, shape
        )[1]
        if message is not None and not following_is_result and _shapes.matches(message, shape, end_on):
            return entries[: position + 1]
    return []


def _count_items(
    counter: Callable[..., Any],
    items: list,
    sources: list[list[int]],
    takes_message: bool,
    chats: list,
) -> Callable[[Any], int]:
    """A per-chat-message counter over Responses items: the sum over the items it stands
    for."""
    index_of = {id(chat): position for position, chat in enumerate(chats)}

    def count(chat: dict) -> int:
        position = index_of.get(id(chat))
        if position is None:
            return 0
        if takes_message:
            return sum(counter(items[i]) for i in sources[position])
        return sum(counter([items[i]]) for i in sources[position])

    return count
