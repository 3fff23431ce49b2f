"""Structured output on the default model: every schema and regex below, asked through each
wire format and client, comes back parsing and validating (jsonschema), streamed or not."""

import json
import re

import jsonschema
import pytest
import requests
from huggingface_hub import InferenceClient
from openai import OpenAI
from pydantic import BaseModel, Field
from text_generation import Client
from text_generation.types import Grammar, GrammarType

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.com$"},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "location": {
                "type": "object",
                "properties": {
                    "lat": {"type": "number", "minimum": -90, "maximum": 90},
                    "lon": {"type": "number", "minimum": -180, "maximum": 180},
                },
                "required": ["lat", "lon"],
                "additionalProperties": False,
            },
        },
        "required": ["city", "location"],
        "additionalProperties": False,
    },
    "array_enum": {
        "type": "object",
        "properties": {
            "colors": {
                "type": "array",
                "items": {"enum": ["red", "green", "blue"]},
                "minItems": 1,
                "maxItems": 3,
            },
            "mood": {"type": "string", "enum": ["happy", "sad", "neutral"]},
        },
        "required": ["colors", "mood"],
        "additionalProperties": False,
    },
    "any_of": {
        "type": "object",
        "properties": {
            "answer": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 10}, {"type": "boolean"}]},
            "note": {"type": ["string", "null"], "maxLength": 16},
        },
        "required": ["answer", "note"],
        "additionalProperties": False,
    },
    "list_of_objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 1, "maximum": 99},
                "done": {"type": "boolean"},
            },
            "required": ["id", "done"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
}

REGEXES = {
    "date": r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    "phone": r"\(\d{3}\) \d{3}-\d{4}",
    "word_list": r"[a-z]{1,8}(, [a-z]{1,8}){2}",
    "yes_no": r"(yes|no)",
}

# Enough for every schema above on the default model; a grammar that cannot finish in time
# ends with "length" (tested below), which these tests would report as a failure.
MAX_TOKENS = 200


def valid(text, schema):
    jsonschema.validate(json.loads(text), schema)
    return True


@pytest.mark.parametrize("name", SCHEMAS)
def test_tgi_grammar_json(url, name):
    schema = SCHEMAS[name]
    c = Client(url, timeout=120)
    prompt = f"Write a {name.replace('_', ' ')} as JSON:"
    r = c.generate(prompt, max_new_tokens=MAX_TOKENS, grammar=Grammar(type=GrammarType.Json, value=schema))
    assert r.details.finish_reason == "eos_token", r.generated_text
    assert valid(r.generated_text, schema)
    streamed = "".join(
        t.token.text
        for t in c.generate_stream(
            prompt, max_new_tokens=MAX_TOKENS, grammar=Grammar(type=GrammarType.Json, value=schema)
        )
        if not t.token.special
    )
    assert streamed == r.generated_text


@pytest.mark.parametrize("name", SCHEMAS)
def test_openai_json_schema(url, name):
    schema = SCHEMAS[name]
    c = OpenAI(base_url=f"{url}/v1", api_key="unused")
    msgs = [{"role": "user", "content": f"Give me a {name.replace('_', ' ')} as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    r = c.chat.completions.create(
        model="m", messages=msgs, max_tokens=MAX_TOKENS, temperature=0, response_format=fmt
    )
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop", text
    assert valid(text, schema)
    chunks = c.chat.completions.create(
        model="m", messages=msgs, max_tokens=MAX_TOKENS, temperature=0, response_format=fmt, stream=True
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text


@pytest.mark.parametrize("name", REGEXES)
def test_regexes_through_tgi_lmi_and_hf(url, name):
    rx = REGEXES[name]
    prompt = f"Example {name.replace('_', ' ')}:"
    r = requests.post(
        f"{url}/generate",
        json={"inputs": prompt, "parameters": {"max_new_tokens": 40, "grammar": {"type": "regex", "value": rx}}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    text = r.json()["generated_text"]
    assert re.fullmatch(rx, text), text
    # LMI passes vLLM's guided decoding fields.
    r = requests.post(
        f"{url}/invocations",
        json={"inputs": prompt, "parameters": {"max_new_tokens": 40, "guided_regex": rx}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["generated_text"] == text
    hf = InferenceClient(base_url=url).text_generation(
        prompt, max_new_tokens=40, grammar={"type": "regex", "value": rx}, return_full_text=False
    )
    assert hf == text


def test_hf_chat_response_format_and_lmi_guided_json(url):
    schema = SCHEMAS["person"]
    c = InferenceClient(base_url=url)
    msgs = [{"role": "user", "content": "Describe a person as JSON."}]
    r = c.chat_completion(msgs, max_tokens=MAX_TOKENS, temperature=0, response_format={"type": "json", "value": schema})
    assert valid(r.choices[0].message.content, schema)
    r = requests.post(
        f"{url}/invocations",
        json={"inputs": "A person as JSON:", "parameters": {"max_new_tokens": MAX_TOKENS, "guided_json": schema}},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert valid(r.json()["generated_text"], schema)
    r = requests.post(
        f"{url}/invocations",
        json={"inputs": "Is the sky blue?", "parameters": {"max_new_tokens": 10, "guided_choice": ["yes", "no", "maybe"]}},
        timeout=120,
    )
    assert r.json()["generated_text"] in ("yes", "no", "maybe")
    # json_object: any JSON object (unbounded, so a prompt this small model finishes on).
    r = OpenAI(base_url=f"{url}/v1", api_key="unused").chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Return a JSON object with a name and an age."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int = Field(ge=0, le=50_000_000)
    capital: bool


def test_openai_sdk_parse_with_a_pydantic_model(url):
    c = OpenAI(base_url=f"{url}/v1", api_key="unused")
    completions = getattr(c.chat.completions, "parse", None) or c.beta.chat.completions.parse
    r = completions(
        model="m",
        messages=[{"role": "user", "content": "Tell me about Paris."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format=City,
    )
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and 0 <= city.population


def test_unsatisfiable_in_budget_ends_with_length_and_bad_grammars_are_4xx(url):
    schema = {"type": "object", "properties": {"s": {"type": "string", "minLength": 100}}, "required": ["s"]}
    r = requests.post(
        f"{url}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        },
        timeout=120,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length", r.text
    for path, body, needle in [
        ("/generate", {"inputs": "x", "parameters": {"grammar": {"type": "regex", "value": "(a"}}}, "regex"),
        ("/generate", {"inputs": "x", "parameters": {"grammar": {"type": "json", "value": {"type": "strin"}}}}, "strin"),
        ("/invocations", {"inputs": "x", "parameters": {"guided_choice": []}}, "guided_choice"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
            "response_format",
        ),
    ]:
        r = requests.post(f"{url}{path}", json=body, timeout=30)
        assert 400 <= r.status_code < 500 and needle in r.text, (path, r.status_code, r.text)
