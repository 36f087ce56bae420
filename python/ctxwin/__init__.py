"""ctxwin: a context-window manager for LLM agents, from Rust.

* :func:`trim`: LangChain's ``trim_messages``, keyword for keyword, that never separates a
  tool call from its results; LangChain messages, OpenAI or Anthropic dicts, Responses items.
* :class:`Context`: a conversation's managed window with an archive, search and checkpoints.
* :class:`Tokenizer`: the built-in estimator or an exact tokenizer (``cl100k``, ``smollm2``).
* Drop-ins: :mod:`ctxwin.langchain` (agent middleware), :mod:`ctxwin.agents` (OpenAI Agents
  SDK session and input filter), :mod:`ctxwin.langgraph` (checkpoint saver).

>>> import ctxwin
>>> ctxwin.Tokenizer("cl100k").count("The quick brown fox")
4
"""

from __future__ import annotations

from ._native import ABORTED_RESULT, Tokenizer
from ._trim import trim
from .context import Composed, Context
from .errors import (
    BudgetError,
    ConfigError,
    CorruptStateError,
    CtxwinError,
    InternalError,
    InvalidInputError,
    NoStateError,
    StorageError,
    UsageError,
)

__all__ = [
    "ABORTED_RESULT",
    "BudgetError",
    "Composed",
    "ConfigError",
    "Context",
    "CorruptStateError",
    "CtxwinError",
    "InternalError",
    "InvalidInputError",
    "NoStateError",
    "StorageError",
    "Tokenizer",
    "UsageError",
    "trim",
]
