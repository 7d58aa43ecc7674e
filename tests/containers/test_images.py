"""The test images: built offline once and reused, and different the way real images are."""

from __future__ import annotations

from tests.support.docker import DockerDaemon
from tools import testdocker


def _in(daemon: DockerDaemon, image: str, script: str) -> str:
    res = daemon.docker("run", "--rm", "--network", "none", image, "sh", "-c", script)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_the_two_images_differ_in_locale_time_zone_and_files(docker_daemon: DockerDaemon) -> None:
    facts = "printf 'é' | wc -m; date +%Z; cat /etc/crosshost-image.conf; if test -e /opt/crosshost-demo/feature.flag; then echo flag; fi"
    utf8 = _in(docker_daemon, docker_daemon.images["py-utf8"], facts).split()
    posix = _in(docker_daemon, docker_daemon.images["py-posix"], facts).split()
    assert utf8 == ["1", "UTC", "channel=stable"]  # one character in C.UTF-8
    assert posix[:3] == ["2", "EST", "channel=beta"] or posix[:3] == ["2", "EDT", "channel=beta"]  # two bytes in POSIX
    assert posix[3] == "flag"


def test_the_images_have_what_the_runner_needs(docker_daemon: DockerDaemon) -> None:
    out = _in(
        docker_daemon,
        docker_daemon.images["py-utf8"],
        "python3 -c 'import sys, json, tarfile, zipfile, hashlib; print(sys.version_info[0])' && timeout 1 true "
        "&& tar --version >/dev/null && mktemp -d && grep -c '^Package: python3$' /var/lib/dpkg/status",
    )
    assert out.splitlines()[0] == "3"
    assert out.splitlines()[1].startswith("/tmp/")
    assert out.splitlines()[2] == "1"  # the image says which packages it has, as a Debian image does


def test_a_second_build_reuses_the_images(docker_daemon: DockerDaemon) -> None:
    ids = {n: docker_daemon.docker("image", "inspect", "-f", "{{.Id}}", ref).stdout for n, ref in docker_daemon.images.items()}
    again = testdocker.build_images()
    assert again == docker_daemon.images
    # the same image ids: nothing was assembled or imported again
    assert {n: docker_daemon.docker("image", "inspect", "-f", "{{.Id}}", ref).stdout for n, ref in again.items()} == ids
