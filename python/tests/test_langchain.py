"""ctxwin.langchain.ContextWindowMiddleware in a real LangChain v1 agent (create_agent):
the model sees the system message and the newest whole units within the budget; the
agent's state keeps everything."""

from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

import ctxwin
from ctxwin.langchain import ContextWindowMiddleware


class RecordingModel(BaseChatModel):
    """Answers from a script and records every request's messages."""

    script: list[AIMessage]
    seen: list[list[BaseMessage]] = []

    @property
    def _llm_type(self) -> str:
        return "recording"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "RecordingModel":
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        self.seen.append(list(messages))
        return ChatResult(generations=[ChatGeneration(message=self.script.pop(0))])


@tool
def disk_usage(path: str) -> str:
    """Disk usage of a path."""
    return "Filesystem 91% used " + "x" * 800


def test_each_model_call_gets_the_window_and_the_state_keeps_everything():
    model = RecordingModel(
        script=[
            AIMessage("", tool_calls=[{"id": "c1", "name": "disk_usage", "args": {"path": "/"}}]),
            AIMessage("The disk is 91% full."),
        ],
        seen=[],
    )
    budget = 400
    agent = create_agent(
        model,
        tools=[disk_usage],
        system_prompt="You are an ops assistant.",
        middleware=[ContextWindowMiddleware(max_tokens=budget)],
    )
    history = []
    for n in range(20):
        history += [HumanMessage(f"old question {n}: " + "please check the deployment logs again " * 10), AIMessage(f"old answer {n}")]
    result = agent.invoke({"messages": history + [HumanMessage("How full is the disk?")]})
    assert result["messages"][-1].content == "The disk is 91% full."
    assert len(result["messages"]) == len(history) + 4
    first, second = model.seen
    assert first[0].type == "system" and first[1].type == "human"
    assert first[-1].content == "How full is the disk?" and len(first) < 10
    # The second call: the tool unit is newest; the question before it still fits.
    types = [m.type for m in second]
    assert types[0] == "system" and types[-2:] == ["ai", "tool"]
    assert ctxwin.trim(second, max_tokens=budget, include_system=True) == second
