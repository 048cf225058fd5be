"""The front door: the locks install where PyTorch's index cannot be reached, the documented install commands take
torch's lock first, and the offline-host command and its presets hold together."""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from gpulab.workflow.config import validate_config

ROOT = Path(__file__).resolve().parent.parent
LOCKS = sorted((ROOT / "env/lock").glob("*.txt"))
TORCH_LOCKS = [p for p in LOCKS if p.name.startswith("torch-")]
PLATFORM_LOCKS = [p for p in LOCKS if p not in TORCH_LOCKS]
HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")
OFFLINE_RUN = ROOT / "env/offline-run.sh"
PRESETS = sorted((ROOT / "presets").glob("*.yaml"))


def entries(lock: Path) -> tuple[list[str], dict[str, list[tuple[Requirement, list[str]]]]]:
    """A lock's option lines and, per package name, its requirements with their hashes."""
    text = re.sub(r" *\\\n *", " ", lock.read_text(encoding="utf-8"))
    options, packages = [], {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            options.append(line)
            continue
        spec, _, hashes = line.partition(" --hash")
        requirement = Requirement(spec)
        packages.setdefault(requirement.name, []).append((requirement, ("--hash" + hashes).split()))
    return options, packages


def test_the_locks_are_there():
    assert {p.name for p in LOCKS} >= {"cpu.txt", "cpu-dev.txt", "cuda.txt", "torch-cpu.txt"}


@pytest.mark.parametrize("lock", PLATFORM_LOCKS, ids=lambda p: p.name)
def test_a_platform_lock_names_no_index(lock):
    options, _ = entries(lock)
    assert options == [], f"{lock.name} names {options}: pip would ask that index for every package"


@pytest.mark.parametrize("lock", TORCH_LOCKS, ids=lambda p: p.name)
def test_a_torch_lock_names_pytorchs_index_and_holds_torch_alone(lock):
    options, packages = entries(lock)
    assert len(options) == 1 and options[0].startswith("--extra-index-url https://download.pytorch.org/whl/")
    assert set(packages) <= {"torch", "pytorch-triton-rocm"} and "torch" in packages


@pytest.mark.parametrize("lock", LOCKS, ids=lambda p: p.name)
def test_every_package_is_pinned_with_hashes(lock):
    _, packages = entries(lock)
    assert packages
    for name, pins in packages.items():
        for requirement, hashes in pins:
            assert [s.operator for s in requirement.specifier] == ["=="], f"{lock.name}: {requirement} is not pinned"
            assert hashes and all(HASH.match(h) for h in hashes), f"{lock.name}: {name} lacks sha256 hashes"


def test_torch_is_one_release_across_locks():
    releases = {lock.name: {Version(str(s.version)).public
                            for requirement, _ in entries(lock)[1]["torch"] for s in requirement.specifier}
                for lock in LOCKS}
    assert len(set().union(*releases.values())) == 1, releases


@pytest.mark.parametrize("platform", ["cpu", "cpu-dev"])
def test_the_platform_lock_pins_the_torch_its_torch_lock_installs(platform):
    torch_lock = {str(r): sorted(h) for r, h in entries(ROOT / "env/lock/torch-cpu.txt")[1]["torch"]}
    platform_lock = {str(r): sorted(h) for r, h in entries(ROOT / f"env/lock/{platform}.txt")[1]["torch"]}
    assert torch_lock == platform_lock


def install_lines() -> list[tuple[str, str]]:
    """The install commands users are given (the dated evidence pages keep the commands their runs ran)."""
    docs = [p for p in sorted((ROOT / "docs").rglob("*.md")) if "evidence" not in p.parts]
    pages = [ROOT / "README.md", ROOT / "env/README.md", *docs]
    return [(page.relative_to(ROOT).as_posix(), line) for page in pages
            for line in page.read_text(encoding="utf-8").splitlines()
            if re.search(r"pip install --require-hashes -r env/lock/(cpu|cpu-dev|rocm)\.txt", line)]


def test_every_install_command_takes_torchs_lock_first():
    lines = install_lines()
    assert any(page == "README.md" for page, _ in lines)
    for page, line in lines:
        for lock in re.findall(r"pip install --require-hashes -r env/lock/(cpu|cpu-dev|rocm)\.txt", line):
            torch_lock = "torch-rocm" if lock == "rocm" else "torch-cpu"
            first = (f"pip install --no-deps --require-hashes -r env/lock/{torch_lock}.txt && "
                     f"pip install --require-hashes -r env/lock/{lock}.txt")
            assert first in line, f"{page}: {line.strip()}"


def merged(base: dict, over: dict) -> dict:
    """Snakemake's --configfile: nested mappings laid over the base key by key, anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.stem)
def test_every_preset_is_a_valid_configuration_over_the_default(preset):
    base = yaml.safe_load((ROOT / "config.yaml").read_text(encoding="utf-8")) or {}
    over = yaml.safe_load(preset.read_text(encoding="utf-8"))
    assert isinstance(over, dict) and over
    validate_config(merged(base, over))


def test_the_presets_are_the_documented_ones():
    page = (ROOT / "docs/guide/platforms.md").read_text(encoding="utf-8")
    assert {p.stem for p in PRESETS} == {"full", "quick", "mlp", "llm", "softmax", "softmax-wide"}
    for preset in PRESETS:
        assert f"| `{preset.stem}` |" in page, f"{preset.name} missing from the offline hosts' preset table"


def offline_run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(OFFLINE_RUN), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "message"), [
    ((), "usage: env/offline-run.sh"),
    (("h100",), "usage: env/offline-run.sh"),
    (("h100", "nope"), "no preset nope (presets/: full llm mlp quick softmax-wide softmax)"),
    (("--time-limit", "5m", "h100", "quick"), "--time-limit takes whole seconds, not '5m'"),
    (("--piece-size", "big", "h100", "quick"), "--piece-size takes a size such as 15M, not 'big'"),
    (("a b", "quick"), "TARGET 'a b' is not a name"),
    (("--bogus", "h100", "quick"), "unknown option --bogus"),
    (("--wheelhouse", "/nonexistent", "h100", "quick"), "no /nonexistent/requirements.txt: make it with env/"),
])
def test_offline_run_names_bad_input(args, message, tmp_path):
    proc = offline_run(*args, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr and not proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
def test_offline_run_makes_the_files_named_and_packs_them_in_pieces(tmp_path):
    """A real run of one step with the quick preset in a copy of the checkout: the pieces join into its results."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".snakemake", ".cache", "results", "reports", "site", "__pycache__", "*_cache", ".whl"))
    pack = tmp_path / "pack"
    proc = subprocess.run(["bash", "env/offline-run.sh", "--pack", str(pack), "--piece-size", "2K", "--time-limit",
                           "300", "t", "quick", "results/t/env/env.json"], cwd=checkout, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pieces = sorted(pack.glob("results-t.tgz.part*"))
    assert len(pieces) > 1 and (pack / "snakemake.log").stat().st_size > 0
    archive = tmp_path / "joined.tgz"
    archive.write_bytes(b"".join(p.read_bytes() for p in pieces))
    with tarfile.open(archive) as tar:
        assert "results/t/env/env.json" in tar.getnames()


@pytest.mark.parametrize("args", [(), ("gpu",), ("cpu", "--index", "x")])
def test_lock_sh_names_its_platforms_on_bad_input(args):
    proc = subprocess.run(["bash", str(ROOT / "env/lock.sh"), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "usage: env/lock.sh {cpu|cpu-dev|cuda|rocm}" in proc.stderr, proc.stderr
