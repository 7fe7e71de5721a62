"""The trainer's own state: the counters a checkpoint saves next to the engine's model and optimizer.

    state = TrainerState(data_identity=data.identity, world_size=env.world_size)
    state.iteration += 1                                  # ... the loop counts
    finish_save(..., trainer_state=state.state_dict())   # trainer_state.json of the checkpoint
    saved = TrainerState.from_state_dict(read_json(ckpt_dir / TRAINER_STATE_FILE))   # on resume

``state_dict()`` / ``load_state_dict()`` follow torch's (and torchtitan's) convention. The dict is
the ``trainer_state.json`` of a checkpoint, one key per field (the keys the trainer has always
written); ``data_identity``, ``world_size``, ``origin`` and ``data_content`` may be missing from a
file (None), the counters may not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["TrainerState"]


@dataclass(kw_only=True)
class TrainerState:
    """Where the run stands, and what it ran with.

    Attributes:
        iteration: optimizer steps done (applied or skipped).
        consumed_samples / consumed_tokens: global samples and tokens consumed; the data loader
            resumes at ``consumed_samples``.
        nonfinite_count: steps skipped because the loss or the gradients were not finite.
        data_identity: the training dataset's identity (compared on resume, ``data.identity``).
        world_size: the number of processes that ran (the GPU engine restores the per-rank RNG
            states only at the same size).
        origin: the checkpoint this run's trajectory started from when ``checkpoint.load`` named one
            (or a directory holding one) rather than ``auto``: its resolved path, carried through every
            later save and resume. None for a trajectory started from scratch (and in checkpoints
            saved before 2026-12-06). A relaunch with the same ``checkpoint.load`` resumes the
            trajectory's own newest save, and pruning counts only checkpoints of the trajectory being
            saved (``training.trainer``, ``checkpoint.prune``).
        data_content: :func:`data.loader.content_key` of the prepared files the training data was
            built from (compared on resume where both sides have it: a corpus prepared again at the
            same prefixes keeps ``data_identity``, which names paths, not contents). None in
            checkpoints saved before 2026-12-06.
    """

    iteration: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0
    nonfinite_count: int = 0
    data_identity: str | None = None
    world_size: int | None = None
    origin: str | None = None
    data_content: str | None = None

    @property
    def applied_updates(self) -> int:
        """Optimizer updates applied: every step but the skipped non-finite ones."""
        return self.iteration - self.nonfinite_count

    def state_dict(self) -> dict:
        """The fields as a JSON-able dict (the keys of ``trainer_state.json``); ``origin`` only where
        set, so that a run without one writes the file of checkpoints saved before the field."""
        state = dataclasses.asdict(self)
        for key in ("origin", "data_content"):
            if state[key] is None:
                del state[key]
        return state

    def load_state_dict(self, state: dict) -> None:
        """Set every field from ``state`` (a :meth:`state_dict`, e.g. a checkpoint's ``trainer_state.json``).

        Raises:
            KeyError: a counter is missing (``data_identity``, ``world_size``, ``origin`` and
                ``data_content`` may be).
        """
        self.iteration = state["iteration"]
        self.consumed_samples = state["consumed_samples"]
        self.consumed_tokens = state["consumed_tokens"]
        self.nonfinite_count = state["nonfinite_count"]
        self.data_identity = state.get("data_identity")
        self.world_size = state.get("world_size")
        self.origin = state.get("origin")
        self.data_content = state.get("data_content")

    @classmethod
    def from_state_dict(cls, state: dict) -> TrainerState:
        """A new state loaded from ``state`` (see :meth:`load_state_dict`)."""
        new = cls()
        new.load_state_dict(state)
        return new
