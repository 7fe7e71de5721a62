"""Config loading, validation, overrides, resolved form and fingerprint."""

from __future__ import annotations

import pytest

from llama import ParallelConfig, ProjectionConfig
from training.config import (
    CONFIG_SECTIONS,
    TrainConfig,
    apply_overrides,
    from_dict,
    load_config,
)
from training.resolved import config_fingerprint, resolved_dict


def test_default_yaml_is_the_embedded_default():
    assert load_config("configs/default.yaml") == load_config(None) == TrainConfig()


def test_overrides_are_parsed_with_yaml():
    cfg = load_config(
        None,
        [
            "training.train_iters=50",
            "attention.recipe=bf16",
            "training.lr=3e-4",
            "checkpoint.allow_config_change=[model.num_layers, data.identity]",
            "model.num_layers=3",
        ],
    )
    assert cfg.training.train_iters == 50 and cfg.attention.recipe == "bf16"
    assert cfg.training.lr == 3e-4  # YAML 1.1 reads 3e-4 as a string; numeric fields accept it
    assert cfg.checkpoint.allow_config_change == ["model.num_layers", "data.identity"]
    assert cfg.model.overrides["num_layers"] == 3 and cfg.model.overrides["vocab_size"] == 128256


def test_train_tokens_accepts_scientific_notation():
    cfg = load_config(None, ["training.train_iters=null", "training.train_tokens=1e6"])
    assert cfg.training.train_tokens == 1_000_000
    assert cfg.train_iters == -(-1_000_000 // (4 * 256))


@pytest.mark.parametrize(
    "raw, match",
    [
        (
            {"trainnig": {}},
            r"unknown config section\(s\) trainnig \(did you mean training\?\); valid sections: model, ",
        ),
        ({"training": {"lr_max": 1.0}}, r"training: unknown key\(s\) lr_max; valid keys: micro_batch_size"),
        (
            {"model": {"preset": "tiny", "hiden_size": 8}},
            r"model: unknown key\(s\) hiden_size \(did you mean hidden_size\?\); valid keys: preset, ",
        ),
        ({"attention": {"recipe": "nvfp4qk_mxfp4pv_fast"}}, "cannot train"),
        (
            {"attention": {"backend": "cuda"}},
            "unknown attention backend 'cuda'; known: auto, cute, fa4, reference, triton",
        ),
        (
            {"attention": {"backend": "cute", "recipe": "bf16"}},
            "runs recipe.s. fp8, nvfp4qk_fp8pv, not 'bf16'; use attention.backend=auto or one of "
            "fa4, triton, reference",
        ),
        ({"attention": {"backend": "fa4", "recipe": "fp8"}}, "runs recipe.s. bf16, not 'fp8'"),
        (
            {"attention": {"backend": "triton", "options": {"tiles": [128, 128, 2]}}},
            "not options of backend 'triton'",
        ),
        ({"training": {"global_batch_size": 5}}, "not a multiple of micro_batch_size"),
        (
            {"training": {"train_tokens": 100}},
            "exactly one of training.train_tokens and training.train_iters",
        ),
        ({"training": {"train_iters": "many"}}, "training.train_iters must be an integer"),
        ({"training": {"warmup_iters": 80}}, "warmup_iters=80 must be < the number of steps"),
        ({"runtime": {"nonfinite": "ignore"}}, "choose one of skip, stop"),
        ({"data": {"seq_length": 100000}}, "exceeds model.max_seq_length"),
        ({"data": {"corpus": [{"prefix": "/x"}]}}, "data.split is needed"),
        ({"model": {"preset": "tiny"}}, "smaller than the Llama-3 tokenizer"),
        ({"model": {"preset": "huge"}}, "unknown; choose one of llama3_1_8b, small, tiny"),
        ({"projection": {"precision": "torchao_fp8"}}, "choose one of bf16, te_fp8"),
        ({"logging": {"tensorboard": "yes"}}, "logging.tensorboard must be true or false"),
    ],
)
def test_invalid_configs_say_what_to_fix(raw, match):
    with pytest.raises(ValueError, match=match):
        from_dict(raw)


def test_projection_and_parallel_sections_are_the_model_config_types():
    assert CONFIG_SECTIONS["projection"] is ProjectionConfig and CONFIG_SECTIONS["parallel"] is ParallelConfig
    cfg = load_config(
        None, ["parallel.tensor=2", "parallel.sequence_parallel=true", "projection.precision=te_fp8"]
    )
    assert (
        cfg.parallel == ParallelConfig(tensor=2, sequence_parallel=True)
        and cfg.parallel.model_parallel_size == 2
    )
    assert cfg.llama().projection is cfg.projection
    # the trainer runs fewer projection precisions than ProjectionConfig knows; the message lists those
    with pytest.raises(ValueError, match="^projection.precision='int8'; choose one of bf16, te_fp8$"):
        load_config(None, ["projection.precision=int8"])
    with pytest.raises(ValueError, match="^projection.precision='torchao_fp8'; choose one of bf16, te_fp8$"):
        TrainConfig(projection=ProjectionConfig(precision="torchao_fp8"))
    # a layout the model cannot run is a valid config (the plan reports it, see test_plan)
    assert load_config(None, ["parallel.context=2"]).parallel.context == 2


def test_cute_and_fa4_accept_their_recipes():
    assert load_config(None, ["attention.backend=cute", "attention.recipe=fp8"]).attention.backend == "cute"
    assert (
        load_config(None, ["attention.backend=cute", "attention.recipe=nvfp4qk_fp8pv"]).attention.backend
        == "cute"
    )
    assert load_config(None, ["attention.backend=fa4", "attention.recipe=bf16"]).attention.backend == "fa4"


def test_gpu_backends_need_cuda():
    for name, recipe in (("triton", "fp8"), ("cute", "fp8"), ("fa4", "bf16")):
        cfg = load_config(None, [f"attention.backend={name}", f"attention.recipe={recipe}"])
        with pytest.raises(
            ValueError, match=f"{name} backend needs a CUDA device, not cpu; use backend='reference'"
        ):
            cfg.attention.resolve("cpu")


def test_bad_override_syntax():
    with pytest.raises(ValueError, match="section.key=value"):
        apply_overrides({}, ["training.lr"])
    with pytest.raises(ValueError, match="unknown section"):
        apply_overrides({}, ["trainer.lr=1"])


def test_resolved_config_and_fingerprint():
    a = resolved_dict(load_config(None, ["attention.backend=reference"]))
    assert (
        a["model"]["num_layers"] == 2
        and a["model"]["vocab_size"] == 128256
        and a["model"]["preset"] == "tiny"
    )
    assert a["attention"]["backend"] == "reference" and a["training"]["train_iters"] == 80
    same = resolved_dict(
        load_config(
            None,
            [
                "attention.recipe=nvfp4qk_fp8pv",
                "training.seed=7",
                "runtime.output_dir=elsewhere",
                "logging.log_interval=5",
                "attention.backend=triton",
            ],
        )
    )
    assert config_fingerprint(a) == config_fingerprint(same)
    other = resolved_dict(load_config(None, ["training.lr=1e-3", "attention.backend=reference"]))
    assert config_fingerprint(a) != config_fingerprint(other)


def test_8b_configs_differ_only_in_precision():
    from pathlib import Path

    import yaml

    a = yaml.safe_load(Path("configs/llama3_1_8b_100b_bf16.yaml").read_text())
    b = yaml.safe_load(Path("configs/llama3_1_8b_100b_fp8.yaml").read_text())
    a["runtime"].pop("output_dir"), b["runtime"].pop("output_dir")
    assert a["attention"].pop("recipe") == "bf16" and b["attention"].pop("recipe") == "nvfp4qk_fp8pv"
    assert a.pop("projection") == {"precision": "bf16"} and b.pop("projection")["precision"] == "te_fp8"
    assert a == b
    ra = resolved_dict(load_config("configs/llama3_1_8b_100b_bf16.yaml"))
    rb = resolved_dict(load_config("configs/llama3_1_8b_100b_fp8.yaml"))
    ra["runtime"]["output_dir"] = rb["runtime"]["output_dir"]
    assert config_fingerprint(ra) == config_fingerprint(rb)
    t = load_config("configs/llama3_1_8b_100b_fp8.yaml").training
    assert (
        t.lr,
        t.min_lr,
        t.warmup_iters,
        t.weight_decay,
        t.adam_beta1,
        t.adam_beta2,
        t.adam_eps,
        t.clip_grad,
    ) == (3e-4, 3e-5, 2000, 0.1, 0.9, 0.95, 1e-8, 1.0)


@pytest.mark.parametrize(
    "override, tail",
    [
        ("logging.wandb_mode=yes", "choose one of disabled, offline, online"),
        ("runtime.nonfinite=on", "choose one of skip, stop"),
        ("runtime.output_dir=no", "quote the value"),
    ],
)
def test_a_yaml_boolean_for_a_string_key_says_why(override, tail):
    """Found in review (2026-12-06): ``logging.wandb_mode=yes`` said only "must be a string, got True"."""
    with pytest.raises(
        ValueError, match="YAML reads an unquoted yes, no, on, off, true or false as a boolean; "
    ) as e:
        load_config(None, [override])
    assert str(e.value).endswith(tail)
