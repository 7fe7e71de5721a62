"""CLI: prepare the default corpus or tokenize any ``datasets`` / file source into indexed datasets.

Examples::

    python -m data.prepare --default                      # KJV + CPython stdlib -> cache/data/default
    python -m data.prepare --input docs/*.jsonl --text-key text --output-prefix cache/data/mine/docs \\
        --split 98,1,1 --workers 2
    python -m data.prepare --files-root /usr/share/doc/python3-doc --glob '**/*.txt' --output-prefix ...
    python -m data.prepare --input a.parquet --tokenizer hf --tokenizer-path /models/llama3-hf ...

Prints documents, tokens and elapsed time.  Exit status 2 on bad input (message on stderr), 130 on
Ctrl-C (the outputs being written are removed; complete ones stay and are reused).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from data.errors import DataError, MissingDependencyError

_EXT_BUILDERS = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".txt": "text",
    ".text": "text",
    ".csv": "csv",
    ".arrow": "arrow",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m data.prepare", description=__doc__.split("\n\n")[0])
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--default", action="store_true", help="prepare the embedded default corpus")
    what.add_argument("--input", nargs="+", metavar="FILE", help="local data files / globs for `datasets`")
    what.add_argument("--hub", metavar="NAME", help="a HuggingFace hub dataset name (needs a network)")
    what.add_argument("--files-root", metavar="DIR", help="one document per file under DIR (see --glob)")
    p.add_argument(
        "--cache-dir",
        help="data cache root for --default (default $PRETRAIN_DATA_CACHE or <repo>/cache/data)",
    )
    p.add_argument("--force", action="store_true", help="prepare again even if a verified output exists")
    p.add_argument(
        "--format",
        choices=sorted(set(_EXT_BUILDERS.values())),
        help="datasets builder for --input (default: from the file extension)",
    )
    p.add_argument("--text-key", default="text", help="column holding the text (default: text)")
    p.add_argument("--hub-split", default="train", help="datasets split to read (default: train)")
    p.add_argument(
        "--sample-by",
        default="document",
        choices=["line", "paragraph", "document"],
        help="for text files: what one document is (default: the whole file)",
    )
    p.add_argument("--glob", action="append", help="pattern(s) under --files-root (default **/*.txt)")
    p.add_argument("--output-prefix", help="output path prefix (required unless --default)")
    p.add_argument("--name", help="corpus label (default: basename of --output-prefix)")
    p.add_argument("--tokenizer", default="llama3", choices=["llama3", "hf"])
    p.add_argument(
        "--tokenizer-path",
        help="tiktoken file (llama3, default: the one in llama-models) or "
        "HF tokenizer directory (hf, required)",
    )
    p.add_argument("--no-bos", action="store_true", help="do not prepend BOS to documents")
    p.add_argument("--no-eos", action="store_true", help="do not append EOS to documents")
    p.add_argument("--model-vocab-size", type=int, help="fail unless the tokenizer fits this embedding size")
    p.add_argument(
        "--workers",
        type=int,
        default=max(1, min(4, os.cpu_count() or 1)),
        help="tokenizer processes (default: min(4, cpus))",
    )
    p.add_argument("--split", help="train,valid,test weights, e.g. 98,1,1 (default: no split, one output)")
    p.add_argument("--split-seed", type=int, default=1234)
    p.add_argument(
        "--on-empty",
        choices=["skip", "error"],
        default="skip",
        help="empty/whitespace-only documents: skip and count (default) or error",
    )
    p.add_argument(
        "--on-invalid",
        choices=["skip", "error"],
        default="error",
        help="non-UTF-8 / non-text documents: error (default) or skip and count",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _builder_for(files: list[str], fmt: str | None) -> str:
    if fmt:
        return fmt
    kinds = {_EXT_BUILDERS.get(os.path.splitext(f)[1].lower()) for f in files}
    if len(kinds) != 1 or None in kinds:
        raise DataError(
            f"cannot infer the format of {files}; pass --format "
            f"({', '.join(sorted(set(_EXT_BUILDERS.values())))})"
        )
    return kinds.pop()


def run(args: argparse.Namespace) -> int:
    """Execute parsed arguments; returns the exit status (0)."""
    t0 = time.perf_counter()
    progress = not args.no_progress
    if args.default:
        from data.corpus import default_cache_dir, ensure_default_corpus

        cache = args.cache_dir or default_cache_dir()
        blend = ensure_default_corpus(cache, workers=args.workers, force=args.force, progress=progress)
        dt = time.perf_counter() - t0
        for s, prefixes in blend.prefixes.items():
            print(f"  {s}: " + " ".join(f"{w:g}*{p}" for w, p in zip(blend.weights, prefixes, strict=True)))
        print(
            f"default corpus: {blend.documents} documents, {blend.tokens} tokens, {dt:.1f} s "
            f"-> {os.path.join(str(cache), 'default')}"
        )
        return 0

    from data.preprocess import prepare_corpus
    from data.sources import DatasetsSource, FilesSource
    from data.tokenizer import TokenizerSpec

    if not args.output_prefix:
        raise DataError("--output-prefix is required (unless --default)")
    name = args.name or os.path.basename(args.output_prefix)
    if (args.input or args.hub) and not progress:
        from data.errors import require

        require("datasets", "datasets", "Reading HuggingFace datasets sources").disable_progress_bars()
    if args.input:
        source = DatasetsSource(
            builder=_builder_for(args.input, args.format),
            data_files=args.input,
            text_key=args.text_key,
            split=args.hub_split,
            sample_by=args.sample_by,
            name=name,
        )
    elif args.hub:
        source = DatasetsSource(hub_name=args.hub, text_key=args.text_key, split=args.hub_split, name=name)
    else:
        source = FilesSource(root=args.files_root, patterns=tuple(args.glob or ["**/*.txt"]), name=name)
    if args.tokenizer == "hf" and not args.tokenizer_path:
        raise DataError("--tokenizer hf needs --tokenizer-path DIR (a local HuggingFace tokenizer directory)")
    spec = TokenizerSpec(
        kind=args.tokenizer, path=args.tokenizer_path, add_bos=not args.no_bos, add_eos=not args.no_eos
    )
    res = prepare_corpus(
        source,
        args.output_prefix,
        tokenizer=spec,
        split=args.split,
        split_seed=args.split_seed,
        workers=args.workers,
        on_empty=args.on_empty,
        on_invalid=args.on_invalid,
        model_vocab_size=args.model_vocab_size,
        progress=progress,
        reuse=not args.force,
        log=None,
    )
    dt = time.perf_counter() - t0
    for ex in res.skipped_examples:
        print(f"  skipped {ex}")
    for k, p in res.prefixes.items():
        print(f"  {k}: {p} ({res.documents_per_split[k]} documents, {res.tokens_per_split[k]} tokens)")
    print(f"{res.summary()}; total {dt:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 on bad input, with the reason on stderr)."""
    args = _parser().parse_args(argv)
    if args.workers < 1:
        print("error: --workers must be >= 1", file=sys.stderr)
        return 2
    try:
        return run(args)
    except (DataError, FileNotFoundError, MissingDependencyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the writers removed their temporary files on the way out
        print("interrupted by Ctrl-C: the outputs being written were removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
