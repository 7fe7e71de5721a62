"""The trainer resolves ``attention.backend: auto`` in the deterministic mode its attention calls
see: torch's, which may be on before the run (the caller's script set it) even with
``runtime.deterministic: false``; and a run with ``runtime.deterministic: true`` leaves torch's
mode as it found it."""

from __future__ import annotations

import torch

import fp4_attention as fa
from fp4_attention import backends
from training.signals import EXIT_DONE

from ..conftest import atomic_fp8_backend


def test_auto_follows_torchs_deterministic_mode_already_on(make_cfg, train):
    fa.register_backend(atomic_fp8_backend("atomic_trainer_test"))
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        cfg = make_cfg("training.train_iters=2", "training.warmup_iters=1", "checkpoint.save=false")
        code, log = train(cfg)
        assert code == EXIT_DONE, log.text()
        assert "backend reference (auto:" in log.text() and "passed over: atomic_trainer_test" in log.text()
    finally:
        torch.use_deterministic_algorithms(was)
        backends._SPECS.pop("atomic_trainer_test")
        backends._INSTANCES.pop("atomic_trainer_test", None)


def test_a_deterministic_run_restores_torchs_mode(make_cfg, train):
    assert not torch.are_deterministic_algorithms_enabled()
    over = ("training.train_iters=2", "training.warmup_iters=1", "checkpoint.save=false")
    cfg = make_cfg(*over, "runtime.deterministic=true")
    code, log = train(cfg)
    assert code == EXIT_DONE, log.text()
    assert not torch.are_deterministic_algorithms_enabled()
