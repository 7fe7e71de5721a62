"""bench/trajectory/setup.py on CPU: the code copy, the documentation corpus (copied, or a clear
refusal), the blend weights and epochs from the manifests, and a missing wheel bundle."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from trajectory import setup as S  # noqa: E402


def _manifest(path: Path, tokens: int, train: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {"tokens": tokens, "tokens_per_split": {"train": train if train is not None else tokens}}
    path.write_text(json.dumps({"manifest_format": 1, "result": result, "files": {}}))


def test_copy_code_leaves_out_data_and_bundles(tmp_path):
    repo = tmp_path / "repo"
    for rel in ("pretrain_llama.py", "training/x.py", "cache/data/big.bin", ".whl/a.whl", "results/r.md"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x")
    dest = S.copy_code(repo, tmp_path / "code")
    assert (dest / "pretrain_llama.py").is_file() and (dest / "training" / "x.py").is_file()
    assert not (dest / "cache").exists() and not (dest / ".whl").exists() and not (dest / "results").exists()
    (repo / "training" / "x.py").write_text("changed")  # a later call's tree does not reach the copy
    S.copy_code(repo, dest)
    assert (dest / "training" / "x.py").read_text() == "x"


def test_pydocs_copied_from_a_prepared_folder_or_refused(tmp_path):
    code, prepared = tmp_path / "code", tmp_path / "gpudata"
    prepared.mkdir()
    with pytest.raises(S.SetupError, match="PYDOCS_PREPARED is unset") as err:
        S.prepare_pydocs(code, prepared=None, sources=None, python=sys.executable, env={}, log=tmp_path / "l")
    assert err.value.code == 2
    with pytest.raises(S.SetupError, match="holds no pydocs"):
        S.prepare_pydocs(
            code, prepared=str(prepared), sources=None, python=sys.executable, env={}, log=tmp_path / "l"
        )
    for n in ("pydocs.bin", "pydocs.idx"):
        (prepared / n).write_bytes(b"\0")
    _manifest(prepared / "pydocs.manifest.json", 2_640_000)
    S.prepare_pydocs(
        code, prepared=str(prepared), sources=None, python=sys.executable, env={}, log=tmp_path / "l"
    )
    assert S.source_tokens(code, "python_docs") == 2_640_000


def test_blend_weights_are_the_tokens_and_epochs_follow(tmp_path):
    code = tmp_path / "code"
    _manifest(code / "cache/data/default/kjv.manifest.json", 1_100_000, train=1_000_000)
    _manifest(code / "cache/data/default/stdlib.manifest.json", 8_000_000, train=7_000_000)
    _manifest(code / f"{S.PYDOCS}.manifest.json", 2_000_000)
    assert S.blend(code, "committed") is None  # the config's own blend
    assert S.epochs(code, "extended", 200_000_000) is None  # site-packages not prepared
    _manifest(code / f"{S.SITE_PACKAGES}.manifest.json", 90_000_000)
    blend = S.blend(code, "extended")
    assert blend == [
        {"prefix": "cache/data/default/kjv_train", "weight": 1_000_000},
        {"prefix": "cache/data/default/stdlib_train", "weight": 7_000_000},
        {"prefix": "cache/data/python_docs/pydocs", "weight": 2_000_000},
        {"prefix": "cache/data/site_packages/sitepkgs", "weight": 90_000_000},
    ]
    ep = S.epochs(code, "extended", 196_000_000)
    assert ep == pytest.approx({n: 2.0 for n in ("kjv", "stdlib", "python_docs", "site_packages")})
    assert S.epochs(code, "committed", 98_000_000)["kjv"] == pytest.approx(10.0)


def test_no_wheels_and_no_megatron_is_refused(tmp_path):
    no_megatron = tmp_path / "python_without_megatron"
    no_megatron.write_text("#!/bin/sh\nexit 1\n")
    no_megatron.chmod(0o755)
    with pytest.raises(S.SetupError, match="carry .whl") as err:
        S.install_wheels(
            tmp_path / "none", tmp_path / "site", python=str(no_megatron), log=tmp_path / "w.log"
        )
    assert err.value.code == 2 and not (tmp_path / "site" / ".installed").exists()
    if importlib.util.find_spec("megatron.core") is not None:  # installed here: nothing to carry
        S.install_wheels(tmp_path / "none", tmp_path / "site", python=sys.executable, log=tmp_path / "w.log")
        assert (tmp_path / "site" / ".installed").read_text() == "none needed\n"


def test_prepare_data_cli_refuses_an_unknown_corpus():
    """--prepare-data: a corpus name that does not exist is an argparse error (exit 2)."""
    res = subprocess.run(
        [sys.executable, str(REPO / "bench" / "trajectory_session.py"), "--prepare-data", "bogus"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert res.returncode == 2 and "invalid choice" in res.stderr
