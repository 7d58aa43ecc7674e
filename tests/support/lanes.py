"""The two test lanes (README "Testing"): ``make test-fast`` runs what needs only the venv (no root, no
sshd, no Docker, no browser, no agent CLI); ``make test`` runs everything. A test is in the slow lane by
its directory (integration/, containers/, browser/) or its marker (``sshd``, ``docker``, ``browser``,
``root``); conftest.py marks by directory.
"""

from __future__ import annotations

import os

import pytest

#: set by ``make test-fast``: a test that starts a daemon there is missing its marker
FAST_LANE_ENV = "CROSSHOST_TEST_LANE"
#: the first directory under tests/ whose every test carries a marker
DIRECTORY_MARKERS = {"integration": "sshd", "containers": "docker", "browser": "browser"}


def refuse_in_fast_lane(what: str, marker: str) -> None:
    """Fail (never skip) a test of the fast lane that starts ``what``: it belongs to ``make test``."""
    if os.environ.get(FAST_LANE_ENV) == "fast":
        pytest.fail(f"this test starts {what}, which make test-fast never does: mark it "
                    f"@pytest.mark.{marker} (make test runs it)", pytrace=False)
