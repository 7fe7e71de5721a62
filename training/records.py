"""Which records of ``metrics.jsonl`` a launch supersedes: the rule every reader of the file applies.

Each launch of a run writes one ``event`` record before its first step: ``start`` (a fresh start,
step 0) or ``resume`` (from the checkpoint of its ``step``). It trains the steps after that step
again, so the records of those steps that were read before it belong to a launch whose state the run
did not continue from: the launch killed after its last checkpoint, the branch abandoned by a
rollback (``checkpoint.load=<iter path>``), or an earlier run in the same ``runtime.output_dir``
that a fresh start replaced (found in review, 2026-12-06: its later steps and final validation were
read as the new run's).

A ``resume`` event also lists, under ``allowed_changes``, the differences between the resumed
checkpoint's config and the launch's that ``checkpoint.allow_config_change`` let through (each
``[key, value in the checkpoint, value now]``, ``data.identity`` and ``data.content`` among them):
the steps up to the resume were trained under the old values. No heavy imports: the comparison
tools read run directories with this on any machine.
"""

from __future__ import annotations

__all__ = ["relaunch_step"]


def relaunch_step(rec: dict) -> int | None:
    """The step after which the launch that wrote ``rec`` trains again, for a ``start`` (0) or
    ``resume`` event record (its ``step``, when an int); None for any other record. Records of later
    steps read before ``rec`` are superseded by it (see the module docstring)."""
    if rec.get("kind") != "event":
        return None
    if rec.get("event") == "start":
        return 0
    step = rec.get("step")
    if rec.get("event") == "resume" and isinstance(step, int) and not isinstance(step, bool):
        return step
    return None
