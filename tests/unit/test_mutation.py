"""The mutation run's command (`python -m ad_mlir.bench.mutation`, a benchmark): its help, its map
from source files to tests, its seeded draw of one mutant per site, and its score. The run
itself takes an hour and cosmic-ray (the `mutation` extra), so nothing here mutates code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from ad_mlir.bench import mutation
from ad_mlir.bench.mutation import TESTS, Mutant, draw, folder, mutated_files, score, shares

ROOT = Path(__file__).resolve().parents[2]


def test_help_explains_the_run_without_cosmic_ray_installed() -> None:
    proc = subprocess.run([sys.executable, "-m", "ad_mlir.bench.mutation", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for word in ("--sample", "--seed", "--rerun", "cosmic-ray", "notes.json"):
        assert word in proc.stdout, word


def test_every_mutated_file_has_tests_that_exist() -> None:
    """Every module committed in the mutated folders, and only those (not a file in progress)."""
    files = mutated_files("HEAD", ROOT)
    assert {"ad_mlir/passes/insert_cached_attention.py", "ad_mlir/codegen/templates/region_kernel.py",
            "ad_mlir/runtime/kernels.py", "ad_mlir/llm/llm.py", "ad_mlir/llm/engine.py", "ad_mlir/llm/pages.py",
            "ad_mlir/serve/app.py", "ad_mlir/frontends/fx_import.py"} <= set(files)
    assert set(files) == set(TESTS), set(files) ^ set(TESTS)
    for file, tests in TESTS.items():
        assert tests.lit or tests.pytest, file
        paths = [*tests.lit, *(t.split("::")[0] for t in tests.pytest if t.startswith("tests/"))]
        missing = [p for p in paths if not (ROOT / p).is_file()]
        assert not missing, (file, missing)


def _mutants() -> list[Mutant]:
    """Three sites in two files of two folders, with one, two and three mutations."""
    site = {("ad_mlir/passes/a.py", 1): 1, ("ad_mlir/passes/a.py", 7): 2, ("ad_mlir/serve/b.py", 3): 3}
    return [Mutant(f, f"op{i}", i, line, 0, (line, 1)) for (f, line), n in site.items() for i in range(n)]


def test_the_draw_is_seeded_and_takes_one_mutant_per_site() -> None:
    mutants = _mutants()
    assert draw(mutants, 2, seed=5) == draw(mutants, 2, seed=5)
    assert len({m.site for m in draw(mutants, 2, seed=5)}) == 2
    everything = draw(mutants, 10, seed=1)
    assert sorted(m.site for m in everything) == sorted({m.site for m in mutants})
    drawn = {frozenset(m.id for m in draw(mutants, 3, seed=s)) for s in range(20)}
    assert len(drawn) > 1, "the seed picks among a site's mutations"


def test_each_folder_gets_its_share_of_the_sample() -> None:
    assert shares({"passes": 500, "llm": 300, "serve": 200}, 10) == {"passes": 5, "llm": 3, "serve": 2}
    assert shares({"a": 1, "b": 1, "c": 1}, 2) == {"a": 1, "b": 1, "c": 0}  # ties by name
    assert shares({"a": 2, "b": 7}, 100) == {"a": 2, "b": 7}
    mutants = [Mutant(f"ad_mlir/{d}/x.py", "op", i, i, 0, (i, 1)) for d, n in (("passes", 90), ("llm", 10))
               for i in range(n)]
    for seed in range(5):
        drawn = draw(mutants, 20, seed)
        assert sum(folder(m.file) == "llm" for m in drawn) == 2, seed
    assert folder("ad_mlir/passes/patterns/rope.py") == "passes"


def test_sites_in_annotations_are_left_out_and_code_is_not() -> None:
    """cosmic-ray places an operator's mutation at the operator, inside its annotation."""
    tree = ast.parse("def f(x: int | None = 1 + 2) -> list[int] | None:\n    y: int = x - 1\n    return [y]\n")
    spans = mutation.annotation_spans(tree)
    assert mutation._inside((1, 13), spans) and mutation._inside((1, 42), spans)  # both `|`
    assert mutation._inside((2, 7), spans)  # y's `int`
    assert not mutation._inside((1, 24), spans) and not mutation._inside((2, 15), spans)  # `+`, `-`


def test_score_counts_timeouts_as_killed_and_leaves_out_what_did_not_run() -> None:
    statuses = ["killed", "timeout", "survived", "no mutation", "error", "killed"]
    s = score([{"status": x} for x in statuses])
    assert (s["killed"], s["survived"], s["ran"], s["not_run"], s["percent"]) == (3, 1, 4, 2, 75.0)
    rerun = [{"status": "survived", "rerun": {"status": "killed"}}, {"status": "killed"}]
    assert score(rerun)["killed"] == 1 and score(rerun, after_rerun=True)["killed"] == 2


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_the_scratch_copy_is_the_commit_and_a_rerun_mutates_the_first_runs_text(tmp_path: Path) -> None:
    """Uncommitted edits (others' work in progress) stay out of the run; a rerun after new commits
    puts each survivor's file back as the first run mutated it, tests as they are now."""
    repo = tmp_path / "repo"
    (repo / "ad_mlir" / "llm").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "ad_mlir" / "llm" / "a.py").write_text("x = 1\n")
    (repo / "test_a.py").write_text("old test\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "first")
    first = mutation.full_commit("HEAD", repo)
    (repo / "ad_mlir" / "llm" / "a.py").write_text("x = 2  # in progress\n")
    (repo / "ad_mlir" / "llm" / "b.py").write_text("y = 1\n")  # not committed: not mutated
    copy = mutation.scratch_copy(repo, tmp_path / "one", first)
    assert (copy / "ad_mlir" / "llm" / "a.py").read_text() == "x = 1\n" and not (copy / "ad_mlir/llm/b.py").exists()
    assert mutation.mutated_files("HEAD", repo) == ["ad_mlir/llm/a.py"]
    (repo / "test_a.py").write_text("new test\n")
    _git(repo, "commit", "-q", "-am", "second")
    again = mutation.scratch_copy(repo, tmp_path / "two", "HEAD")
    assert mutation.restore(repo, again, first, ["ad_mlir/llm/a.py"]) == ["ad_mlir/llm/a.py"]
    assert (again / "ad_mlir/llm/a.py").read_text() == "x = 1\n" and (again / "test_a.py").read_text() == "new test\n"
