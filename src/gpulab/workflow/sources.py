"""The source files a workflow step's result depends on, and their content digest, so Snakemake reruns exactly the
steps an edit of their content affects (never a file's time: a touch, a checkout round trip).

A step's library code is the closure of the ``gpulab`` modules its script imports (at any depth, including
imports inside functions), found by reading the import statements, never by importing them: the Snakefile
stays quick to parse. The Triton kernels are the package ``gpulab.kernels``, read from the top-level
``kernels/`` directory (``src/gpulab/kernels`` links to it); a benchmark cell depends on its own implementation's kernel
module only (:func:`kernel_sources`). Data files a step reads are listed per
script in :data:`DATA_SOURCES`. Paths are relative to the repository root, so a moved checkout has the same
digests and reruns nothing. The workflow hands each step :func:`code_digest` of its files as a ``params:`` entry.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from functools import cache
from pathlib import Path

from gpulab.core.paths import HIP_PROGRAM

PACKAGE = "gpulab"
# Where each package's modules live, relative to the checkout: src/gpulab/kernels links to the top-level kernels/,
# and a step's kernel files are named by their real place. The longest matching name wins.
PACKAGE_DIRS = {"gpulab": "src/gpulab", "gpulab.kernels": "kernels"}
KERNELS_PACKAGE = "gpulab.kernels"

# The implementation registry imports each op's kernel inside the function that runs it; the closure does not
# follow those imports, since a cell's kernel files are inputs per job (kernel_sources): editing one op's kernel
# reruns that op's cells only, not every step that imports the registry for its availability checks.
PER_JOB_KERNEL_IMPORTS = ("src/gpulab/bench/impls.py",)

EXTENSION_SOURCES = (
    "kernels/ext/ops.cpp", "kernels/ext/ops_cuda.cu", "kernels/ext/ops_common.h", "kernels/ext/ops_kernels.cuh",
)

# Files other than Python modules that a step's script reads, by script name.
DATA_SOURCES = {
    "build_hip_standalone.py": (HIP_PROGRAM, "kernels/hip/*.h"),
    "build_extension.py": EXTENSION_SOURCES,
    # Every Triton kernel; the HIP sources and their headers come from gpulab.toolchains.hipcc (kernels.smk).
    "kernels_compile.py": ("kernels/triton/*.py",),
    "llm_tiny_build.py": ("src/gpulab/llm/data/tiny_corpus.txt",
                          "src/gpulab/llm/configs/qwen2.5_chat_template.jinja"),
    "llm_infer.py": ("src/gpulab/llm/configs/**/*",),
    "llm_model_fetch.py": ("src/gpulab/llm/configs/**/*",),
    "tune_fast_run.py": ("src/gpulab/llm/configs/**/*",),
    # Sections are discovered at run time, not imported by name; the templates are read by jinja.
    "report_render.py": ("src/gpulab/report/**/*.py", "src/gpulab/report/templates/*"),
}


def _module_file(name: str, repo: Path) -> Path | None:
    root = max((p for p in PACKAGE_DIRS if name == p or name.startswith(p + ".")), key=len, default=None)
    if root is None:
        return None
    base = repo.joinpath(PACKAGE_DIRS[root], *name[len(root):].split(".")[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


# Import statements of the package, found by text rather than by parsing (parsing every module took a second
# of each `snakemake -n`). A mention in a docstring at worst adds a dependency, never loses one. Relative
# imports (the kernels use them) are resolved against the importing module's package.
_FROM = re.compile(r"^[ \t]*from[ \t]+(gpulab[\w.]*|\.+[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n#]+)", re.M)


@cache
def _imported_names(path: Path, package: str) -> tuple[str, ...]:
    """Every module name an import statement in ``path`` may load (``from a import b`` may mean a or a.b)."""
    text = path.read_text(encoding="utf-8")
    names = []
    for module, imported in _FROM.findall(text):
        if module.startswith("."):
            dots = len(module) - len(module.lstrip("."))
            parent = package.rsplit(".", dots - 1)[0] if dots > 1 else package
            module = ".".join(filter(None, (parent, module[dots:])))
        names.append(module)
        names += [f"{module}.{n.split()[0]}" for n in imported.strip("()").replace("\\", "").split(",") if n.strip()]
    for imported in _IMPORT.findall(text):
        names += [n.split()[0] for n in imported.split(",") if n.strip().startswith(PACKAGE)]
    return tuple(names)


@cache
def _closure(start: tuple[tuple[Path, str], ...], repo: Path) -> tuple[Path, ...]:
    """The files of ``start`` (path, package) and of every gpulab module they can import, sorted."""
    found = {path for path, _ in start}
    todo = list(start)
    per_job = {repo / p for p in PER_JOB_KERNEL_IMPORTS}
    while todo:
        importer = todo.pop()
        for name in _imported_names(*importer):
            if name.split(".")[0] != PACKAGE or (importer[0] in per_job and name.startswith(KERNELS_PACKAGE)):
                continue
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ too
                module = ".".join(parts[:depth])
                path = _module_file(module, repo)
                if path is not None and path not in found:
                    found.add(path)
                    todo.append((path, module if path.name == "__init__.py" else module.rpartition(".")[0]))
    return tuple(sorted(found))


def library_files(script: Path, repo: Path) -> tuple[Path, ...]:
    """The script and every gpulab module (with its packages' ``__init__``, kernels included) it can import."""
    return _closure(((script, ""),), repo)


def step_sources(script: str, repo: Path) -> list[str]:
    """Repository-relative source files of the step run by ``workflow/scripts/<script>``."""
    files = set(library_files(repo / "workflow" / "scripts" / script, repo))
    for pattern in DATA_SOURCES.get(script, ()):
        files.update(p for p in repo.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    return sorted(str(p.relative_to(repo)) for p in files)


def kernel_sources(impl: str, op: str, repo: Path) -> list[str]:
    """Repository-relative kernel files of one benchmark implementation of one op: what importing its kernel
    module (the op registry's, gpulab.core.ops) runs under kernels/ (the module, its packages' ``__init__`` and
    their imports). cpp_ext cells depend on the extension through the build step's manifest, an input of their
    rule."""
    from gpulab.bench.impls import runs_triton_kernels
    from gpulab.core.ops import OPS

    module = OPS[op].triton_module if runs_triton_kernels(impl) and op in OPS else None
    if module is None:
        return []
    parts = module.split(".")
    packages = [".".join(parts[:d]) for d in range(1, len(parts) + 1)]
    start = tuple((f, m if f.name == "__init__.py" else m.rpartition(".")[0])
                  for m in packages if (f := _module_file(m, repo)) is not None)
    kernels = repo / PACKAGE_DIRS[KERNELS_PACKAGE]
    return sorted(str(p.relative_to(repo)) for p in _closure(start, repo) if p.is_relative_to(kernels))


@cache
def _content_digest(path: Path) -> bytes:
    return hashlib.sha256(path.read_bytes()).digest()


def code_digest(files: Iterable[str], repo: Path) -> str:
    """Short sha256 over the sorted (repository-relative path, content) pairs of ``files``: changes with what the
    code says, not with file times or the checkout's place."""
    digest = hashlib.sha256()
    for rel in sorted(set(files)):
        digest.update(rel.encode() + b"\0" + _content_digest(repo / rel))
    return digest.hexdigest()[:16]
