"""Bad input to the tools' CLIs (compare_runs, fidelity, multi_gpu_report): exit code 2 and one line
on stderr, never a traceback."""

from __future__ import annotations

import json

import compare_runs
import fidelity
import multi_gpu_report
import pytest
import torch
from rundir import metrics_lines


def run_main(main, capsys, argv) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


def test_compare_runs_out_that_cannot_be_a_directory(make_run, tmp_path, capsys):
    a = make_run("a", seed=0, n_steps=40)
    b = make_run("b", recipe="fp8", seed=0, n_steps=40)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for out in (blocker, blocker / "sub"):
        code, err = run_main(compare_runs.main, capsys, [str(a), str(b), "--out", str(out), "--no-plots"])
        assert code == 2
        assert err == f"compare_runs: --out {out}: {blocker} is a file, not a directory; name another --out\n"


def test_compare_runs_seed_bootstrap_with_one_seed(make_run, capsys):
    """Found in review (2026-12-06): --bootstrap hier with one seed in an arm ended in a StatsError
    traceback and exit code 1."""
    a = make_run("a", seed=0, n_steps=40)
    a2 = make_run("a2", seed=1, n_steps=40)
    b = make_run("b", recipe="fp8", seed=0, n_steps=40)
    for method in ("hier", "seeds"):
        code, err = run_main(compare_runs.main, capsys, [str(a), str(a2), str(b), "--bootstrap", method])
        assert code == 2
        assert err == (
            f"compare_runs: --bootstrap {method} for arm attn=fp8,proj=bf16 against attn=bf16,proj=bf16: "
            f"bootstrap method {method!r} resamples seeds and needs >= 2 runs per arm (have 1 and 2); use "
            "'blocks' or 'auto'\n"
        )


def test_compare_runs_non_utf8_metrics_line(make_run, capsys):
    a = make_run("a", seed=0, n_steps=40)
    b = make_run("b", recipe="fp8", seed=0, n_steps=40)
    with open(b / "metrics.jsonl", "ab") as f:
        f.write(b'{"kind": "event", "detail": "\xff"}\n')
    code, err = run_main(compare_runs.main, capsys, [str(a), str(b), "--no-plots"])
    assert code == 2
    assert err.startswith(f"compare_runs: {b / 'metrics.jsonl'}:") and "not valid UTF-8" in err
    code, _ = run_main(compare_runs.main, capsys, [str(a), str(b), "--skip-malformed", "--n-boot", "20"])
    assert code == 0


def test_rundir_yields_a_non_utf8_line_as_a_problem(tmp_path):
    (tmp_path / "metrics.jsonl").write_bytes(b'{"kind": "train"}\n\xfe\xff\n{"kind": "valid"}\n')
    assert [(n, problem) for n, _, problem in metrics_lines(tmp_path)] == [
        (1, None),
        (2, "not valid UTF-8"),
        (3, None),
    ]


@pytest.mark.parametrize("flag", ["--windows", "--n-boot", "--ci"])
def test_compare_runs_non_numbers(make_run, capsys, flag):
    code, err = run_main(compare_runs.main, capsys, ["a", "b", flag, "abc"])
    assert code == 2
    assert f"argument {flag}: must be " in err and "got 'abc'" in err and "_positive_int" not in err


FIDELITY_SMALL = ["--seqlen", "32", "--headdim", "16", "--families", "normal", "--recipes", "bf16"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backend", "nope"], "unknown attention backend 'nope'; known: auto, "),
        (["--recipes", "nope"], "unknown attention recipe 'nope'; known recipes: bf16, fp8"),
        (["--families", "spiky"], "--families spiky: unknown input family; choose from normal, outliers"),
        (["--families", "std=-1"], "--families std=-1: std=X needs a number X > 0"),
        (["--device", "gpu0"], "--device 'gpu0' is not a torch device; use cpu or cuda (cuda:N)"),
        (["--hq", "3", "--hkv", "2"], "--hq 3 must be a multiple of --hkv 2"),
        (["--seqlen", "0"], "--seqlen must be >= 1, got 0"),
        (["--headdim", "8"], "reference backend runs head dims multiples of 16 up to 256, not 8"),
        (["--recipes", "bf16+hadamard"], "applies to the training recipes with quantized Q/K"),
        (
            ["--recipes", "fp8+hadamard", "--headdim", "48"],
            "--headdim 48: fp8+hadamard needs a head dim that is a power of two",
        ),
        (["--families", "channels=x"], "--families channels=x: channels=X needs a number X > 0"),
        (["--qk-rotation-seed", "-1"], "--qk-rotation-seed must be an integer in [0, 2^63), got -1"),
        (
            ["--backend-option", "tiles"],
            "--backend-option 'tiles': expected NAME=VALUE, e.g. 'tiles=(128, 128, 2)'",
        ),
        (
            ["--backend-option", "tiles=(128, 128, 2)"],
            "--backend-option ['tiles']: backend 'reference' accepts",
        ),
        (["--backend-option", "block_n=32", "--backend-option", "block_n=16"], "block_n given twice"),
    ],
)
def test_fidelity_arguments_that_cannot_run(capsys, args, message):
    code, err = run_main(fidelity.main, capsys, [*FIDELITY_SMALL, *args])
    assert code == 2
    assert err.startswith("fidelity: ") and message in err and len(err.splitlines()) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_fidelity_cuda_without_a_gpu(capsys):
    code, err = run_main(fidelity.main, capsys, [*FIDELITY_SMALL, "--device", "cuda"])
    assert code == 2 and "--device cuda: no CUDA device here; use --device cpu" in err


def test_fidelity_out_under_a_file(capsys, tmp_path):
    (tmp_path / "f").write_text("")
    code, err = run_main(fidelity.main, capsys, [*FIDELITY_SMALL, "--out", str(tmp_path / "f" / "x")])
    assert code == 2 and f"--out {tmp_path / 'f' / 'x'}: cannot create {tmp_path / 'f'}" in err


def test_multi_gpu_report_unreadable_bench_files(tmp_path, capsys):
    (tmp_path / "runs.tsv").write_bytes(b"\xff\xfelabel\n")
    code, err = run_main(multi_gpu_report.main, capsys, [str(tmp_path)])
    assert code == 2
    tsv = tmp_path / "runs.tsv"
    assert err == f"multi_gpu_report: {tsv} is not UTF-8 text (byte 0): not written by bench/multi_gpu.sh\n"
    (tmp_path / "runs.tsv").write_text("label\trun_dir\tnproc\trc\twall_s\tstatus\tcommand\n")
    (tmp_path / "bench.env").write_text("device=cuda\nnproc=two\n")
    code, err = run_main(multi_gpu_report.main, capsys, [str(tmp_path)])
    assert code == 2
    assert err == f"multi_gpu_report: {tmp_path / 'bench.env'}: nproc='two' is not an integer\n"


def test_fidelity_backend_options_reach_the_backend_and_the_header(capsys, tmp_path):
    """``--backend-option NAME=VALUE`` goes to ``fa.attention`` as a keyword (a Python literal) and
    into the table's header; the reference at block_n=16 gives other numbers than at its default."""
    out = tmp_path / "fid"
    small = ["--seqlen", "64", "--headdim", "16", "--families", "normal", "--recipes", "fp8"]
    assert fidelity.main([*small, "--backend-option", "block_n=16", "--out", str(out)]) == 0
    md = (out.parent / "fid.md").read_text()
    assert "backend `reference` with options {'block_n': 16}" in md
    assert fidelity.main([*small, "--out", str(tmp_path / "default")]) == 0
    capsys.readouterr()
    rows = [
        json.loads(p.read_text())["records"] for p in (out.parent / "fid.json", tmp_path / "default.json")
    ]
    assert rows[0][0]["recipe"] == rows[1][0]["recipe"] == "fp8" and rows[0] != rows[1]
