"""Llama-3.1 pretraining with low-precision attention: the main job.

    python pretrain_llama.py                                   # the embedded default (configs/default.yaml)
    python pretrain_llama.py --config configs/NAME.yaml [section.key=value ...]
    python pretrain_llama.py --config configs/llama3_1_8b_100b_fp8.yaml --dry-run --world-size 64
    torchrun --nproc-per-node 8 pretrain_llama.py --config ...   # or one srun task per GPU under Slurm

The default trains a small Llama-3.1-architecture model on the embedded corpus with the ``fp8``
attention recipe (Triton backend on a GPU, the reference backend on a CPU). Every run resumes from
the newest complete checkpoint in its run directory. Exit codes: see ``training/signals.py``
(0 done, 2 config error, 3 preempted or a first Ctrl-C, 4 time budget, 5 non-finite stop, 130 a
second Ctrl-C). A configuration, data or resume error is one message on stderr, no traceback. The
loop lives in ``training/``.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings


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
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="config overrides")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from training.signals import EXIT_INTERRUPTED

    try:
        return _main(args)
    except KeyboardInterrupt:  # a second Ctrl-C in the loop, or one before it (training.signals)
        print("pretrain_llama: stopped by Ctrl-C; nothing saved since the last checkpoint", file=sys.stderr)
        if not args.dry_run:
            _report_exit_code(EXIT_INTERRUPTED)
        return EXIT_INTERRUPTED


def _main(args) -> int:
    # megatron-core warns at import about optional packages (TE, Apex); the log reports what is used
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.core\..*")
    from training.config import load_config
    from training.signals import EXIT_CONFIG

    try:
        cfg = load_config(args.config, args.overrides)
    except ValueError as err:
        print(f"pretrain_llama: configuration error: {err}", file=sys.stderr)
        return EXIT_CONFIG
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
        return 0
    from training.trainer import Trainer

    code = Trainer(
        cfg,
        log=lambda msg: print(msg, flush=True),
        log_error=lambda msg: print(msg, file=sys.stderr, flush=True),
    ).run()
    _report_exit_code(code)
    return code


def _report_exit_code(code: int) -> None:
    """Write the exit code to ``$PRETRAIN_EXIT_FILE`` (rank 0 only), for launchers.

    torchrun reports any failing worker as exit code 1, which would hide the distinct codes the
    requeue logic needs (3 preempted, 4 time budget); ``launch/torchrun_node.sh`` and
    ``launch/slurm_8x8.sbatch`` read this file instead. Written atomically (temp file + rename).
    """
    from training.distenv import ranks_from_env

    path = os.environ.get("PRETRAIN_EXIT_FILE")
    if not path or ranks_from_env()[0] != 0:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{code}\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    raise SystemExit(main())
