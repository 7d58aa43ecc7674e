"""A real single-node Slurm cluster (tools/slurmcluster.py) for the tests that submit job arrays.

When the daemons cannot start (Debian's slurmctld, slurmd, slurm-client or munge missing), the test
FAILS with the reason: ``make setup`` installs them, and integration tests are never skipped.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.lanes import refuse_in_fast_lane
from tools.slurmcluster import SlurmCluster, SlurmError

#: outside /tmp: the sshd test hosts bind their own /tmp over it, and the jobs' files are read there
STATE_PARENT = "/var/tmp"


@contextmanager
def slurm_cluster(*, cpus: int = 4) -> Iterator[SlurmCluster]:
    refuse_in_fast_lane("a Slurm cluster (munged, slurmctld and slurmd as root)", "root")
    state = Path(tempfile.mkdtemp(prefix="crosshost-slurm-", dir=STATE_PARENT))
    cluster = SlurmCluster(state)
    try:
        try:
            cluster.up(cpus=cpus)
        except SlurmError as exc:
            pytest.fail(f"cannot start the Slurm test cluster: {exc}", pytrace=False)
        yield cluster
    finally:
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)
