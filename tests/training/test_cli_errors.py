"""Bad input to ``pretrain_llama.py``: exit code 2 and one message on stderr, never a traceback.

Config and override errors are checked through ``main(argv)`` in this process (no model is built);
data, run-directory and checkpoint-shape errors through a tiny CPU run (``tests/training/conftest.py``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from training.signals import EXIT_CONFIG, EXIT_DONE, EXIT_INTERRUPTED

from .conftest import tiny_raw

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cli():
    spec = importlib.util.spec_from_file_location("pretrain_llama_cli", REPO / "pretrain_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(cli, capsys, *argv) -> tuple[int, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


@pytest.mark.parametrize(
    "override, match",
    [
        ("training.lr=[1e-3,", "override 'training.lr=[1e-3,': the value is not valid YAML (column 7: "),
        ("training.lr={a: 1", "the value is not valid YAML (column 6: expected ',' or '}'"),
        ('data.split="969,30', "the value is not valid YAML (column 8: found unexpected end of stream)"),
        ("training.seed={[1]: 2}", "found unhashable key"),
    ],
)
def test_malformed_override_value(cli, capsys, override, match):
    code, err = run_cli(cli, capsys, "--dry-run", override)
    assert code == EXIT_CONFIG
    assert err.startswith("pretrain_llama: configuration error: ") and match in err
    assert len(err.strip().splitlines()) == 1


def test_yaml_tags_are_refused_not_executed(cli, capsys, tmp_path):
    marker = tmp_path / "executed"
    tag = f'!!python/object/apply:os.system ["touch {marker}"]'
    code, err = run_cli(cli, capsys, "--dry-run", f"training.seed={tag}")
    assert code == EXIT_CONFIG
    assert "constructor for the tag '!!python/object/apply:os.system'" in err
    assert "YAML tags are not allowed" in err
    cfg = tmp_path / "tagged.yaml"
    cfg.write_text(f"training:\n  seed: {tag}\n")
    code, err = run_cli(cli, capsys, "--dry-run", "--config", str(cfg))
    assert code == EXIT_CONFIG
    assert f"config file {cfg}: not valid YAML (line 2, column 9: could not determine a constructor" in err
    assert not marker.exists()


@pytest.mark.parametrize(
    "content, match",
    [
        ("- training\n- model\n", "must hold a mapping of sections (model:, training:, ...), not a list"),
        ("just text\n", "must hold a mapping of sections (model:, training:, ...), not a str"),
        ("training:\n  lr: [1,\n", ": not valid YAML (line 3, column 1: expected the node content"),
        (b"\xff\xfetraining: {}\n", "is not UTF-8 text (byte 0); save it as UTF-8"),
        ("training: 5\n", "config section 'training' must be a mapping, got int"),
    ],
)
def test_bad_config_file(cli, capsys, tmp_path, content, match):
    cfg = tmp_path / "bad.yaml"
    if isinstance(content, bytes):
        cfg.write_bytes(content)
    else:
        cfg.write_text(content)
    code, err = run_cli(cli, capsys, "--dry-run", "--config", str(cfg), "training.seed=1")
    assert code == EXIT_CONFIG and match in err, err


def test_config_path_that_is_not_a_file(cli, capsys, tmp_path):
    code, err = run_cli(cli, capsys, "--dry-run", "--config", str(tmp_path / "nope.yaml"))
    assert code == EXIT_CONFIG and f"config file {tmp_path / 'nope.yaml'} does not exist" in err
    code, err = run_cli(cli, capsys, "--dry-run", "--config", str(tmp_path))
    assert code == EXIT_CONFIG and f"config file {tmp_path} is a directory, not a YAML file" in err


def test_dry_run_world_size_from_a_bad_environment(cli, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "eight")
    code, err = run_cli(cli, capsys, "--dry-run")
    assert code == EXIT_CONFIG and "$WORLD_SIZE='eight' is not a number; pass --world-size N" in err


def test_ctrl_c_before_the_loop_is_one_line_and_130(cli, capsys, monkeypatch, tmp_path):
    import training.trainer

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(training.trainer.Trainer, "run", interrupted)
    monkeypatch.setenv("PRETRAIN_EXIT_FILE", str(tmp_path / "exit_code"))
    code, err = run_cli(cli, capsys, "training.seed=1")
    assert code == EXIT_INTERRUPTED == 130
    assert err == "pretrain_llama: stopped by Ctrl-C; nothing saved since the last checkpoint\n"
    assert (tmp_path / "exit_code").read_text() == "130\n"


def test_missing_idx_of_a_prepared_dataset(cli, capsys, tiny_corpus, tmp_path):
    prefix, cache = tiny_corpus
    (tmp_path / "noidx.bin").write_bytes(Path(prefix + ".bin").read_bytes())
    raw = tiny_raw(tmp_path / "run", tiny_corpus)
    raw["data"]["corpus"] = [{"prefix": str(tmp_path / "noidx")}]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    code, err = run_cli(cli, capsys, "--config", str(cfg))
    assert code == EXIT_CONFIG
    line = [ln for ln in err.splitlines() if "configuration error" in ln]
    assert line == [
        f"pretrain_llama: configuration error: indexed dataset file missing: {tmp_path / 'noidx.idx'} "
        f"(prepare it first: `python -m data.prepare --input FILES --output-prefix {tmp_path / 'noidx'}`, "
        "README 'Your data'; the sample corpus: `python -m data.prepare --default`)"
    ]


def test_run_directory_that_is_a_file(make_cfg, tmp_path):
    (tmp_path / "run").write_text("not a directory")
    errors = []
    from training.trainer import Trainer

    code = Trainer(make_cfg(), log=lambda _: None, log_error=errors.append).run()
    assert code == EXIT_CONFIG
    assert errors == [
        f"pretrain_llama: configuration error: the run directory (runtime.output_dir) {tmp_path / 'run'} "
        f"cannot be created: {tmp_path / 'run'} is a file, not a directory; name another directory"
    ]


def test_allowed_shape_change_cannot_load_the_checkpoint(make_cfg, train, tmp_path):
    quick = ("training.train_iters=3", "validation.interval=0", "logging.telemetry_interval=0")
    code, log = train(make_cfg(*quick))
    assert code == EXIT_DONE, log.text()
    code, log = train(
        make_cfg(*quick, "model.hidden_size=128", "checkpoint.allow_config_change=[model.hidden_size]")
    )
    assert code == EXIT_CONFIG
    assert "resume: allowed config change model.hidden_size: 64 -> 128" in log.text()
    ckpt = tmp_path / "run" / "checkpoints" / "iter_0000003"
    assert (
        f"pretrain_llama: configuration error: cannot resume from {ckpt}: its weights do not fit the "
        "model of this config (embedding.word_embeddings.weight is 128256x64 in the checkpoint, "
        "128256x128 now, and 14 more tensor(s)); a change of model shape cannot continue from a "
        "checkpoint: undo it, or start a fresh run in another runtime.output_dir or checkpoint.dir"
    ) in log.text()


def test_sharded_checkpoint_shapes_are_checked_before_loading(tmp_path):
    """The GPU engine's check (dist_checkpointing needs CUDA): the global shapes in a torch_dist
    checkpoint's metadata against the model's ShardedTensors, before any tensor is read."""
    import torch
    import torch.distributed.checkpoint as dcp
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    from training.checkpoint import ConfigMismatchError
    from training.engine import check_tensor_shapes
    from training.engine_megatron import dcp_tensor_shapes, sharded_tensor_shapes

    saved = {
        "embedding.word_embeddings.weight": torch.zeros(16, 4),
        "decoder.layers.mlp.linear_fc2.weight": torch.zeros(2, 4, 8),
        "decoder.final_layernorm.weight": torch.zeros(4),
    }
    dcp.save({**saved, "extra": {"note": "not a tensor"}}, checkpoint_id=str(tmp_path), no_dist=True)
    assert dcp_tensor_shapes(tmp_path) == {k: tuple(v.shape) for k, v in saved.items()}

    def model(hidden):
        layers = [
            ShardedTensor.from_rank_offsets(
                "decoder.layers.mlp.linear_fc2.weight",
                torch.zeros(hidden, 8),
                (0, i, 2),
                replica_id=0,
                prepend_axis_num=1,
            )
            for i in range(2)
        ]
        return {
            "embedding": {
                "w": ShardedTensor.from_rank_offsets(
                    "embedding.word_embeddings.weight", torch.zeros(16, hidden)
                )
            },
            "decoder": {
                "layers": layers,
                "norm": ShardedTensor.from_rank_offsets(
                    "decoder.final_layernorm.weight", torch.zeros(hidden)
                ),
            },
        }

    check_tensor_shapes(tmp_path, dcp_tensor_shapes(tmp_path), sharded_tensor_shapes(model(4)))  # fits
    with pytest.raises(ConfigMismatchError) as err:
        check_tensor_shapes(tmp_path, dcp_tensor_shapes(tmp_path), sharded_tensor_shapes(model(6)))
    assert str(err.value).startswith(
        f"cannot resume from {tmp_path}: its weights do not fit the model of this config "
        "(embedding.word_embeddings.weight is 16x4 in the checkpoint, 16x6 now, and 2 more tensor(s))"
    )


def test_unreadable_torch_dist_metadata_is_a_damaged_checkpoint(tmp_path):
    """A ``.metadata`` that does not deserialize is damage (the trainer falls back to the previous
    checkpoint), not a configuration error: the shape check reads it before megatron's load does.
    Seen on the H200: garbage bytes there gave 'configuration error: unsupported pickle protocol'."""
    import torch
    import torch.distributed.checkpoint as dcp

    from training.checkpoint import DamagedCheckpointError
    from training.engine_megatron import dcp_tensor_shapes

    dcp.save({"w": torch.zeros(4, 4)}, checkpoint_id=str(tmp_path), no_dist=True)
    meta = tmp_path / ".metadata"
    meta.write_bytes(b"\x80garbage" * 8)
    with pytest.raises(DamagedCheckpointError, match=r"\.metadata does not deserialize as torch_dist"):
        dcp_tensor_shapes(tmp_path)
    meta.unlink()
    with pytest.raises(DamagedCheckpointError, match=r"\.metadata does not deserialize"):
        dcp_tensor_shapes(tmp_path)


def test_dry_run_options_without_dry_run_are_refused(cli, capsys):
    # a --world-size the training run would ignore (the launcher sets it) is an error, not a no-op
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--world-size", "64", "--gpu-memory-gib", "79.6"])
    assert exit_info.value.code == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "--world-size, --gpu-memory-gib: for --dry-run only; a training run takes its world size" in err
