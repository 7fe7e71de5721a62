"""This process's rank, world size and local rank from the launcher's environment variables, without
importing torch: :func:`training.signals.write_exit_code` reads them when a Ctrl-C or a signal stops
the start-up, possibly while torch is still being imported (found in review, 2026-12-06: importing
it again there raised a second traceback). :mod:`training.distenv` builds the process group on them.

Rank variables, in order: ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` (torchrun, or a launcher that
exports them), else ``SLURM_PROCID`` / ``SLURM_NTASKS`` / ``SLURM_LOCALID`` (one srun task per GPU),
else a single process.
"""

from __future__ import annotations

import os

__all__ = ["ranks_from_env"]


def _env_int(*names: str) -> int | None:
    for name in names:
        if os.environ.get(name, "").strip():
            return int(os.environ[name])
    return None


def ranks_from_env() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from torchrun or Slurm variables; (0, 1, 0) when neither is set."""
    rank = _env_int("RANK")
    if rank is not None:
        return rank, _env_int("WORLD_SIZE") or 1, _env_int("LOCAL_RANK") or 0
    rank = _env_int("SLURM_PROCID")
    if rank is not None and (_env_int("SLURM_NTASKS") or 1) > 1:
        return rank, _env_int("SLURM_NTASKS"), _env_int("SLURM_LOCALID") or 0
    return 0, 1, 0
