"""bench/variants.sh on a CPU: two commits' trees laid side by side (without results/) and one
command run in each, in the order prepared, with its commit in BENCH_COMMIT and its own output
folder; a bad ref or name is refused."""

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "variants.sh"


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    for k, v in (("user.email", "t@example.com"), ("user.name", "t")):
        _git(repo, "config", k, v)
    (repo / "results").mkdir()
    (repo / "results" / "big.json").write_text("{}")
    for text in ("one", "two"):
        (repo / "what.txt").write_text(text + "\n")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", text)
    return repo


def _run(repo, *args, env=None):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, capture_output=True, text=True, env=env)


def test_prepare_and_run_in_each_tree(tmp_path):
    repo = _repo(tmp_path)
    first = _git(repo, "rev-parse", "--short", "HEAD~1").strip()
    prep = _run(repo, "prepare", f"old={first}", "new=HEAD")
    assert prep.returncode == 0, prep.stderr
    assert (repo / ".variants" / "old" / "what.txt").read_text() == "one\n"
    assert (repo / ".variants" / "new" / "what.txt").read_text() == "two\n"
    assert not (repo / ".variants" / "new" / "results").exists()
    assert _git(repo, "status", "--short") == ""  # .variants/ is ignored
    out = tmp_path / "out"
    cmd = 'cat what.txt > "$VOUT/seen"; echo "$BENCH_COMMIT" >> "$VOUT/seen"'
    res = _run(repo, "run", cmd, env={"OUT": str(out), "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    assert (out / "old" / "seen").read_text().split() == ["one", first]
    assert (out / "new" / "seen").read_text().split()[0] == "two"
    assert [line.split()[1] for line in (out / "status.txt").read_text().splitlines()] == ["old", "new"]


def test_bad_input_is_refused_and_loses_nothing(tmp_path):
    repo = _repo(tmp_path)
    assert _run(repo, "run", "true").returncode == 2  # nothing prepared
    assert _run(repo, "neither").returncode == 2
    assert _run(repo, "prepare", "kept=HEAD").returncode == 0
    for bad in (("HEAD", "no-such-ref"), ("bad/name=HEAD",)):
        res = _run(repo, "prepare", *bad)
        assert res.returncode == 2 and res.stderr.startswith("variants: "), res.stderr
        assert (repo / ".variants" / "kept" / "COMMIT").exists()  # the earlier trees stay
