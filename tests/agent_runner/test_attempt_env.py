"""What an attempt's predicate sees: HOME and TMPDIR are empty directories of the attempt's own, and
the environment holds only the allowlisted keys (not the runner's own PYTHONPATH, HOME or others)."""

from __future__ import annotations

from pathlib import Path

from tests.support.runner import clean_env, records, run_runner, write_suite

PREDICATE = r"""
attempt=$(dirname "$PWD")
fail() { echo "FAIL: $1"; exit 1; }
[ "$HOME" = "$attempt/home" ] || fail "HOME=$HOME"
[ -d "$HOME" ] && [ -z "$(ls -A "$HOME")" ] || fail "HOME is not an empty directory"
[ "$TMPDIR" = "$attempt/tmp" ] && [ -d "$TMPDIR" ] || fail "TMPDIR=$TMPDIR"
[ -z "${CROSSHOST_PROBE_VAR+x}" ] || fail "CROSSHOST_PROBE_VAR is visible"
[ -z "${PYTHONPATH+x}" ] || fail "PYTHONPATH is visible"
[ "$TZ" = "Pinned/Zone" ] || fail "TZ=$TZ"
echo ok
"""


def test_predicate_runs_with_its_own_empty_home_and_only_allowlisted_keys(tmp_path: Path) -> None:
    suite = write_suite(tmp_path / "suite", {
        "probe": {"toml": '[agent]\nkind = "none"\n', "repo": {"run_tests.sh": PREDICATE}},
    })
    env = clean_env(CROSSHOST_PROBE_VAR="visible", TZ="Pinned/Zone", HOME=str(tmp_path / "real-home"))
    (tmp_path / "real-home").mkdir()
    (tmp_path / "real-home" / ".netrc").write_text("machine x login y\n")
    done = run_runner("run", "--suite", str(suite), "--out", str(tmp_path / "out"), "--workspace-root",
                      str(tmp_path / "ws"), "--env-allow", "PATH,TZ", env=env)
    assert done.returncode == 0, done.stderr
    [row] = records(tmp_path / "out" / "results.jsonl")
    assert (row["verdict"], row["exit_code"]) == ("pass", 0), row["reason"]
