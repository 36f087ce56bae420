"""Drop-in for LangChain v1 agents: :class:`ContextWindowMiddleware` trims what each model
call sends to ``max_tokens`` with :func:`ctxwin.trim` (the system message counted and kept,
a tool call and its results kept or dropped together). The agent's state keeps the whole
history; only the request is trimmed (``wrap_model_call``), so nothing is lost and the
cut moves with the conversation.

>>> from langchain.agents import create_agent
>>> from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
>>> from langchain_core.messages import AIMessage, HumanMessage
>>> from ctxwin.langchain import ContextWindowMiddleware
>>> model = GenericFakeChatModel(messages=iter([AIMessage("Done.")]))
>>> agent = create_agent(model, system_prompt="Be brief.",
...                      middleware=[ContextWindowMiddleware(max_tokens=2_000)])
>>> history = [HumanMessage("old question " * 2_000), AIMessage("old answer"), HumanMessage("Status?")]
>>> agent.invoke({"messages": history})["messages"][-1].content
'Done.'
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse

from ._trim import trim

__all__ = ["ContextWindowMiddleware"]


class ContextWindowMiddleware(AgentMiddleware):
    """Keeps each model request within ``max_tokens``: the system message, then the newest
    messages that fit (whole tool-call units), starting at a human message when
    ``start_on`` says so (the default, as most chat models expect). ``token_counter`` is
    :func:`ctxwin.trim`'s: the built-in estimator, a tokenizer name, or a LangChain-style
    counter function. Tool definitions are not counted: leave room for them."""

    def __init__(
        self,
        max_tokens: int,
        *,
        token_counter: Any = None,
        start_on: Any = "human",
    ) -> None:
        super().__init__()
        self.max_tokens = max_tokens
        self.token_counter = token_counter
        self.start_on = start_on

    def trimmed(self, request: ModelRequest) -> ModelRequest:
        """The request with its messages trimmed."""
        system = request.system_message
        messages = [system, *request.messages] if system is not None else list(request.messages)
        if not messages:
            return request
        kept = trim(
            messages,
            max_tokens=self.max_tokens,
            token_counter=self.token_counter,
            include_system=system is not None,
            start_on=self.start_on,
            format="langchain",
        )
        if system is not None:
            kept = kept[1:]
        return request.override(messages=kept)

    def wrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], ModelResponse],
    ) -> Any:
        return handler(self.trimmed(request))

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> Any:
        return await handler(self.trimmed(request))
