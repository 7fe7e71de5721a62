"""Batch sampler driven by consumed samples (Megatron's ``MegatronPretrainingSampler`` semantics).

The only resume state is ``consumed_samples`` (a global count over all data-parallel ranks).
Resuming is exact when the dataset is rebuilt identically (same blend, seed, sequence length,
split and number of samples - see :func:`data.loader.dataset_identity`): the sampler then starts at
global sample index ``consumed_samples``, i.e. with the next unseen sample.
"""

from __future__ import annotations

from collections.abc import Iterator

from data.errors import DataError


class ConsumedSamplesSampler:
    """Yield per-rank micro-batches of dataset indices, starting after ``consumed_samples``.

    Global sample indices ``consumed_samples, consumed_samples + 1, ...`` are grouped into global
    micro-batches of ``micro_batch_size * data_parallel_size``; rank ``r`` gets the slice
    ``[r * micro_batch_size, (r + 1) * micro_batch_size)`` of each.

    Args:
        total_samples: length of the dataset (indices ``0 .. total_samples - 1``).
        consumed_samples: global samples already consumed (0 for a fresh run).
        micro_batch_size: samples per rank per batch.
        data_parallel_rank: this rank, ``0 <= rank < data_parallel_size``.
        data_parallel_size: number of data-parallel ranks.
        drop_last: drop a final incomplete global micro-batch (Megatron's default True).

    Raises:
        DataError: non-positive sizes, a rank out of range, or ``consumed_samples`` not in
            ``[0, total_samples)`` (nothing left to consume).
    """

    def __init__(
        self,
        *,
        total_samples: int,
        consumed_samples: int,
        micro_batch_size: int,
        data_parallel_rank: int,
        data_parallel_size: int,
        drop_last: bool = True,
    ) -> None:
        if total_samples <= 0:
            raise DataError(f"total_samples must be > 0, got {total_samples}")
        if not 0 <= consumed_samples < total_samples:
            raise DataError(
                f"consumed_samples={consumed_samples} is outside [0, {total_samples}): "
                "no samples left to consume (build the dataset with more samples)"
            )
        if micro_batch_size <= 0 or data_parallel_size <= 0:
            raise DataError(
                f"micro_batch_size and data_parallel_size must be > 0, got "
                f"{micro_batch_size}, {data_parallel_size}"
            )
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise DataError(f"data_parallel_rank {data_parallel_rank} not in [0, {data_parallel_size})")
        self.total_samples = int(total_samples)
        self.consumed_samples = int(consumed_samples)
        self.micro_batch_size = int(micro_batch_size)
        self.data_parallel_rank = int(data_parallel_rank)
        self.data_parallel_size = int(data_parallel_size)
        self.drop_last = drop_last
        self._global = self.micro_batch_size * self.data_parallel_size

    def __len__(self) -> int:
        """Number of micro-batches this sampler yields."""
        remaining = self.total_samples - self.consumed_samples
        full, rest = divmod(remaining, self._global)
        if rest and not self.drop_last and rest > self.data_parallel_rank * self.micro_batch_size:
            return full + 1
        return full

    def __iter__(self) -> Iterator[list[int]]:
        """Yield lists of ``micro_batch_size`` int indices (a last shorter one if not drop_last)."""
        start = self.data_parallel_rank * self.micro_batch_size
        end = start + self.micro_batch_size
        batch: list[int] = []
        for idx in range(self.consumed_samples, self.total_samples):
            batch.append(idx)
            if len(batch) == self._global:
                yield batch[start:end]
                batch = []
        if batch and not self.drop_last and batch[start:end]:
            yield batch[start:end]


def build_dataloader(
    dataset,
    *,
    consumed_samples: int,
    micro_batch_size: int,
    data_parallel_rank: int = 0,
    data_parallel_size: int = 1,
    num_workers: int = 0,
    pin_memory: bool = False,
    drop_last: bool = True,
):
    """A ``torch.utils.data.DataLoader`` over ``dataset`` with a :class:`ConsumedSamplesSampler`.

    Args:
        dataset: a GPTDataset / BlendedDataset from :func:`data.loader.build_datasets`.
        consumed_samples: global samples already consumed (from the checkpoint).
        micro_batch_size, data_parallel_rank, data_parallel_size, drop_last: see the sampler.
        num_workers: DataLoader worker processes (0 = in the training process). Workers ignore
            SIGINT: Ctrl-C at a terminal reaches them too, and the training process, which finishes
            its step and saves on a first Ctrl-C, still needs them for that step's batches.
        pin_memory: pin host memory for faster H2D copies (only useful with CUDA).

    Returns:
        DataLoader yielding dicts of stacked tensors, e.g. ``tokens`` / ``labels`` int64
        ``[micro_batch_size, seq_length]``, ``loss_mask`` float32 and ``position_ids`` int64 of the
        same shape (plus ``attention_mask`` bool ``[b, 1, s, s]`` if enabled, and ``dataset_id``
        for blends).

    Raises:
        DataError: see :class:`ConsumedSamplesSampler`.
    """
    import torch

    sampler = ConsumedSamplesSampler(
        total_samples=len(dataset),
        consumed_samples=consumed_samples,
        micro_batch_size=micro_batch_size,
        data_parallel_rank=data_parallel_rank,
        data_parallel_size=data_parallel_size,
        drop_last=drop_last,
    )
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        worker_init_fn=ignore_sigint if num_workers > 0 else None,
    )


def ignore_sigint(worker_id: int | None = None) -> None:
    """DataLoader ``worker_init_fn``: the worker ignores SIGINT (the training process handles it)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
