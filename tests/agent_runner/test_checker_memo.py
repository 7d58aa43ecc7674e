"""The checker's memoised scan gives the answers of a fresh scan, turn after turn."""

from __future__ import annotations

from agent_runner import checker
from agent_runner.checker import TurnChecker, check_turns

CONTRACT = {
    "contract_id": "memo.v1",
    "tools": [{"name": "note", "required_args": ["text"], "forbidden_args": ["ssh_identity"]}],
    "invariants": ["no_absolute_local_paths", "no_home_directory_strings", "no_hostname_in_tool_args"],
}
BOX_B = {"hostname": "box-b", "home": "/root", "cwd": "/tmp/crosshost"}
LAPTOP = {"hostname": "Laptop-7.corp.example", "home": "/home/dev", "cwd": "/work/main"}


def _turn(step: int, text: object, **extra: object) -> dict[str, object]:
    return {"step": step, "tool": "note", "args": {"text": text, **extra}}


def test_a_leak_repeated_on_every_turn_is_found_on_every_turn() -> None:
    turns = [_turn(step, "written on box-b in /root/.cache") for step in range(1, 6)]
    findings = check_turns(CONTRACT, turns, [BOX_B])
    # three kinds on each turn (home, path, hostname), each with its own step, none lost to the memo
    assert sorted({f.kind for f in findings}) == ["absolute_local_path", "home_directory", "hostname"]
    for step in range(1, 6):
        assert {f.kind for f in findings if f.step == step} == {
            "absolute_local_path",
            "home_directory",
            "hostname",
        }


def test_the_same_string_under_another_key_or_tool_is_judged_again() -> None:
    turns = [
        _turn(1, "box-b"),
        {"step": 2, "tool": "other", "args": {"text": "box-b"}},
        _turn(3, "fine", ssh_identity="box-b"),
        _turn(4, "fine"),
    ]
    findings = check_turns(CONTRACT, turns, [BOX_B])
    assert [(f.step, f.kind) for f in findings] == [
        (1, "hostname"),
        (2, "unknown_tool"),
        (2, "hostname"),
        (3, "forbidden_args"),
        (3, "hostname"),
    ]


def test_hostname_inside_another_word_is_not_a_leak_but_on_any_non_alphanumeric_boundary_it_is() -> None:
    texts = [
        "xbox-b",
        "box-bx",
        "box-b_1",
        "abox-b-c",
        "BOX-B rebooted",
        "see box-b.",
        "laptop-7 said",
        "LAPTOP-7.CORP.EXAMPLE",
        "laptop-70",
        "record-for-box-b",
    ]
    turns = [_turn(step, text) for step, text in enumerate(texts, 1)]
    hits = {f.step: f.message for f in check_turns(CONTRACT, turns, [BOX_B, LAPTOP]) if f.kind == "hostname"}
    assert sorted(hits) == [3, 5, 6, 7, 8, 10]
    assert hits[5] == "hostname 'box-b' in an argument"
    assert hits[7] == "hostname 'Laptop-7' in an argument"


def test_host_paths_are_whole_paths_only() -> None:
    texts = ["/tmp/crosshostx/a", "/tmp/crosshost/a", "cd /work/main", "/work/mainline", "x/work/main"]
    turns = [_turn(step, text) for step, text in enumerate(texts, 1)]
    cwd_hits = [
        f.step
        for f in check_turns(CONTRACT, turns, [BOX_B, LAPTOP])
        if f.message.startswith("a host's working directory")
    ]
    assert cwd_hits == [2, 3]


def test_answers_survive_the_memo_filling_up(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(checker, "_MEMO_LIMIT", 3)
    prepared = TurnChecker(CONTRACT, [BOX_B])
    texts = (
        [f"plain {n}" for n in range(10)]
        + ["on box-b"] * 3
        + [f"plain {n}" for n in range(10)]
        + ["on box-b"]
    )
    turns = [_turn(step, text) for step, text in enumerate(texts, 1)]
    assert [f.step for f in prepared.check(turns)] == [11, 12, 13, 24]
    assert len(prepared._leak_memo) <= 3 and len(prepared._turn_memo) <= 3


def test_unhashable_and_non_string_values_are_checked_without_the_memo() -> None:
    turns = [
        _turn(1, ["a", {"deep": "/home/dev/x"}]),
        _turn(2, ["a", {"deep": "/home/dev/x"}]),
        _turn(3, 1),
        _turn(4, True),
    ]
    findings = check_turns(CONTRACT, turns, [LAPTOP])
    assert {f.step for f in findings} == {1, 2}
    assert {f.kind for f in findings if f.step == 2} == {"absolute_local_path", "home_directory"}
