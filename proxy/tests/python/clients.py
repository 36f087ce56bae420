"""Multi-turn tool-calling conversations through ctxwin-proxy with the official SDKs.

usage: clients.py PROXY_URL MODE   (MODE: fake | real)

fake: against the in-process fake upstream (OpenAI and Anthropic, streaming and not).
real: OpenAI client only, against a real OpenAI-compatible server (llama-server).
"""

import base64
import json
import struct
import sys

import anthropic
import openai

URL = sys.argv[1]
MODE = sys.argv[2]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a shell command and return its output",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}},
                "required": ["cmd"],
            },
        },
    }
]


def png(width, height):
    header = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)
    return base64.b64encode(header + bytes([8, 6, 0, 0, 0, 0, 0, 0, 0])).decode()


def openai_conversation(model, turns, stream, session):
    client = openai.OpenAI(
        base_url=URL + "/v1",
        api_key="sk-python-secret",
        default_headers={"x-ctxwin-session": session} if session else None,
        max_retries=0,
    )
    messages = [
        {"role": "system", "content": "You are a build agent. Call run_command when asked to run something."},
    ]
    calls = 0
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Turn {turn}: run `cargo test` and tell me the result."})
        for _ in range(3):
            kwargs = dict(model=model, messages=messages, tools=TOOLS, temperature=0.2, max_tokens=64)
            if stream:
                text, tool_calls = "", {}
                for chunk in client.chat.completions.create(stream=True, **kwargs):
                    if not chunk.choices:
                        continue
                    delta = chunk.choices[0].delta
                    text += delta.content or ""
                    for call in delta.tool_calls or []:
                        slot = tool_calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                        slot["id"] += call.id or ""
                        if call.function:
                            slot["name"] += call.function.name or ""
                            slot["arguments"] += call.function.arguments or ""
                message = {"role": "assistant", "content": text or None}
                if tool_calls:
                    message["tool_calls"] = [
                        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                        for _, c in sorted(tool_calls.items())
                    ]
            else:
                response = client.chat.completions.create(**kwargs)
                message = response.choices[0].message.model_dump(exclude_none=True)
            messages.append(message)
            if not message.get("tool_calls"):
                break
            for call in message["tool_calls"]:
                calls += 1
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"test result: ok. {turn} passed"})
    # Other paths pass through.
    models = client.models.list()
    assert len(models.data) >= 1
    return calls


def anthropic_conversation(turns, stream):
    client = anthropic.Anthropic(base_url=URL, api_key="ak-python-secret", max_retries=0)
    system = [{"type": "text", "text": "You are careful.", "cache_control": {"type": "ephemeral"}}]
    tools = [{"name": "read_file", "description": "Read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png(800, 600)}},
                {"type": "text", "text": "What is in this screenshot?", "cache_control": {"type": "ephemeral"}},
            ],
        }
    ]
    calls = 0
    for turn in range(turns):
        kwargs = dict(
            model="claude-test",
            max_tokens=2048,
            system=system,
            thinking={"type": "enabled", "budget_tokens": 1024},
            tools=tools,
            messages=messages,
        )
        if stream:
            with client.messages.stream(**kwargs) as s:
                response = s.get_final_message()
        else:
            response = client.messages.create(**kwargs)
        content = [block.model_dump(exclude_none=True) for block in response.content]
        assert content[0]["type"] == "thinking" and content[0]["signature"], content
        messages.append({"role": "assistant", "content": content})
        uses = [b for b in content if b["type"] == "tool_use"]
        if uses:
            calls += len(uses)
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": u["id"], "content": [{"type": "text", "text": "fn main() {}"}]}
                        for u in uses
                    ]
                    + [{"type": "text", "text": f"and now step {turn}", "cache_control": {"type": "ephemeral"}}],
                }
            )
        else:
            messages.append({"role": "user", "content": f"continue {turn}"})
    return calls


def openai_real_conversation(turns, stream, session):
    """Against a real server: tool calls the model makes are answered; when the server refuses
    `tools` (llama-server without --jinja), the agent's tool calls are written into the history
    by hand, so the proxy still manages call/result pairs."""
    client = openai.OpenAI(
        base_url=URL + "/v1",
        api_key="sk-local",
        default_headers={"x-ctxwin-session": session},
        max_retries=0,
    )
    messages = [{"role": "system", "content": "You are a build agent. Answer in one sentence."}]
    use_tools = True
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Turn {turn}: did the tests pass?"})
        if not use_tools:
            call_id = f"call_{session}_{turn}"
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "run_command", "arguments": json.dumps({"cmd": "cargo test"})}}]})
            messages.append({"role": "tool", "tool_call_id": call_id, "content": f"test result: ok. {turn + 40} passed; 0 failed"})
        kwargs = dict(model="smollm2", messages=messages, max_tokens=32, temperature=0)
        if use_tools:
            kwargs["tools"] = TOOLS
        try:
            if stream:
                text = "".join(
                    (chunk.choices[0].delta.content or "") for chunk in client.chat.completions.create(stream=True, **kwargs) if chunk.choices
                )
                message = {"role": "assistant", "content": text}
            else:
                message = client.chat.completions.create(**kwargs).choices[0].message.model_dump(exclude_none=True)
        except (openai.BadRequestError, openai.InternalServerError) as error:
            if not use_tools:
                raise
            print(f"server refuses tools ({error.status_code}); writing tool calls into the history instead")
            use_tools = False
            messages.pop()
            continue
        messages.append(message)
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "test result: ok"})
        if message.get("tool_calls"):
            messages.append({"role": "user", "content": "Summarize."})
    return len(messages)


def expect_error_format():
    client = openai.OpenAI(base_url=URL + "/v1", api_key="sk", max_retries=0)
    try:
        client.chat.completions.create(model="m", messages=[{"role": "tool", "content": "orphan", "tool_call_id": "nope"}])
    except openai.BadRequestError as error:
        assert error.status_code == 400, error
    else:
        raise AssertionError("an orphan tool result must be refused")


if MODE == "fake":
    assert openai_conversation("fake-model", 6, False, "py-openai") >= 6
    assert openai_conversation("fake-model", 6, True, "py-openai-stream") >= 6
    assert anthropic_conversation(6, False) >= 3
    assert anthropic_conversation(6, True) >= 3
    expect_error_format()
    print("python clients: OK")
elif MODE == "real":
    assert openai_real_conversation(6, False, "py-real") > 10
    assert openai_real_conversation(4, True, "py-real-stream") > 8
    print("python clients (real upstream): OK")
else:
    raise SystemExit(f"unknown mode {MODE}")
print(json.dumps({"done": True}))
