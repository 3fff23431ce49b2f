import json
import os
import socket
import subprocess
import time
from contextlib import contextmanager

import pytest
import requests


@pytest.fixture(scope="session")
def url():
    u = os.environ.get("LMI_TEST_URL")
    if not u:
        pytest.fail("LMI_TEST_URL is not set: these tests run from crates/server/tests/clients.rs")
    return u.rstrip("/")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def extra_server(*args, timeout=300):
    """Starts another `lmi serve` on the default model with `args` (tests that need their own
    configuration: API keys, short contexts); yields its base URL; stops it with SIGTERM."""
    binary = os.environ.get("LMI_BIN")
    if not binary:
        pytest.fail("LMI_BIN is not set: these tests run from crates/server/tests/clients.rs")
    port = _free_port()
    # The server's log goes to a file: a pipe nobody reads would fill and block the server.
    log_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"lmi-serve-{port}.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [binary, "serve", "--host", "127.0.0.1", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )

    def tail():
        with open(log_path) as f:
            return f.read()[-3000:]

    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"lmi serve {args} exited: {tail()}")
            try:
                if requests.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.time() > deadline:
                pytest.fail(f"lmi serve {args} not ready in {timeout} s")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        with open(log_path) as f:
            panics = [line for line in f if "panicked" in line]
        assert not panics, f"lmi serve panicked: {panics[:3]}"


# The embedding and scoring fixtures (tests/fixtures/embed/: tiny models written by
# sentence-transformers / transformers, with their reference.json), served by test_embeddings.py
# and test_rerank.py.
EMBED_FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "embed")
EMBED_MAX_INPUTS = 32  # option.max_client_batch_size given to those servers


def embed_reference(model):
    with open(f"{EMBED_FIXTURES}/{model}/reference.json") as f:
        return json.load(f)


def serve_embed_fixture(model, *extra):
    """`lmi serve` on tests/fixtures/embed/{model} in f32, at most EMBED_MAX_INPUTS inputs a
    request."""
    return extra_server(
        "--model", f"{EMBED_FIXTURES}/{model}", "--dtype", "fp32",
        "-o", f"option.max_client_batch_size={EMBED_MAX_INPUTS}", *extra,
    )
