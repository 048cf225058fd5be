"""The documentation: the README stays a front door, the generated references cover their sources, and the
project's files speak of gpulab and its users' world only (no words of the environment it was developed in)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpulab.cli import parser
from gpulab.reference import cli_reference, config_reference, schema_keys
from gpulab.workflow.config import load_schema

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 150

# Words of a development environment, not of gpulab's users: each with its pattern and lines it must catch.
VOCABULARY = yaml.safe_load((ROOT / "tests/fixtures/vocabulary/words.yaml").read_text(encoding="utf-8"))
FORBIDDEN = {entry["name"]: entry["pattern"] for entry in VOCABULARY["forbidden"]}
PATTERN = re.compile("|".join(f"(?P<g{i}>{p})" for i, p in enumerate(FORBIDDEN.values())), re.IGNORECASE)
# Raw outputs of tools and runs, kept as recorded: only their READMEs are ours.
RECORDED = re.compile(r"^tests/fixtures/(?!.*README\.md$)")
BINARY_SUFFIXES = {".png", ".gz", ".whl", ".so", ".pdf"}


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.split("\0") if p and not RECORDED.match(p) and Path(p).suffix not in BINARY_SUFFIXES]


def _name(match: re.Match[str]) -> str:
    return list(FORBIDDEN)[int(match.lastgroup[1:])]


def _word(line: str) -> str | None:
    match = PATTERN.search(line)
    return _name(match) if match else None


def vocabulary_hits(paths: list[str]) -> list[str]:
    hits = []
    for path in paths:
        file = ROOT / path
        if not file.is_file():
            continue
        text = file.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            for match in PATTERN.finditer(line):
                hits.append(f"{path}:{number}: {_name(match)!r}: {line.strip()[:160]}")
    return hits


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout (git ls-files)")
def test_the_project_speaks_of_itself_alone():
    hits = vocabulary_hits(tracked_files())
    assert not hits, "words of the development environment in tracked files:\n" + "\n".join(hits)


@pytest.mark.parametrize("line, word", [(line, e["name"]) for e in VOCABULARY["forbidden"] for line in e["catches"]])
def test_the_vocabulary_check_catches_each_word(line, word):
    assert _word(line) == word


@pytest.mark.parametrize("line", VOCABULARY["allowed"])
def test_the_vocabulary_check_leaves_product_words_alone(line):
    assert _word(line) is None


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES
    torch_first = "pip install --no-deps --require-hashes -r env/lock/torch-cpu.txt && pip install --require-hashes"
    for command in (f"{torch_first} -r env/lock/cpu.txt && pip install --no-deps -e . && snakemake --cores 1",
                    f"{torch_first} -r env/lock/cpu-dev.txt && pip install --no-deps -e . && pytest",
                    "docs/img/report-summary.png", "gpulab example-report", "env/offline-run.sh"):
        assert command in readme
    for link in re.findall(r"\]\(((?:docs|env)/[^)#]+)", readme):
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"


def test_the_summary_screenshot_is_small():
    image = ROOT / "docs/img/report-summary.png"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size < 200 * 1024


def test_the_configuration_reference_has_every_schema_key():
    schema = load_schema()
    page = config_reference(schema)
    keys = [key for key, _ in schema_keys(schema)]
    assert {"target", "timing.min_time_s", "targets.<name>.env", "bench.tolerances.bf16", "llm.engines"} <= set(keys)
    for key in keys:
        assert f"| `{key}` |" in page, f"{key} missing from the configuration reference"


def test_the_schema_keys_are_every_property():
    """Every ``properties`` entry of the schema, at any depth, is one documented key."""
    def count(node) -> int:
        if isinstance(node, dict):
            return len(node.get("properties", {})) + sum(count(v) for v in node.values())
        if isinstance(node, list):
            return sum(count(v) for v in node)
        return 0

    schema = load_schema()
    assert len(list(schema_keys(schema))) == count({k: v for k, v in schema.items() if k != "$defs"})


def test_the_cli_reference_has_every_command_and_option():
    page = cli_reference()
    sub = next(a for a in parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, command in sub.choices.items():
        assert f"## `gpulab {name}`" in page
        for action in command._actions:
            if action.option_strings and "-h" not in action.option_strings:
                assert action.option_strings[-1] in page, f"gpulab {name} {action.option_strings} missing"


@pytest.mark.slow
def test_the_example_report_renders_the_recorded_h100_and_cpu_runs(tmp_path):
    from gpulab.cli import main

    assert main(["example-report", "-o", str(tmp_path / "example"), "--fixtures", str(ROOT / "tests/fixtures")]) == 0
    results = tmp_path / "example/results"
    assert sorted(p.name for p in results.iterdir()) == ["cpu", "h100"]
    for area in ("bench/gelu.csv", "bench/ceilings.csv", "env/env.json", "build/extension.csv", "mlp/summary.csv"):
        assert (results / "h100" / area).is_file() and (results / "cpu" / area).is_file(), area
    assert list((results / "h100/llm").glob("*__fast.csv"))
    html = (tmp_path / "example/report.html").read_text(encoding="utf-8")
    assert "NVIDIA H100" in html and "This section could not be rendered" not in html


def test_the_example_report_names_missing_fixtures(tmp_path):
    from gpulab.cli import main

    with pytest.raises(SystemExit, match=r"recorded fixtures not found: .*--fixtures"):
        main(["example-report", "-o", str(tmp_path / "example"), "--fixtures", str(tmp_path / "none")])


@pytest.mark.slow
def test_the_documentation_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: a broken link, a missing page or a page left out of the navigation fails; the
    generated references and the example report are in the site."""
    pytest.importorskip("mkdocs")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    for page in ("reference/config/index.html", "reference/cli/index.html", "example/report.html", "index.html"):
        assert (tmp_path / "site" / page).is_file(), page


def test_every_environment_variable_is_listed_once_and_documented():
    """The variables gpulab reads are named in one place (gpulab.core.jobenv) and the running guide lists each."""
    from gpulab.core import jobenv

    names = set()
    for path in (ROOT / "src" / "gpulab").rglob("*.py"):
        if path.name != "jobenv.py":
            names |= set(re.findall(r"\bGPULAB_[A-Z_]+", path.read_text(encoding="utf-8")))
    assert names - {"GPULAB_WITH_CUDA"} <= set(jobenv.VARIABLES)  # a C++ define, not a variable
    guide = (ROOT / "docs" / "guide" / "running.md").read_text(encoding="utf-8")
    assert all(f"`{name}`" in guide for name in jobenv.VARIABLES)
