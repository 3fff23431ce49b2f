"""OpenAI's Responses API through the openai SDK: `responses.create`, `responses.stream`,
`responses.parse` (a pydantic model through `text.format`), a function-tool round trip, a
conversation continued by `previous_response_id`, retrieve / delete, and bad requests that get
OpenAI's 4xx shape while the server keeps serving. Greedy replies are compared with
/v1/chat/completions on the same conversation: both run the same generation path."""

import json

import jsonschema
import pytest
import requests
from openai import BadRequestError, NotFoundError, OpenAI
from pydantic import BaseModel, Field

WEATHER_PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": WEATHER_PARAMS,
}


class City(BaseModel):
    name: str = Field(max_length=20)
    country: str = Field(max_length=20)


@pytest.fixture(scope="module")
def oai(url):
    return OpenAI(base_url=f"{url}/v1", api_key="none")


def chat_text(oai, messages, max_tokens):
    r = oai.chat.completions.create(
        model="m", messages=messages, max_tokens=max_tokens, temperature=0
    )
    return r.choices[0].message.content, r.usage.prompt_tokens


def test_create_matches_chat_completions(oai):
    r = oai.responses.create(
        model="m",
        instructions="You are terse.",
        input="Name a color.",
        max_output_tokens=12,
        temperature=0,
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete")
    assert r.output[0].type == "message" and r.output[0].role == "assistant"
    text, prompt_tokens = chat_text(
        oai,
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a color."},
        ],
        12,
    )
    assert r.output_text == text
    assert r.usage.input_tokens == prompt_tokens
    assert 0 < r.usage.output_tokens <= 12
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    if r.status == "incomplete":
        assert r.incomplete_details.reason == "max_output_tokens"


def test_stream_is_the_typed_event_sequence(oai):
    kwargs = dict(model="m", input="Name a fruit.", max_output_tokens=10, temperature=0)
    whole = oai.responses.create(**kwargs)
    with oai.responses.stream(**kwargs) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if whole.status == "completed" else "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_parse_fills_a_pydantic_model(oai):
    r = oai.responses.parse(
        model="m",
        input="Paris is a city in France. Give the city and its country as JSON.",
        text_format=City,
        max_output_tokens=60,
        temperature=0,
    )
    assert r.status == "completed"
    city = r.output_parsed
    assert isinstance(city, City)
    assert 0 < len(city.name) <= 20 and 0 < len(city.country) <= 20
    assert json.loads(r.output_text) == city.model_dump()


def test_parse_streamed(oai):
    with oai.responses.stream(
        model="m",
        input="Rome is in Italy. Give the city and its country as JSON.",
        text_format=City,
        max_output_tokens=60,
        temperature=0,
    ) as stream:
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, City)


def test_function_tool_round_trip(oai):
    first = oai.responses.create(
        model="m",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
        temperature=0,
    )
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1, first.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMS)
    # The tool's output goes back by id; the model answers in text.
    second = oai.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
        ],
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=16,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    assert second.output[0].type == "message" and second.output_text
    # The whole conversation was the prompt: the same as chat completions given it whole.
    _, prompt_tokens = chat_text(
        oai,
        [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 21 C"},
        ],
        1,
    )
    assert second.usage.input_tokens == prompt_tokens


def test_streamed_function_call(oai):
    with oai.responses.stream(
        model="m",
        input="What is the weather in Rome?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=40,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    call = final.output[-1]
    assert call.type == "function_call" and call.name == "get_weather"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert args == call.arguments
    jsonschema.validate(json.loads(args), WEATHER_PARAMS)


def test_continuation_retrieve_and_delete(oai):
    first = oai.responses.create(
        model="m", input="My name is Ada.", max_output_tokens=8, temperature=0
    )
    second = oai.responses.create(
        model="m",
        previous_response_id=first.id,
        input="What is my name?",
        max_output_tokens=8,
        temperature=0,
    )
    text, prompt_tokens = chat_text(
        oai,
        [
            {"role": "user", "content": "My name is Ada."},
            {"role": "assistant", "content": first.output_text.strip()},
            {"role": "user", "content": "What is my name?"},
        ],
        8,
    )
    assert second.usage.input_tokens == prompt_tokens
    assert second.output_text == text
    got = oai.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    oai.responses.delete(first.id)
    with pytest.raises(NotFoundError):
        oai.responses.retrieve(first.id)
    with pytest.raises(NotFoundError):
        oai.responses.create(model="m", previous_response_id=first.id, input="Hi", max_output_tokens=2)
    # store: false keeps nothing.
    unstored = oai.responses.create(model="m", input="Hi", store=False, max_output_tokens=2)
    with pytest.raises(NotFoundError):
        oai.responses.retrieve(unstored.id)


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(url, oai):
    for body, param in [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "temperature": 5}, "temperature"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
         "input[0].content[0]"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ]:
        r = requests.post(f"{url}/v1/responses", json=body, timeout=60)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["param"] == param, (body, err)
        assert err["message"]
    r = requests.post(f"{url}/v1/responses", data=b"{not json", timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"]
    r = requests.get(f"{url}/v1/responses/resp_nope", timeout=60)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    with pytest.raises(BadRequestError):
        oai.responses.create(model="m", input=[{"type": "nope"}])
    ok = oai.responses.create(model="m", input="Hi", max_output_tokens=2)
    assert ok.output_text
