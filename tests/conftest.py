"""What every test session shares: the end of the embedded stack a test started.

``pytest -n N`` runs the tests on N worker processes (scripts/test: four). The first integration
test of any worker starts the embedded stack when no running services are named
(tests/services.py, under a lock), and the others share it; only this process, the
controller, knows when every worker is done, so it stops the stack at the very end, and only
when a worker of this run started it. A lone session (``-n 0``) is its own controller.
"""

from __future__ import annotations

import os
import uuid

import pytest

from devstack.stack import DevStack

pytest_plugins = ["tests.services"]  # the real services' fixtures

RUN = "CONTEXTCORE_TEST_RUN"
"""This run's id: the workers inherit it, and the one that starts the stack writes it down."""
STARTED = "started-by-pytest"
"""The file in the stack's home that names the run that started the stack."""


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    if _controller(config):
        os.environ[RUN] = uuid.uuid4().hex


def pytest_unconfigure(config: pytest.Config) -> None:
    if not _controller(config) or os.environ.get("CONTEXTCORE_DEV_KEEP"):
        return
    stack = DevStack()
    started = stack.home / STARTED
    if started.is_file() and started.read_text() == os.environ.get(RUN):
        stack.down()
        started.unlink()
