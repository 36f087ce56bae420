"""Message shapes: telling LangChain messages, OpenAI chat dicts, Anthropic dicts and OpenAI
Responses items (the Agents SDK's) apart, and giving a trim's result back in the caller's
shape. The native module reads the first three; Responses items are grouped here into chat
messages (a run of function calls is one assistant turn) and mapped back."""

from __future__ import annotations

import json
from typing import Any, Sequence

from . import _native
from .errors import UsageError

ABORTED_RESULT: str = _native.ABORTED_RESULT

SHAPES = ("langchain", "openai", "anthropic", "responses")

# Responses item types that are messages (a plain {"role": ..., "content": ...} dict is one too).
_RESPONSES_TYPES = ("function_call", "function_call_output", "reasoning", "item_reference")
_ANTHROPIC_BLOCKS = ("tool_use", "tool_result", "thinking", "redacted_thinking")


def detect(messages: Sequence[Any]) -> str:
    """The shape of ``messages`` from the few messages that tell (the first and up to 64
    from the end), ``"openai"`` when nothing does (plain user/assistant text reads the same
    in every dict shape)."""
    first = messages[0]
    if not isinstance(first, dict):
        if hasattr(first, "type") and hasattr(first, "content"):
            return "langchain"
        raise UsageError(
            f"messages must be LangChain messages or dicts, not {type(first).__name__}"
        )
    sample = [first, *messages[-64:]]
    for message in sample:
        if not isinstance(message, dict):
            continue
        kind = message.get("type")
        if kind in _RESPONSES_TYPES or (isinstance(kind, str) and kind.endswith("_call")):
            return "responses"
        if kind == "message" or "tool_calls" in message or message.get("role") in (
            "tool",
            "developer",
        ):
            return "responses" if kind == "message" else "openai"
        content = message.get("content")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict):
                    btype = block.get("type")
                    if btype in _ANTHROPIC_BLOCKS:
                        return "anthropic"
                    if btype in ("input_text", "output_text"):
                        return "responses"
    return "openai"


def message_type(message: Any, shape: str) -> str:
    """LangChain's type name of a message (``human``, ``ai``, ``system``, ``tool``), for
    ``start_on`` and ``end_on``."""
    if shape == "langchain":
        return message.type
    if shape == "responses":
        kind = message.get("type")
        if isinstance(kind, str) and kind.endswith("_call_output"):
            return "tool"
        if isinstance(kind, str) and (kind.endswith("_call") or kind == "reasoning"):
            return "ai"
    role = message.get("role")
    if role == "user" and shape == "anthropic" and starts_with_result(message, shape):
        return "tool"
    return {"user": "human", "assistant": "ai", "system": "system", "developer": "system"}.get(
        role, role or ""
    )


def starts_with_result(message: Any, shape: str) -> bool:
    """Whether a message is (or opens with) a tool result: cutting right before it would
    separate the result from its call."""
    if shape == "langchain":
        return message.type == "tool"
    if shape == "openai":
        return message.get("role") == "tool"
    if shape == "responses":
        kind = message.get("type")
        return isinstance(kind, str) and kind.endswith("_call_output")
    content = message.get("content")
    return (
        message.get("role") == "user"
        and isinstance(content, list)
        and bool(content)
        and isinstance(content[0], dict)
        and content[0].get("type") == "tool_result"
    )


def matches(message: Any, shape: str, types: Any) -> bool:
    """LangChain's ``_is_message_type``: a type name or message class, or a list of them."""
    if isinstance(types, (str, type)):
        types = [types]
    names = {t for t in types if isinstance(t, str)}
    classes = tuple(t for t in types if isinstance(t, type))
    if shape == "langchain":
        return message.type in names or (bool(classes) and isinstance(message, classes))
    aliases = {"user": "human", "assistant": "ai", "developer": "system"}
    names = {aliases.get(n, n) for n in names}
    return message_type(message, shape) in names


def rebuild(messages: Sequence[Any], shape: str, entries: list) -> list:
    """The caller's messages for the native trim's entries (see ``_native.trim``)."""
    out = []
    append = out.append
    for index, blocks, replaced in entries:
        if blocks is None:
            append(messages[index])
        elif index < 0:
            append(aborted_result(blocks, shape))
        else:
            append(partial(messages[index], shape, blocks, replaced))
    return out


def aborted_result(call_id: str, shape: str) -> Any:
    """The result ctxwin gives a call that never got one (the core's ``ABORTED_RESULT``)."""
    if shape == "langchain":
        from langchain_core.messages import ToolMessage

        return ToolMessage(content=ABORTED_RESULT, tool_call_id=call_id)
    if shape == "anthropic":
        block = {"type": "tool_result", "tool_use_id": call_id, "content": ABORTED_RESULT}
        return {"role": "user", "content": [block]}
    if shape == "responses":
        return {"type": "function_call_output", "call_id": call_id, "output": ABORTED_RESULT}
    return {"role": "tool", "tool_call_id": call_id, "content": ABORTED_RESULT}


def partial(message: Any, shape: str, blocks: list, replaced: dict) -> Any:
    """A copy of ``message`` with only ``blocks`` (Anthropic), contents ``replaced``."""
    if shape == "langchain":
        return message.model_copy(update={"content": replaced.get(-1, message.content)})
    if shape != "anthropic":
        return {**message, "content": replaced.get(-1, message.get("content"))}
    content = message.get("content")
    if not isinstance(content, list):
        return {**message, "content": replaced.get(-1, content)}
    kept = set(blocks)
    new = []
    for position, block in enumerate(content):
        is_result = isinstance(block, dict) and block.get("type") == "tool_result"
        if is_result and position in kept:
            if position in replaced:
                block = {**block, "content": replaced[position]}
            new.append(block)
        elif not is_result and -1 in kept:
            new.append(block)
    return {**message, "content": new}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                parts.append(json.dumps(block, default=str))
        return "\n".join(parts)
    return json.dumps(content, default=str)


def responses_as_chat(items: Sequence[Any]) -> tuple[list[dict], list[list[int]]]:
    """OpenAI Responses items (the Agents SDK's input) as chat messages, with the items each
    one stands for: an assistant message, the reasoning before it and the calls after it form
    one assistant turn; each ``*_call_output`` is a tool result."""
    chats: list[dict] = []
    sources: list[list[int]] = []
    open_turn: dict | None = None

    def close() -> None:
        nonlocal open_turn
        open_turn = None

    def turn(index: int) -> dict:
        nonlocal open_turn
        if open_turn is None:
            open_turn = {"role": "assistant", "content": "", "tool_calls": []}
            chats.append(open_turn)
            sources.append([])
        sources[-1].append(index)
        return open_turn

    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise UsageError(f"item {index} is not a dict but {type(item).__name__}")
        kind = item.get("type")
        role = item.get("role")
        if isinstance(kind, str) and kind.endswith("_call_output"):
            close()
            output = item.get("output")
            chats.append(
                {"role": "tool", "tool_call_id": item.get("call_id") or "", "content": _text(output)}
            )
            sources.append([index])
        elif isinstance(kind, str) and kind.endswith("_call") and item.get("call_id"):
            current = turn(index)
            arguments = item.get("arguments")
            if not isinstance(arguments, str):
                arguments = json.dumps(
                    {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")},
                    default=str,
                )
            current["tool_calls"].append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item.get("name") or kind, "arguments": arguments},
                }
            )
        elif kind in (None, "message") and role in ("user", "system", "developer"):
            close()
            chats.append({"role": "system" if role == "developer" else role, "content": _text(item.get("content"))})
            sources.append([index])
        else:
            # An assistant message, reasoning, or another output item: part of the turn, a new
            # turn once the current one has called tools.
            if open_turn is not None and open_turn["tool_calls"]:
                close()
            current = turn(index)
            if kind == "reasoning":
                text = _text(item.get("summary"))
            elif kind in (None, "message"):
                text = _text(item.get("content"))
            else:
                text = json.dumps(item, default=str)
            current["content"] = f"{current['content']}\n{text}" if current["content"] else text
    for chat in chats:
        if chat.get("tool_calls") == []:
            del chat["tool_calls"]
    return chats, sources


def chat_entries_as_items(
    items: Sequence[Any], sources: list[list[int]], entries: list
) -> list:
    """A trim's entries over :func:`responses_as_chat`'s messages as the original items."""
    out = []
    for index, blocks, replaced in entries:
        if index < 0:
            out.append(aborted_result(blocks, "responses"))
            continue
        for item_index in sources[index]:
            item = items[item_index]
            if blocks is not None and -1 in replaced and "output" in item:
                item = {**item, "output": replaced[-1]}
            out.append(item)
    return out
