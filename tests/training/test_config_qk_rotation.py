"""The attention's Q/K rotation in the training config: validation on load, the resolved config,
the fingerprint and the resume check, and the CLI's one-line error."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from fp4_attention import AttentionConfig
from fp4_attention.numerics.recipes import QKRotation
from fp4_attention.numerics.rotation import signs_text
from training import checkpoint as ckpt
from training.config import load_config
from training.resolved import config_fingerprint, resolved_dict
from training.signals import EXIT_CONFIG

ROTATED = ["attention.recipe=nvfp4qk_fp8pv", "attention.qk_rotation=hadamard", "attention.qk_rotation_seed=5"]


def test_rotation_from_overrides_reaches_the_model_config():
    cfg = load_config(None, ROTATED)
    assert cfg.attention.qk_rotation == "hadamard" and cfg.attention.qk_rotation_seed == 5
    assert cfg.attention.get_recipe().qk_rotation == QKRotation("hadamard", 5)
    assert cfg.llama().attention is cfg.attention  # carried unchanged to the core attention
    assert load_config(None).attention.get_recipe().qk_rotation is None  # off by default
    assert cfg.attention.call_kwargs() == {
        "recipe": "nvfp4qk_fp8pv",
        "backend": "auto",
        "qk_rotation": "hadamard",
        "qk_rotation_seed": 5,
    }
    assert load_config(None, ["attention.qk_rotation_seed='7'", *ROTATED[:2]]).attention.qk_rotation_seed == 7


@pytest.mark.parametrize(
    "overrides, match",
    [
        (
            ["attention.qk_rotation=walsh"],
            "attention: qk_rotation='walsh' is unknown; choose one of none, hadamard",
        ),
        (
            ["attention.recipe=bf16", "attention.qk_rotation=hadamard"],
            r"applies to the training recipes with quantized Q/K \(fp8, nvfp4qk_fp8pv\), not 'bf16'",
        ),
        (["attention.qk_rotation=hadamard", "attention.qk_rotation_seed=-3"], r"integer in \[0, 2\^63\)"),
        (["attention.qk_rotation_seed=3"], "has no effect with qk_rotation='none'"),
        (["attention.qk_rotation=hadamard", "attention.qk_rotation_seed=1.5"], "must be an integer"),
        (
            ["attention.qk_rotation=hadamard", "model.head_dim=48"],
            r"attention.qk_rotation='hadamard' needs a head dim that is a power of two .* got 48",
        ),
        (
            ["attention.qk_rotation=hadamard", "attention.backend=cute"],
            "attention.backend='cute' does not implement attention.qk_rotation='hadamard'; use "
            "attention.backend=auto or one of triton, reference",
        ),
    ],
)
def test_bad_rotation_settings_are_refused_on_load(overrides, match):
    with pytest.raises(ValueError, match=match):
        load_config(None, overrides)


def test_resolved_config_records_the_signs_and_the_fingerprint_ignores_the_rotation():
    plain = resolved_dict(load_config(None, ROTATED[:1]))
    rotated = resolved_dict(load_config(None, ROTATED))
    d = load_config(None).llama().head_dim
    assert rotated["attention"]["qk_rotation"] == "hadamard" and rotated["attention"]["qk_rotation_seed"] == 5
    assert rotated["attention"]["qk_rotation_signs"] == signs_text(5, d) and len(signs_text(5, d)) == d
    assert "qk_rotation_signs" not in plain["attention"]
    # a precision choice, like the recipe: the same job for tools/compare_runs.py
    assert config_fingerprint(plain) == config_fingerprint(rotated)


def test_resume_refuses_another_rotation():
    saved = resolved_dict(load_config(None, ROTATED))
    for change in (
        ["attention.qk_rotation_seed=6"],
        ["attention.qk_rotation=none", "attention.qk_rotation_seed=0"],
    ):
        now = resolved_dict(load_config(None, [*ROTATED, *change]))
        with pytest.raises(ckpt.ConfigMismatchError, match="attention.qk_rotation"):
            ckpt.check_resume_compatible(saved, now, allow=[], saved_data_identity=None, data_identity=None)
    # the signs themselves are compared: a checkpoint whose H differs (another torch generator)
    # is refused even with the same seed
    other = {**saved, "attention": {**saved["attention"], "qk_rotation_signs": "-" * 64}}
    with pytest.raises(ckpt.ConfigMismatchError, match="attention.qk_rotation_signs"):
        ckpt.check_resume_compatible(other, saved, allow=[], saved_data_identity=None, data_identity=None)
    assert (
        ckpt.check_resume_compatible(saved, saved, allow=[], saved_data_identity=None, data_identity=None)
        == []
    )


def test_attention_config_hash_and_equality_see_the_rotation():
    a = AttentionConfig(recipe="fp8", qk_rotation="hadamard", qk_rotation_seed=1)
    b = AttentionConfig(recipe="fp8", qk_rotation="hadamard", qk_rotation_seed=2)
    assert (
        a != b
        and hash(a) != hash(b)
        and a == AttentionConfig(recipe="fp8", qk_rotation="hadamard", qk_rotation_seed=1)
    )
    resolved, why = a.resolve("cpu")
    assert resolved.backend == "reference" and resolved.qk_rotation_seed == 1


def test_cli_bad_rotation_is_one_line_and_exit_2(capsys):
    repo = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("pretrain_llama_cli", repo / "pretrain_llama.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    code = cli.main(["--dry-run", "attention.recipe=bf16", "attention.qk_rotation=hadamard"])
    out, err = capsys.readouterr()
    assert code == EXIT_CONFIG and "Traceback" not in out + err
    assert err.startswith("pretrain_llama: configuration error: ") and len(err.strip().splitlines()) == 1
    assert "not 'bf16'" in err


def test_tiny_cpu_run_trains_with_the_rotation_and_resume_keeps_it(make_cfg, train, tmp_path):
    import json

    from training.signals import EXIT_DONE

    rotated = (
        "attention.recipe=nvfp4qk_fp8pv",
        "attention.qk_rotation=hadamard",
        "attention.qk_rotation_seed=5",
    )
    code, log = train(make_cfg(*rotated))
    assert code == EXIT_DONE, log.text()
    assert "attention: recipe nvfp4qk_fp8pv+hadamard(seed 5), backend reference" in log.text()
    saved = json.loads((ckpt.iter_dir(tmp_path / "run" / "checkpoints", 8) / ckpt.CONFIG_FILE).read_text())
    assert saved["attention"]["qk_rotation_signs"] == signs_text(5, 32)  # the tiny run's head dim
    code, log = train(make_cfg(*rotated[:2], "attention.qk_rotation_seed=6", "training.train_iters=12"))
    assert code == EXIT_CONFIG
    assert "attention.qk_rotation_seed: 5 in the checkpoint, 6 now" in log.text()
