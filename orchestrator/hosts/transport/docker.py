"""DockerHost: a container as a host, reached with ``docker exec -i`` (a ``CommandHost``).

``image = "…"``: a container is started from the image when the host is opened (``--network none``
unless the inventory says otherwise; the model proxy is reached through the exec relay, not a
network) and removed when it is closed, whatever happened (a normal end, a timeout, Ctrl-C, a
failure). An image missing from the daemon is pulled first, within ``pull_timeout_s``.
``container = "…"``: an existing, running container; left running. ``docker_host`` is the daemon
(``-H``: ``unix://…``, ``tcp://…``, ``ssh://user@host``), else the docker CLI's own default.

``facts()`` says what the container is (the image's id and digests, the daemon's version, runtime,
storage and cgroup driver): the run records them beside the runner's fingerprint. A container that
stops under a run (killed, out of memory) is that host's failure, not a command's exit code.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess

from orchestrator.errors import HostUnreachable
from orchestrator.hosts.inventory import HostConfig
from orchestrator.hosts.transport.base import ContainerFacts
from orchestrator.hosts.transport.command import CommandHost, tool_env

#: docker CLI calls of the lifecycle (inspect, run, rm); a pull has its own bound (pull_timeout_s)
DOCKER_CALL_TIMEOUT_S = 60.0
#: the label every container crosshost starts carries (its value: the inventory name)
LABEL = "crosshost.host"


def _unreachable(name: str, message: str) -> HostUnreachable:
    exc = HostUnreachable(name, message)
    exc.transient = False  # a daemon's "no such container" is not helped by asking again
    return exc


class DockerHost(CommandHost):
    kind = "docker"

    def __init__(self, cfg: HostConfig) -> None:
        self.docker = ["docker", *(["-H", cfg.docker_host] if cfg.docker_host else [])]
        self.cfg = cfg
        self.started: str | None = None  # the container this host started (and removes)
        self.removed: bool | None = None
        name = cfg.name
        if cfg.image:
            container = self._start(cfg.image)
        else:
            assert cfg.container is not None
            container = cfg.container
            state = self._inspect_state(container)
            if state != "running":
                raise _unreachable(name, f"container {container!r} is {state} (docker start {container}, or fix 'container')")
        self.container = container
        super().__init__(name, [*self.docker, "exec", "-i", container], python=cfg.python, connect_timeout_s=cfg.connect_timeout_s)

    # -- the daemon --------------------------------------------------------------------------------
    def _docker(self, *args: str, timeout: float = DOCKER_CALL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [*self.docker, *args], capture_output=True, text=True, timeout=timeout,
                stdin=subprocess.DEVNULL, check=False, start_new_session=True, env=tool_env(),
            )  # fmt: skip
        except FileNotFoundError as exc:
            raise _unreachable(self.cfg.name, "the docker CLI is not installed on the controller (apt-get install docker.io)") from exc
        except subprocess.TimeoutExpired as exc:
            raise _unreachable(self.cfg.name, f"docker {args[0]}: no answer from the daemon in {timeout:g}s") from exc

    def _said(self, res: subprocess.CompletedProcess[str]) -> str:
        return " ".join((res.stderr or res.stdout).split())[-300:] or f"exit {res.returncode}"

    def _inspect_state(self, container: str) -> str:
        res = self._docker("inspect", "--type", "container", "-f", "{{.State.Status}}", container)
        if res.returncode != 0:
            said = self._said(res)
            if "No such" in said:
                return "missing"
            raise _unreachable(self.cfg.name, f"docker inspect {container}: {said}")
        return res.stdout.strip() or "unknown"

    def _start(self, image: str) -> str:
        name = self.cfg.name
        if self._docker("image", "inspect", image).returncode != 0:
            pulled = None
            try:
                pulled = self._docker("pull", "-q", image, timeout=self.cfg.pull_timeout_s)
            except HostUnreachable as exc:
                raise _unreachable(name, f"image {image!r} is not on the daemon and pulling it took more than pull_timeout_s = {self.cfg.pull_timeout_s:g}s") from exc
            if pulled.returncode != 0:
                raise _unreachable(name, f"image {image!r} is not on the daemon and cannot be pulled: {self._said(pulled)}")
        container = f"crosshost-{name}-{secrets.token_hex(4)}"
        argv = [
            # the inventory name as its hostname: a fresh container's id would make every run's
            # fingerprint a new one for the same image
            # no --rm: the daemon's own removal would race ours (`rm -f` answers "removal in progress"
            # and the container is still listed); ours is synchronous and covers a container that died
            "run", "-d", "--pull", "never", "--name", container, "--label", f"{LABEL}={name}",
            "--hostname", name.replace("_", "-"),
            "--network", self.cfg.network, "--entrypoint", "sleep", image, "infinity",
        ]  # fmt: skip
        res = self._docker(*argv)
        if res.returncode != 0:
            self._remove(container)
            raise _unreachable(name, f"cannot start a container from {image!r}: {self._said(res)}")
        self.started = container
        return container

    def _remove(self, container: str) -> bool:
        with contextlib.suppress(HostUnreachable):
            res = self._docker("rm", "-f", "-v", container)
            return res.returncode == 0 or "No such container" in res.stderr or self._inspect_state(container) == "missing"
        return False

    # -- what the container is -----------------------------------------------------------------------
    def facts(self) -> ContainerFacts:
        facts = ContainerFacts(transport="docker", container=self.container, started=self.started is not None)
        res = self._docker("inspect", "--type", "container", "-f", "{{json .}}", self.container)
        if res.returncode == 0:
            with contextlib.suppress(ValueError, AttributeError):
                info = json.loads(res.stdout)
                facts["image"] = info.get("Config", {}).get("Image")
                facts["image_id"] = info.get("Image")
                facts["runtime"] = info.get("HostConfig", {}).get("Runtime")
                facts["network"] = info.get("HostConfig", {}).get("NetworkMode")
                facts["privileged"] = info.get("HostConfig", {}).get("Privileged")
        if facts.get("image_id"):
            res = self._docker("image", "inspect", "-f", "{{json .RepoDigests}}", str(facts["image_id"]))
            with contextlib.suppress(ValueError):
                facts["repo_digests"] = json.loads(res.stdout) if res.returncode == 0 else []
        res = self._docker("version", "-f", "{{json .Server}}")
        if res.returncode == 0:
            with contextlib.suppress(ValueError, AttributeError):
                server = json.loads(res.stdout)
                facts["server_version"] = server.get("Version")
                facts["server_os"] = f"{server.get('Os')}/{server.get('Arch')}"
                facts["kernel"] = server.get("KernelVersion")
        res = self._docker("info", "-f", "{{.Driver}} {{.CgroupDriver}} {{.CgroupVersion}}")
        if res.returncode == 0 and len(res.stdout.split()) == 3:
            facts["storage_driver"], facts["cgroup_driver"], facts["cgroup_version"] = res.stdout.split()
        return facts

    # -- a container that died under a command -------------------------------------------------------
    def check_exec(self, code: int, duration: float, timeout: float) -> None:
        if code == 0:
            return
        state = self._inspect_state(self.container)
        if state != "running":
            raise _unreachable(self.name, f"container {self.container} is {state} (it stopped under the run)")

    def close(self) -> None:
        super().close()
        started, self.started = self.started, None
        if started is not None:
            self.removed = self._remove(started)
