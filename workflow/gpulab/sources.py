"""The source files a workflow step's result depends on, so Snakemake reruns exactly the steps an edit affects.

A step's library code is the closure of the ``gpulab`` modules its script imports (at any depth, including
imports inside functions), found by reading the import statements, never by importing them: the Snakefile
stays quick to parse. Kernel sources live outside the package and are loaded by path (``gpulab.kernels``),
so they are listed per implementation in :data:`KERNEL_SOURCES`; data files a step reads are listed per
script in :data:`DATA_SOURCES`. Paths are relative to the repository root; the workflow makes them relative to
its working directory, so a moved checkout reruns nothing.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from gpulab.paths import REPO_ROOT

PACKAGE = "gpulab"
# Loaded by path from kernels/ (see gpulab.kernels): covered by KERNEL_SOURCES, not by the import closure.
PATH_LOADED = ("gpulab.kernels",)

# Per benchmark implementation: the kernel files (relative to the repository root) of an op's cell.
# cpp_ext cells depend on the extension through the build step's outcome table, an input of their rule.
KERNEL_SOURCES = {
    "triton": ("kernels/triton/{op}.py", "kernels/triton/config.py", "kernels/triton/__init__.py"),
}
HIP_SOURCES = ("kernels/hip/vector_add.hip", "kernels/hip/hip_compat.h")
EXTENSION_SOURCES = (
    "kernels/ext/ops.cpp", "kernels/ext/ops_cuda.cu", "kernels/ext/ops_common.h", "kernels/ext/ops_kernels.cuh",
)

# Files other than Python modules that a step's script reads, by script name.
DATA_SOURCES = {
    "build_hip_standalone.py": HIP_SOURCES,
    "build_extension.py": EXTENSION_SOURCES,
    # Every Triton kernel; the HIP sources and their headers come from gpulab.kernel_compile.hipcc (kernels.smk).
    "kernels_compile.py": ("kernels/triton/*.py",),
    "llm_tiny_build.py": ("workflow/gpulab/llm/data/tiny_corpus.txt",
                          "workflow/gpulab/llm/configs/qwen2.5_chat_template.jinja"),
    "llm_infer.py": ("workflow/gpulab/llm/configs/**/*",),
    "llm_model_fetch.py": ("workflow/gpulab/llm/configs/**/*",),
    # Sections are discovered at run time, not imported by name; the templates are read by jinja.
    "report_render.py": ("workflow/gpulab/report/**/*.py", "workflow/gpulab/report/templates/*"),
}


def _module_file(name: str, package_dir: Path) -> Path | None:
    parts = name.split(".")
    base = package_dir.parent.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


# Import statements of the package, found by text rather than by parsing (parsing every module took a second
# of each `snakemake -n`). A mention in a docstring at worst adds a dependency, never loses one.
_FROM = re.compile(r"^[ \t]*from[ \t]+(gpulab[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n#]+)", re.M)


@cache
def _imported_names(path: Path) -> tuple[str, ...]:
    """Every module name an import statement in ``path`` may load (``from a import b`` may mean a or a.b)."""
    text = path.read_text(encoding="utf-8")
    names = []
    for module, imported in _FROM.findall(text):
        names.append(module)
        names += [f"{module}.{n.split()[0]}" for n in imported.strip("()").replace("\\", "").split(",") if n.strip()]
    for imported in _IMPORT.findall(text):
        names += [n.split()[0] for n in imported.split(",") if n.strip().startswith(PACKAGE)]
    return tuple(names)


@cache
def library_files(script: Path, package_dir: Path = REPO_ROOT / "workflow" / PACKAGE) -> tuple[Path, ...]:
    """The script and every gpulab module (with its packages' ``__init__``) it can import, sorted."""
    found: set[Path] = {script}
    todo = [script]
    while todo:
        for name in _imported_names(todo.pop()):
            if name.split(".")[0] != PACKAGE or name.startswith(PATH_LOADED):
                continue
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                module = _module_file(".".join(parts[:depth]), package_dir)
                if module is not None and module not in found:
                    found.add(module)
                    todo.append(module)
    return tuple(sorted(found))


def step_sources(script: str, repo: Path = REPO_ROOT) -> list[str]:
    """Repository-relative source files of the step run by ``workflow/scripts/<script>``."""
    files = set(library_files(repo / "workflow" / "scripts" / script, repo / "workflow" / PACKAGE))
    for pattern in DATA_SOURCES.get(script, ()):
        files.update(p for p in repo.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    return sorted(str(p.relative_to(repo)) for p in files)


def kernel_sources(impl: str, op: str) -> list[str]:
    """Repository-relative kernel files of one benchmark implementation of one op."""
    return [p.format(op=op) for p in KERNEL_SOURCES.get(impl, ())]
