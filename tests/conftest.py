# ============================================================================
# Mock OpenAI upstream (tests/mock_upstream.py). One real HTTP server for the
# whole session; `upstream` hands it to a test freshly reset.
# ============================================================================
from __future__ import annotations

from collections.abc import Iterator

import pytest

from mock_upstream import MockUpstream


@pytest.fixture(scope="session")
def mock_upstream() -> Iterator[MockUpstream]:
    """Started once: binding a port and loading tiktoken per test would be slow."""
    with MockUpstream() as mock:
        yield mock


@pytest.fixture
def upstream(mock_upstream: MockUpstream) -> MockUpstream:
    """The session mock after reset(): no requests, script, failures, delays or cache."""
    mock_upstream.reset()
    return mock_upstream


# ============================================================================
# (other fixtures below)
# ============================================================================
