"""Anthropic's Messages API through the anthropic SDK: `messages.create`, `messages.stream`
(text, and a tool call), a tool round trip, `count_tokens`, stop sequences, and bad requests
that get Anthropic's 4xx shape while the server keeps serving. Greedy replies are compared with
/v1/chat/completions on the same conversation: both run the same generation path."""

import json

import anthropic
import jsonschema
import pytest
import requests
from openai import OpenAI

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "input_schema": WEATHER_SCHEMA,
}
ASK = [{"role": "user", "content": "Name a fruit."}]
# The anthropic SDK 2.x sends no sampling fields of its own; older clients do, and the server
# reads them (temperature in [0, 1], top_p, top_k).
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def claude(url):
    return anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def oai(url):
    return OpenAI(base_url=f"{url}/v1", api_key="none")


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


def test_create_matches_chat_completions(claude, oai):
    m = claude.messages.create(
        model="m", system="You are terse.", messages=ASK, max_tokens=12, **GREEDY
    )
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.content[0].type == "text"
    assert m.stop_reason in ("end_turn", "max_tokens")
    c = oai.chat.completions.create(
        model="m",
        messages=[{"role": "system", "content": "You are terse."}, *ASK],
        max_tokens=12,
        **GREEDY,
    )
    assert text_of(m) == c.choices[0].message.content
    assert m.usage.input_tokens == c.usage.prompt_tokens
    assert m.usage.output_tokens == c.usage.completion_tokens
    assert (m.stop_reason == "max_tokens") == (c.choices[0].finish_reason == "length")
    count = claude.messages.count_tokens(model="m", system="You are terse.", messages=ASK)
    assert count.input_tokens == m.usage.input_tokens


def test_stream_text(claude):
    whole = claude.messages.create(model="m", messages=ASK, max_tokens=10, **GREEDY)
    with claude.messages.stream(model="m", messages=ASK, max_tokens=10, **GREEDY) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == text_of(whole) == text_of(final)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_stream_tool_call_and_round_trip(claude):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    with claude.messages.stream(
        model="m",
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        max_tokens=40,
        **GREEDY,
    ) as s:
        events = list(s)
        final = s.get_final_message()
    kinds = [e.type for e in events]
    assert "content_block_start" in kinds and "message_stop" == kinds[-1]
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert any(d.delta.type == "input_json_delta" for d in deltas)
    assert final.stop_reason == "tool_use"
    use = [b for b in final.content if b.type == "tool_use"]
    assert len(use) == 1 and use[0].name == "get_weather" and use[0].id.startswith("toolu_")
    jsonschema.validate(use[0].input, WEATHER_SCHEMA)
    whole = claude.messages.create(
        model="m",
        messages=ask,
        tools=[WEATHER],
        tool_choice={"type": "tool", "name": "get_weather"},
        max_tokens=40,
        **GREEDY,
    )
    assert [b.input for b in whole.content if b.type == "tool_use"] == [use[0].input]
    # The result goes back as a tool_result block; the model answers in text.
    reply = claude.messages.create(
        model="m",
        messages=[
            *ask,
            {"role": "assistant", "content": [b.model_dump() for b in final.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": "Sunny, 21 C"}],
            },
        ],
        tools=[WEATHER],
        max_tokens=16,
        **GREEDY,
    )
    assert reply.content and reply.usage.input_tokens > whole.usage.input_tokens


def test_stop_sequences_name_the_one_that_matched(claude):
    whole = claude.messages.create(model="m", messages=ASK, max_tokens=24, **GREEDY)
    text = text_of(whole)
    words = text.split()
    assert len(words) >= 3, text
    stop = " " + words[2]
    cut = text[: text.index(stop)]
    m = claude.messages.create(
        model="m", messages=ASK, max_tokens=24, **GREEDY, stop_sequences=["zzzz", stop]
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert text_of(m) == cut
    with claude.messages.stream(
        model="m", messages=ASK, max_tokens=24, **GREEDY, stop_sequences=[stop]
    ) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == cut
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == stop


def test_thinking_is_accepted(claude):
    m = claude.messages.create(
        model="m",
        messages=ASK,
        max_tokens=4,
        thinking={"type": "enabled", "budget_tokens": 1024},
    )
    assert m.content


def test_bad_requests_get_anthropic_errors_and_the_server_keeps_serving(url, claude):
    msgs = [{"role": "user", "content": "hi"}]
    for body, needle in [
        ({"messages": msgs}, "max_tokens"),
        ({"max_tokens": 4, "messages": []}, "messages"),
        ({"max_tokens": 4, "messages": msgs, "temperature": 1.5}, "temperature"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
         "image"),
        ({"max_tokens": 4, "messages": msgs, "tools": [{"name": "a b", "input_schema": {}}]}, "tools[0].name"),
        ({"max_tokens": 4, "messages": msgs, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ]:
        r = requests.post(f"{url}/v1/messages", json=body, timeout=60)
        assert r.status_code == 400, (body, r.text)
        j = r.json()
        assert j["type"] == "error" and j["error"]["type"] == "invalid_request_error", j
        assert needle in j["error"]["message"], (needle, j)
    r = requests.post(f"{url}/v1/messages", data=b"{not json", timeout=60)
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = requests.post(f"{url}/v1/messages/count_tokens", json={"messages": 3}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model="m", messages=msgs, max_tokens=0)
    ok = claude.messages.create(model="m", messages=msgs, max_tokens=2)
    assert ok.content
