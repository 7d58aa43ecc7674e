"""The import of what a replay needs after its hosts starts once, at the first run stage, in a thread."""

from __future__ import annotations

import threading

import pytest

from orchestrator.commands import replay


def _loaders() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "crosshost-load"]


def test_the_loader_starts_one_thread_however_often_it_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    loaded: list[str] = []

    def slow_import(name: str) -> None:
        gate.wait(10)
        loaded.append(name)

    monkeypatch.setattr(replay.importlib, "import_module", slow_import)
    replay._loader(False)()
    assert _loaders() == []  # no analysis wanted: nothing loaded
    start = replay._loader(True)
    starters = [threading.Thread(target=start) for _ in range(8)]  # every host's run stage at once
    for t in starters:
        t.start()
    for t in starters:
        t.join()
    assert len(_loaders()) == 1
    gate.set()
    _loaders()[0].join(10)
    assert loaded == list(replay._AFTER_THE_HOSTS)


def test_the_loader_warms_the_tables_once_their_module_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    warmed = threading.Event()
    fake_ui = types.SimpleNamespace(warm=warmed.set)
    monkeypatch.setattr(replay.importlib, "import_module", lambda name: None)
    monkeypatch.setitem(replay.sys.modules, "orchestrator.ui", fake_ui)
    replay._loader(True)()
    assert warmed.wait(10)  # rich's first-table loads happen in the loader, not after the hosts
