"""The openai SDK reads reasoning apart from the answer, streamed and not, from `lmi serve` on a
tiny Qwen3-style model (started by crates/server/tests/reasoning.rs, which sets LMI_TEST_URL).
The reply is shaped by a guided regex, so the split is known."""
import os

import openai
import pytest

REGEX = "<think>[a-z]{4}</think>\n\n(yes|no)"


@pytest.fixture(scope="module")
def client():
    url = os.environ.get("LMI_TEST_URL")
    if not url:
        pytest.fail("LMI_TEST_URL is not set: these tests run from crates/server/tests/reasoning.rs")
    return openai.OpenAI(base_url=url.rstrip("/") + "/v1", api_key="unused")


def ask(client, **kw):
    return client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Is it?"}],
        max_tokens=40,
        temperature=0,
        extra_body={"guided_regex": REGEX},
        **kw,
    )


def test_reasoning_content_in_a_reply(client):
    r = ask(client)
    msg = r.choices[0].message
    assert len(msg.reasoning_content) == 4 and msg.reasoning_content.isalpha()
    assert msg.content in ("yes", "no")
    # Tokens through `</think>`: the opening tag, 4 letters, the closing tag (single tokens
    # or bytes, as the model drew them), so at least 6 and at most 19.
    assert 6 <= r.usage.completion_tokens_details.reasoning_tokens <= 19


def test_reasoning_content_streamed_before_the_answer(client):
    whole = ask(client).choices[0].message
    reasoning, content, usage = "", "", None
    for chunk in ask(client, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        piece = getattr(delta, "reasoning_content", None)
        if piece:
            assert content == "", "reasoning after the answer began"
            reasoning += piece
        content += delta.content or ""
    assert (reasoning, content) == (whole.reasoning_content, whole.content)
    assert usage.completion_tokens_details.reasoning_tokens >= 6
