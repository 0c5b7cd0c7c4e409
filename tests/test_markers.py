"""Tests that start a server or a process through a fixture are marked for it automatically."""

from __future__ import annotations

import pytest

from healer.bus import embedded


def test_a_test_that_starts_nats_through_a_fixture_is_marked(
    nats_server: embedded.EmbeddedServer, request: pytest.FixtureRequest
) -> None:
    assert request.node.get_closest_marker("nats") is not None


def test_a_test_that_starts_nothing_is_not_marked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("nats") is None


async def test_an_async_test_is_checked_for_leaked_tasks(request: pytest.FixtureRequest) -> None:
    assert "_no_task_leaks" in request.fixturenames
