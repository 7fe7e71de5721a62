"""The megatron-core engine on a CUDA GPU (run on the H200: python -m pytest -m gpu tests/training).

* the default job (configs/default.yaml, shortened) runs with auto's backend (cute with the cute
  extra, else Triton), trains, and logs tokens/s/GPU, MFU and peak memory;
* resume is exact in deterministic mode: 8 steps in one run vs 4 + resume + 4 (a copied step-4
  checkpoint); bitwise-equal losses are asserted, see RESUME_RTOL for the tolerance used otherwise;
* an asynchronous save completes (manifest, marker) and resumes;
* a damaged newest checkpoint (a flipped bit in a torch_dist file; an unreadable .metadata) falls back.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from training import checkpoint as ckpt
from training.config import load_config
from training.signals import EXIT_DONE

from ..conftest import have_module
from .conftest import metrics

pytestmark = pytest.mark.gpu

# Deterministic mode on one GPU: the same kernels on the same inputs in the same order; megatron's
# optimizer state and the RNG are restored bit for bit, so losses must match exactly.
RESUME_RTOL = 0.0

GPU_MODEL = ("model.hidden_size=128", "model.head_dim=64", "model.max_seq_length=128", "data.seq_length=128")


@pytest.fixture(scope="module", autouse=True)
def triton_backend():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    try:
        import fp4_attention.backends.triton.backend  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"fp4_attention.backends.triton.backend is not importable: {type(exc).__name__}: {exc}")


def test_default_job_runs_with_autos_backend_and_logs_throughput(train, tmp_path):
    cfg = load_config(
        None,
        [
            "training.train_iters=40",
            "training.warmup_iters=4",
            "checkpoint.save_interval=20",
            f"runtime.output_dir={tmp_path / 'default'}",
        ],
    )
    code, log = train(cfg)
    text = log.text()
    assert code == EXIT_DONE, text
    auto = "cute" if have_module("cutlass") and have_module("flash_attn") else "triton"
    assert (
        f"backend {auto} (auto: highest-priority backend for fp8 on NVIDIA" in text
        and "MFU = tokens/s/GPU x" in text
    )
    assert "megatron-core" in text and "DistributedDataParallel" in text
    step_lines = [line for line in log if line.startswith("step ") and "| loss " in line]
    assert all(" tok/s/GPU | MFU " in line and "| elapsed " in line for line in step_lines)
    summary = text.split("run summary:\n", 1)[1]
    assert "status       done: 40 of 40 steps" in summary
    assert " tokens/s/GPU (mean of steps 2-40, step time only), MFU " in summary
    trains = [r for r in metrics(tmp_path / "default") if r["kind"] == "train"]
    assert len(trains) == 40
    for r in trains[1:]:
        assert r["tokens_per_s_per_gpu"] > 0 and 0 < r["mfu"] < 1 and r["peak_mem_gib"] > 0
    first = sum(r["loss"] for r in trains[:3]) / 3
    last = sum(r["loss"] for r in trains[-5:]) / 5
    assert last < first - 2.0, (first, last)
    assert ckpt.find_latest(tmp_path / "default" / "checkpoints")[0] == 40


def check_resume_is_exact(make_cfg, train, tmp_path, over, label=None) -> str:
    """Train 8 steps with ``over`` (run ``full``), then 4 + resume + 4 from a copy of its step-4
    checkpoint (run ``half``); assert both runs finish and steps 5-8 have the same losses
    (:data:`RESUME_RTOL`). Returns the full run's log text."""
    code, log = train(make_cfg(*over, run="full"))
    assert code == EXIT_DONE, log.text()
    full = {r["step"]: r["loss"] for r in metrics(tmp_path / "full") if r["kind"] == "train"}
    root = tmp_path / "half" / "checkpoints"
    root.mkdir(parents=True)
    shutil.copytree(ckpt.iter_dir(tmp_path / "full" / "checkpoints", 4), ckpt.iter_dir(root, 4))
    (root / ckpt.MARKER).write_text("4\n")
    code, half = train(make_cfg(*over, run="half"))
    assert code == EXIT_DONE, half.text()
    resumed = {r["step"]: r["loss"] for r in metrics(tmp_path / "half") if r["kind"] == "train"}
    assert sorted(resumed) == [5, 6, 7, 8]
    for s in resumed:
        assert resumed[s] == pytest.approx(full[s], rel=RESUME_RTOL, abs=0), (label, s, resumed[s], full[s])
    return log.text()


@pytest.mark.parametrize("recipe", ["fp8", "nvfp4qk_fp8pv", "bf16"])  # bf16: FA4's deterministic backward
def test_resume_is_exact_in_deterministic_mode(make_cfg, train, tmp_path, recipe):
    over = (*GPU_MODEL, f"attention.recipe={recipe}", "runtime.deterministic=true")
    check_resume_is_exact(make_cfg, train, tmp_path, over, recipe)
    tele = [r for r in metrics(tmp_path / "full") if r["kind"] == "telemetry"]
    assert tele and all((t["zero_scale_block_frac"] is not None) == (recipe == "nvfp4qk_fp8pv") for t in tele)


def test_async_save_completes_and_resumes(make_cfg, train, tmp_path):
    code, log = train(make_cfg(*GPU_MODEL, "checkpoint.async_save=true"))
    assert code == EXIT_DONE, log.text()
    root = tmp_path / "run" / "checkpoints"
    assert ckpt.find_latest(root)[0] == 8 and ckpt.verify_checkpoint(ckpt.iter_dir(root, 4)) is None
    code, log = train(
        make_cfg(
            *GPU_MODEL,
            "checkpoint.async_save=true",
            "training.train_iters=10",
            "checkpoint.allow_config_change=[training.train_iters,data.identity]",
        )
    )
    assert code == EXIT_DONE, log.text()
    assert ckpt.find_latest(root)[0] == 10


def test_damaged_newest_checkpoint_falls_back(make_cfg, train, tmp_path):
    """The torch_dist files are checksummed like the CPU engine's; a flipped bit fails the checksum,
    and a file dist_checkpointing cannot read (an old, sizes-only manifest) falls back at load."""
    code, log = train(make_cfg(*GPU_MODEL))
    assert code == EXIT_DONE, log.text()
    root = tmp_path / "run" / "checkpoints"
    final = ckpt.iter_dir(root, 8)
    manifest = ckpt.read_json(final / ckpt.MANIFEST)
    assert any(rel.endswith(".distcp") for rel in manifest["checksums"])
    big = final / max(manifest["files"], key=manifest["files"].get)
    data = bytearray(big.read_bytes())
    data[len(data) // 2] ^= 0x01
    big.write_bytes(bytes(data))
    code, log = train(make_cfg(*GPU_MODEL))
    assert code == EXIT_DONE, log.text()
    assert f"skipping iteration 8: {big} is damaged: its crc32 is" in log.text()
    events = [(r["event"], r["step"]) for r in metrics(tmp_path / "run") if r["kind"] == "event"]
    assert ("resume", 4) in events and ckpt.verify_checkpoint(final) is None

    meta = final / ".metadata"
    assert meta.is_file(), sorted(p.name for p in final.iterdir())
    meta.write_bytes(b"\x80garbage" * (meta.stat().st_size // 8) + b"\x00" * (meta.stat().st_size % 8))
    manifest = ckpt.read_json(final / ckpt.MANIFEST)
    (final / ckpt.MANIFEST).write_text(json.dumps({"format": 1, "iteration": 8, "files": manifest["files"]}))
    code, log = train(make_cfg(*GPU_MODEL))
    assert code == EXIT_DONE, log.text()
    text = log.text()
    # the shape check of the allowed config changes reads .metadata first and names it
    meta_msg = f"iteration 8 is damaged: {final / '.metadata'} does not deserialize as torch_dist metadata"
    assert meta_msg in text
    assert "resuming from the previous complete checkpoint, iter_0000004" in text
    assert "weights_only=False" not in text


def test_a_real_out_of_memory_error_in_a_step_exits_6_and_names_a_micro_batch(make_cfg, train, tmp_path):
    """A real CUDA out-of-memory error from PyTorch's allocator in megatron-core's step (the CPU tests raise
    a stand-in, tests/training/test_train_cpu.py): at micro-batch 16384 x 128 tokens the logits over the
    Llama-3 vocabulary alone are 16384 x 128 x 128256 x 2 bytes = 538 GB in BF16, so no GPU can hold them
    (at most 0.5 GB is allocated before them: the GPU tests of other processes sharing the GPU keep theirs).
    The run stops in step 1 with exit code 6, writes nothing and names a micro-batch size to relaunch with."""
    from training.signals import EXIT_OUT_OF_MEMORY

    over = ("training.micro_batch_size=16384", "training.global_batch_size=16384", "training.train_iters=2")
    code, log = train(make_cfg(*GPU_MODEL, *over, "training.warmup_iters=1", "validation.interval=0"))
    assert code == EXIT_OUT_OF_MEMORY, log.text()
    event = metrics(tmp_path / "run")[-1]
    assert event["kind"] == "event" and event["event"] == "exit" and event["step"] == 0, event
    assert event["detail"].startswith("out of GPU memory in step 1 (CUDA out of memory."), event["detail"]
    assert "To fit: " in event["detail"] and "training.micro_batch_size=" in event["detail"], event["detail"]
    assert ckpt.find_latest(tmp_path / "run" / "checkpoints") is None
    # the allocator's memory is back once the trainer has returned: a later job of the process can run
    import gc

    gc.collect()
    assert torch.cuda.memory_allocated() < 2**30, torch.cuda.memory_allocated()
