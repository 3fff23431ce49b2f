"""Tool calling on the default model through the OpenAI SDK, huggingface_hub and raw HTTP:
forced calls (`required`, a named function) are valid calls by construction, streamed calls
equal the non-streamed ones, tool turns go back through the chat template, and bad tool
requests are 4xx that say what is wrong."""

import json

import jsonschema
import pytest
import requests
from huggingface_hub import InferenceClient
from openai import APIStatusError, OpenAI

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 20}},
            "required": ["timezone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris? Use the tools."}]


@pytest.fixture(scope="module")
def oai(url):
    return OpenAI(base_url=f"{url}/v1", api_key="none")


def check_calls(calls, names=None):
    assert calls, "expected at least one tool call"
    for c in calls:
        assert c.type == "function"
        assert c.id.startswith("call_") and len(c.id) == 29
        assert c.function.name in SCHEMAS
        if names is not None:
            assert c.function.name in names
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])


def test_named_function_is_forced(oai):
    r = oai.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=64,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    check_calls(choice.message.tool_calls, names={"get_time"})
    assert len(choice.message.tool_calls) == 1


@pytest.mark.parametrize("parallel", [True, False])
def test_required_gives_valid_calls(oai, parallel):
    r = oai.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=parallel,
        max_tokens=96,
        temperature=0,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    check_calls(choice.message.tool_calls)
    if not parallel:
        assert len(choice.message.tool_calls) == 1


def test_sampled_required_calls_validate(oai):
    r = oai.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=96,
        temperature=1.0,
        seed=7,
        n=3,
    )
    assert len(r.choices) == 3
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls"
        check_calls(choice.message.tool_calls)


def collect_stream(stream):
    """The calls and content a stream carries, assembled the way OpenAI clients do."""
    calls, content, finish = {}, "", None
    for chunk in stream:
        for ch in chunk.choices:
            if ch.delta.content:
                content += ch.delta.content
            for tc in ch.delta.tool_calls or []:
                c = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    c["id"] = tc.id
                if tc.function.name:
                    c["name"] += tc.function.name
                if tc.function.arguments:
                    c["arguments"] += tc.function.arguments
            if ch.finish_reason:
                finish = ch.finish_reason
    return [calls[i] for i in sorted(calls)], content, finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_calls_equal_non_streamed(oai, choice):
    args = dict(model="m", messages=ASK, tools=TOOLS, tool_choice=choice, max_tokens=96, temperature=0)
    whole = oai.chat.completions.create(**args).choices[0]
    calls, content, finish = collect_stream(oai.chat.completions.create(stream=True, **args))
    assert finish == whole.finish_reason == "tool_calls"
    assert content == ""
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls
    ]
    assert all(c["id"].startswith("call_") for c in calls)


def test_auto_stream_matches_non_stream(oai):
    # Whatever the model decides under `auto`, streaming reads it the same way.
    args = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=64, temperature=0)
    whole = oai.chat.completions.create(**args).choices[0]
    calls, content, finish = collect_stream(oai.chat.completions.create(stream=True, **args))
    assert finish == whole.finish_reason
    assert content == (whole.message.content or "")
    got = [(c["name"], c["arguments"]) for c in calls]
    want = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    assert got == want
    if whole.message.tool_calls:
        assert whole.finish_reason == "tool_calls"
        check_calls(whole.message.tool_calls)


def test_tool_choice_none_is_plain_chat(oai):
    r = oai.chat.completions.create(
        model="m", messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=16, temperature=0
    )
    plain = oai.chat.completions.create(model="m", messages=ASK, max_tokens=16, temperature=0)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == plain.choices[0].message.content


def test_tool_results_go_back_through_the_template(oai):
    first = oai.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=64,
        temperature=0,
    )
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'},
    ]
    r = oai.chat.completions.create(
        model="m", messages=history, tools=TOOLS, tool_choice="none", max_tokens=24, temperature=0
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.choices[0].message.content
    # The tool turn is in the prompt: it costs tokens beyond the question alone.
    alone = oai.chat.completions.create(model="m", messages=ASK, max_tokens=1)
    assert r.usage.prompt_tokens > alone.usage.prompt_tokens + 10


def test_huggingface_hub_chat_tools(url):
    client = InferenceClient(base_url=url)
    r = client.chat_completion(
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=96,
        temperature=0,
    )
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason == "tool_calls"
    for c in calls:
        args = c.function.arguments
        args = json.loads(args) if isinstance(args, str) else args
        jsonschema.validate(args, SCHEMAS[c.function.name])


def test_lmi_messages_with_tools(url):
    body = {
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 64,
    }
    r = requests.post(f"{url}/invocations", json=body, timeout=120)
    assert r.status_code == 200, r.text
    call = r.json()["choices"][0]["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS["get_weather"])


@pytest.mark.parametrize(
    "patch, needle",
    [
        ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "name"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": "get_weather"}, "tools"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "wat"}}}],
             "tool_choice": "required"},
            "schema",
        ),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ],
)
def test_bad_tool_requests_are_4xx(url, patch, needle):
    body = {"model": "m", "messages": ASK, "tools": TOOLS, "max_tokens": 8}
    body.update(patch)
    r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert 400 <= r.status_code < 500, r.text
    err = r.json()
    assert needle in json.dumps(err), err


def test_openai_sdk_raises_on_unknown_function(oai):
    # 422 with TGI's error body, as TGI's OpenAI route answers.
    with pytest.raises(APIStatusError) as e:
        oai.chat.completions.create(
            model="m",
            messages=ASK,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "missing"}},
        )
    assert 400 <= e.value.status_code < 500
    assert "missing" in e.value.response.text
