"""Exceptions, one class per exit-code category of the ``ctxwin`` command line.

Every error ctxwin raises is a :class:`CtxwinError`; its class says what kind of problem it
is, and ``exit_code`` is the code ``ctxwin`` (the CLI) exits with for the same problem:

========================  ====  =====================================================
class                     code  meaning
========================  ====  =====================================================
:class:`InternalError`    1     a bug in ctxwin
:class:`UsageError`       2     wrong use of the API (an unknown argument value)
:class:`InvalidInputError` 3    a message that does not parse or that the context refuses
:class:`StorageError`     4     a file or the state directory cannot be read or written
:class:`BudgetError`      5     what must stay in the context does not fit the budget
:class:`CorruptStateError` 6    damaged checkpoints or archive (reported, never reset)
:class:`NoStateError`     7     nothing to restore where state was expected
:class:`ConfigError`      8     an invalid setting, tokenizer or store
========================  ====  =====================================================

The classes also derive from the built-in exception a Python caller would catch for the
same problem (``ValueError``, ``OSError``, ...):

>>> import ctxwin
>>> issubclass(ctxwin.InvalidInputError, ValueError), ctxwin.BudgetError.exit_code
(True, 5)
>>> try:
...     ctxwin.trim([{"role": "tool", "tool_call_id": "c1", "content": "42"}], max_tokens=100)
... except ctxwin.InvalidInputError as error:
...     print(error.exit_code, error)
3 message 0: the tool result answers no pending tool call; put the assistant message with the call before it
"""

from __future__ import annotations

__all__ = [
    "CtxwinError",
    "InternalError",
    "UsageError",
    "InvalidInputError",
    "StorageError",
    "BudgetError",
    "CorruptStateError",
    "NoStateError",
    "ConfigError",
]


class CtxwinError(Exception):
    """Base class of every ctxwin error."""

    exit_code: int = 1


class InternalError(CtxwinError, RuntimeError):
    """A bug in ctxwin (exit code 1): please report it."""

    exit_code = 1


class UsageError(CtxwinError, ValueError):
    """Wrong use of the API, such as an unknown argument value (exit code 2)."""

    exit_code = 2


class InvalidInputError(CtxwinError, ValueError):
    """A message that does not parse or that the context refuses (exit code 3): an orphan
    tool result, a tool call without an id, calls still waiting for results."""

    exit_code = 3


class StorageError(CtxwinError, OSError):
    """A file or the state directory cannot be read or written (exit code 4)."""

    exit_code = 4


class BudgetError(CtxwinError, ValueError):
    """What must stay in the context (the system prompt, the newest message that is locked)
    does not fit the token budget (exit code 5)."""

    exit_code = 5


class CorruptStateError(CtxwinError):
    """Damaged checkpoints or archive (exit code 6); ctxwin reports it and never resets."""

    exit_code = 6


class NoStateError(CtxwinError, LookupError):
    """No checkpoint to restore where one was asked for (exit code 7)."""

    exit_code = 7


class ConfigError(CtxwinError, ValueError):
    """An invalid setting, tokenizer or store (exit code 8)."""

    exit_code = 8
