import os

import pytest


@pytest.fixture(scope="session")
def url():
    u = os.environ.get("LMI_TEST_URL")
    if not u:
        pytest.fail("LMI_TEST_URL is not set: these tests run from crates/server/tests/clients.rs")
    return u.rstrip("/")
