"""Start-up writability check of the output and checkpoint directories (exit code 2 before step 1)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from training.signals import EXIT_CONFIG
from training.writable import PROBE_PREFIX, check_writable_dir

NOBODY = 65534


def test_a_writable_directory_is_created_and_left_clean(tmp_path):
    path = tmp_path / "a" / "b" / "checkpoints"
    check_writable_dir(path, "checkpoint.dir")
    assert path.is_dir() and list(path.iterdir()) == []
    check_writable_dir(path, "checkpoint.dir")  # existing: fine too
    assert not any(p.name.startswith(PROBE_PREFIX) for p in path.iterdir())


def test_a_path_under_a_regular_file(tmp_path):
    (tmp_path / "notes.txt").write_text("a file")
    path = tmp_path / "notes.txt" / "run" / "checkpoints"
    with pytest.raises(ValueError) as err:
        check_writable_dir(path, "checkpoint.dir")
    assert str(err.value) == (
        f"checkpoint.dir {path} is under {tmp_path / 'notes.txt'}, which is a file, not a directory; "
        "set checkpoint.dir to a directory this job can write"
    )
    with pytest.raises(ValueError, match=f"runtime.output_dir {tmp_path / 'notes.txt'} is a file, not a"):
        check_writable_dir(tmp_path / "notes.txt", "runtime.output_dir")


def _check_as(uid: int | None, path: Path) -> str:
    """check_writable_dir(path) as ``uid`` (a forked child that drops root) or as this process: its
    error message, or "ok"."""
    if uid is None:
        try:
            check_writable_dir(path, "checkpoint.dir")
        except ValueError as err:
            return str(err)
        return "ok"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to ``uid`` (root ignores directory permissions), check, report
        try:
            os.close(r)
            os.setgid(uid)
            os.setuid(uid)
            os.write(w, _check_as(None, path).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


def test_a_read_only_directory():
    """chmod 0555 stops every user but root, so as root the check runs in a child that is ``nobody``."""
    uid = NOBODY if os.geteuid() == 0 else None
    base = Path(tempfile.mkdtemp())  # not pytest's tmp_path: its parents are private to root
    try:
        base.chmod(0o755)
        (base / "rw").mkdir()
        (base / "rw").chmod(0o777)
        assert _check_as(uid, base / "rw") == "ok"  # the same user can write where it may
        ro = base / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        out = _check_as(uid, ro)
        assert out == (
            f"checkpoint.dir {ro} is not writable (Permission denied); set checkpoint.dir to a directory "
            "this job can write"
        ), out
        out = _check_as(uid, ro / "checkpoints")
        assert out.startswith(f"checkpoint.dir {ro / 'checkpoints'} cannot be created (Permission denied)"), (
            out
        )
    finally:
        (base / "ro").chmod(0o755)
        shutil.rmtree(base)


@pytest.mark.parametrize("key", ["checkpoint.dir", "runtime.output_dir"])
def test_the_run_stops_before_the_model_data_and_first_step(make_cfg, train, tmp_path, key):
    (tmp_path / "blocker").write_text("a file")
    bad = tmp_path / "blocker" / "sub"
    code, log = train(make_cfg(f"{key}={bad}"))
    assert code == EXIT_CONFIG, log.text()
    text = log.text()
    if key == "runtime.output_dir":  # the run directory is created first (data.errors.make_dirs)
        assert f"(runtime.output_dir) {bad} cannot be created: {tmp_path / 'blocker'} is a file" in text
    else:
        assert f"configuration error: {key} {bad} is under {tmp_path / 'blocker'}, which is a file" in text
        assert "checked at start-up, before the first step" in text
    assert "engine:" not in text and "data:" not in text  # neither the model nor the data was built
    assert not list(tmp_path.glob("**/metrics.jsonl"))  # not a step, not a metrics line
