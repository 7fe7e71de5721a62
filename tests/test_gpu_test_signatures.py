"""The GPU test modules' test signatures, checked on the CPU machine.

The GPU modules skip at import without a Hopper GPU, so pytest never collects them here and a
mistake in their parametrization only shows on the GPU machine, after a device call: on 2026-12-05
``test_triton_postprocess_equals_fa4`` lost its ``@pytest.mark.parametrize`` decorators to a helper
put above it, and the H200 answered "fixture 'recipe' not found". This reads each module's syntax
tree (no import) and checks, for every test function at module level, that each argument is
parametrized or a fixture (pytest's, a plugin's, a conftest's or the module's own), and that no
function other than a test carries a parametrize mark.
"""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# pytest's and the plugins' fixtures the GPU tests may ask for (pytest-xdist, pytest-subtests)
BUILTIN_FIXTURES = frozenset(
    "request tmp_path tmp_path_factory tmpdir tmpdir_factory monkeypatch capsys capsysbinary capfd "
    "capfdbinary caplog recwarn pytestconfig record_property record_testsuite_property "
    "record_xml_attribute doctest_namespace worker_id testrun_uid subtests".split()
)


def _gpu_modules() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if "pytest.mark.gpu" in p.read_text())


def _is_mark(node: ast.expr, name: str) -> bool:
    """``pytest.mark.<name>(...)`` or ``pytest.<name>(...)`` (``pytest.fixture``)."""
    func = node.func if isinstance(node, ast.Call) else node
    return isinstance(func, ast.Attribute) and func.attr == name


def _parametrized(fn: ast.FunctionDef) -> set[str]:
    names = set()
    for dec in fn.decorator_list:
        if isinstance(dec, ast.Call) and _is_mark(dec, "parametrize") and dec.args:
            first = dec.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names |= {n.strip() for n in first.value.split(",") if n.strip()}
            elif isinstance(first, (ast.List, ast.Tuple)):
                names |= {e.value for e in first.elts if isinstance(e, ast.Constant)}
    return names


def _fixtures(tree: ast.Module) -> set[str]:
    out = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(_is_mark(d, "fixture") for d in node.decorator_list):
            out.add(node.name)
    return out


def _conftest_fixtures(module: Path) -> set[str]:
    """The fixtures of every conftest.py from the tests folder down to the module's folder."""
    out = set()
    folder = module.parent
    while folder.is_relative_to(TESTS):
        conftest = folder / "conftest.py"
        if conftest.exists():
            out |= _fixtures(ast.parse(conftest.read_text()))
        folder = folder.parent
    return out


def signature_problems(module: Path) -> list[str]:
    tree = ast.parse(module.read_text())
    known = BUILTIN_FIXTURES | _conftest_fixtures(module) | _fixtures(tree)
    problems = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        params = _parametrized(node)
        if not node.name.startswith("test"):
            if params:
                names = sorted(params)
                problems.append(f"{module.name}: {node.name} is not a test but is parametrized by {names}")
            continue
        args = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        for arg in args:
            if arg not in params and arg not in known:
                problems.append(f"{module.name}: {node.name}({arg}) is neither parametrized nor a fixture")
        for name in sorted(params - set(args)):
            problems.append(f"{module.name}: {node.name} is parametrized by {name!r}, which it does not take")
    return problems


def test_there_are_gpu_modules_to_check():
    assert len(_gpu_modules()) >= 10


@pytest.mark.parametrize("module", _gpu_modules(), ids=lambda p: str(p.relative_to(TESTS)))
def test_gpu_test_signatures(module):
    assert signature_problems(module) == []


def test_the_check_finds_the_mistake_of_2026_12_05(tmp_path):
    """The decorators of a test left on the helper above it, as in 85a03a6."""
    bad = tmp_path / "test_bad.py"
    bad.write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('recipe', ['fp8'])\n"
        "def _helper(x):\n    return x\n\n"
        "def test_thing(recipe, tmp_path):\n    pass\n"
    )
    got = signature_problems(bad)
    assert got == [
        "test_bad.py: _helper is not a test but is parametrized by ['recipe']",
        "test_bad.py: test_thing(recipe) is neither parametrized nor a fixture",
    ]
