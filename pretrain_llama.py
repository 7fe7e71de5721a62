"""Llama-3.1 pretraining with low-precision attention: the main job.

    python pretrain_llama.py                                   # the embedded default (configs/default.yaml)
    python pretrain_llama.py --config configs/NAME.yaml [section.key=value ...]
    python pretrain_llama.py --config configs/llama3_1_8b_100b_fp8.yaml --dry-run --world-size 64
    python pretrain_llama.py --config ... --dry-run --world-size 64 --mfu 0.35 --gpu-memory-gib 79.6
    torchrun --nproc-per-node 8 pretrain_llama.py --config ...   # or one srun task per GPU under Slurm

``--dry-run`` prints the plan (layout, batch arithmetic, steps, memory and FLOPs per GPU), the
wall-clock and GPU-hour estimate at a stated MFU (``--mfu``, default 0.40) of
``logging.peak_flops_per_gpu``, and checks the memory estimate against one GPU's memory (a warning
on stderr when it does not fit); it needs no GPU and no data.

The default trains a small Llama-3.1-architecture model on the embedded corpus with the ``fp8``
attention recipe (on a GPU the cute backend where the cute extra is installed, else Triton; the
reference backend on a CPU). Every run resumes from
the newest complete checkpoint in its run directory. Exit codes: see ``training/signals.py``
(0 done, 2 config error, 3 preempted or a first Ctrl-C, 4 time budget, 5 non-finite stop, 6 out of
GPU memory, 130 a second Ctrl-C). A configuration, data or resume error is one message on stderr, no
traceback. The loop lives in ``training/``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings


def _fraction(text: str) -> float:
    v = float(text)
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], e.g. 0.4; got {text}")
    return v


def _positive_float(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", help="YAML config (default: the embedded default, configs/default.yaml)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="resolve the config for --world-size and print the plan; needs no GPU and no data",
    )
    p.add_argument(
        "--world-size", type=int, default=None, help="world size for --dry-run (default: $WORLD_SIZE or 1)"
    )
    p.add_argument(
        "--mfu",
        type=_fraction,
        default=None,
        help="MFU the --dry-run time estimate assumes, a fraction (default 0.40; measured on an H200: "
        "0.44 for bf16)",
    )
    p.add_argument(
        "--gpu-memory-gib",
        type=_positive_float,
        default=None,
        help="GPU memory the --dry-run memory estimate is checked against (default: the visible GPU's, "
        "else an H200's 140.4 GiB)",
    )
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    args = p.parse_args(argv)
    # the dry run's options mean nothing to a training run: a --world-size there would be ignored
    # (the launcher sets the world size), so it is refused rather than dropped silently
    given = [
        f"--{k.replace('_', '-')}"
        for k in ("world_size", "mfu", "gpu_memory_gib")
        if getattr(args, k) is not None
    ]
    if given and not args.dry_run:
        p.error(
            f"{', '.join(given)}: for --dry-run only; a training run takes its world size from the "
            "launcher (torchrun --nproc-per-node, srun) and its GPU from the machine"
        )
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # SIGTERM/SIGUSR1/Ctrl-C in the imports and the config load (seconds) are recorded and acted on
    # once they are done (training.signals.install_deferred_stop), and the exit code is written
    # without importing torch again (found in review, 2026-12-06: 143/138 with no message, or a
    # second traceback)
    from training.signals import (
        EXIT_INTERRUPTED,
        EXIT_PREEMPTED,
        StartupStop,
        install_deferred_stop,
        restore_handlers,
        write_exit_code,
    )

    previous = {} if args.dry_run else install_deferred_stop()
    try:
        return _main(args, previous)
    except KeyboardInterrupt:  # a second Ctrl-C in the loop, or one before it (training.signals)
        print("pretrain_llama: stopped by Ctrl-C; nothing saved since the last checkpoint", file=sys.stderr)
        if not args.dry_run:
            write_exit_code(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED
    except StartupStop as stop:  # recorded before the trainer's start-up (Trainer.run handles its own)
        from training.ranks import ranks_from_env

        if ranks_from_env()[0] == 0:
            print(
                f"pretrain_llama: preempted ({signal.Signals(stop.signum).name}) during start-up, before the "
                "trainer started: nothing to save; the same command relaunched resumes from its newest "
                "complete checkpoint",
                file=sys.stderr,
            )
        write_exit_code(EXIT_PREEMPTED)
        return EXIT_PREEMPTED
    finally:
        restore_handlers(previous)


def _main(args, handlers: dict) -> int:
    # megatron-core warns at import about optional packages (TE, Apex); the log reports what is used
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.core\..*")
    from training.config import load_config
    from training.signals import EXIT_CONFIG, raise_pending_stop, restore_handlers, write_exit_code

    try:
        cfg = load_config(args.config, args.overrides)
    except ValueError as err:
        print(f"pretrain_llama: configuration error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    raise_pending_stop()  # a signal during the imports and the config load
    if args.dry_run:
        from training.plan import format_plan, make_plan

        world = args.world_size
        if world is None:
            text = os.environ.get("WORLD_SIZE", "1")
            if not text.strip().isdigit():
                print(
                    f"pretrain_llama --dry-run: $WORLD_SIZE={text!r} is not a number; pass --world-size N",
                    file=sys.stderr,
                )
                return EXIT_CONFIG
            world = int(text)
        try:
            plan = make_plan(cfg, world)
        except ValueError as err:
            print(f"pretrain_llama --dry-run: impossible plan: {err}", file=sys.stderr)
            return EXIT_CONFIG
        print(format_plan(plan))
        _print_estimate(plan, cfg, mfu=args.mfu, gpu_memory_gib=args.gpu_memory_gib)
        return 0
    from training.trainer import Trainer

    trainer = Trainer(
        cfg,
        log=lambda msg: print(msg, flush=True),
        log_error=lambda msg: print(msg, file=sys.stderr, flush=True),
    )
    code = trainer.run()  # its own start-up handling from here (training.signals)
    restore_handlers(handlers)  # after the run: the actions the signals had before this launch
    write_exit_code(code)
    return code


def _print_estimate(plan, cfg, *, mfu: float | None, gpu_memory_gib: float | None) -> None:
    """The dry run's time estimate and memory check (stdout), and the memory warning (stderr)."""
    from training.plan import (
        ASSUMED_MFU,
        H200_MEMORY_BYTES,
        corpus_warning,
        estimate_time,
        format_estimate,
        missing_data_warnings,
    )

    if gpu_memory_gib is not None:
        memory, name = gpu_memory_gib * 1024**3, "the GPU of --gpu-memory-gib"
    else:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            memory, name = props.total_memory, f"the visible {props.name}"
        else:
            memory, name = H200_MEMORY_BYTES, "an H200 (no GPU visible; --gpu-memory-gib sets another)"
    est = estimate_time(
        plan, peak_flops_per_gpu=cfg.logging.peak_flops_per_gpu, mfu=ASSUMED_MFU if mfu is None else mfu
    )
    lines, warnings = format_estimate(plan, est, gpu_memory_bytes=memory, gpu_name=name)
    corpus = corpus_warning(cfg, plan)
    warnings += ([corpus] if corpus else []) + missing_data_warnings(cfg)
    print("\n".join(lines))
    for w in warnings:
        print(f"pretrain_llama --dry-run: warning: {w}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
