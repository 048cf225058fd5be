"""The manifest of the built extension: the one file through which later steps find the library.

``extension_build`` writes ``results/<target>/build/extension_manifest.json`` (outcome, library path,
digest, architectures, toolchain); the rules that use the operators take it as an input and call
:func:`load_from_manifest`, which loads exactly that library or says why it cannot. Nothing here builds:
a missing or stale library is a ``failed`` outcome naming the step to rerun.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpulab.core.tables import write_atomic
from gpulab.native.compile import MARKER_FILE, ExtensionLoad, load_library

MANIFEST_VERSION = 1
_KEYS = ("status", "reason", "target", "backend", "archs", "compiler", "host_compiler", "flags", "name", "digest",
         "build_dir", "library", "log_path", "torch_version", "build_s", "built_at")


def _portable(path: str) -> str:
    """Paths inside the run's working directory are written relative to it, so a moved checkout resolves them."""
    if not path:
        return ""
    p, cwd = Path(path).resolve(), Path.cwd().resolve()
    return str(p.relative_to(cwd)) if p.is_relative_to(cwd) else str(p)


def _resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else Path.cwd() / p


def write_manifest(outcome: ExtensionLoad, path: Path) -> dict[str, Any]:
    data = {k: v for k, v in outcome.as_dict().items() if k in _KEYS}
    for key in ("build_dir", "library", "log_path"):
        data[key] = _portable(data[key])
    data["manifest_version"] = MANIFEST_VERSION
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")
    return data


def read_manifest(path: Path) -> ExtensionLoad:
    """The outcome a manifest records, paths resolved; a missing or unreadable manifest is ``failed``."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ExtensionLoad("failed", f"no extension manifest at {path}: run the extension_build step first", "")
    except (OSError, json.JSONDecodeError) as exc:
        return ExtensionLoad("failed", f"unreadable extension manifest {path}: {exc}", "")
    if data.get("manifest_version") != MANIFEST_VERSION:
        return ExtensionLoad("failed", f"extension manifest {path} has version {data.get('manifest_version')!r}, "
                             f"expected {MANIFEST_VERSION}: rerun the extension_build step", data.get("target", ""))
    outcome = ExtensionLoad.from_dict(data)
    return replace(outcome, **{k: str(_resolve(getattr(outcome, k))) if getattr(outcome, k) else ""
                               for k in ("build_dir", "library", "log_path")})


def _stale_reason(outcome: ExtensionLoad, manifest: Path) -> str:
    """Why the library the manifest names cannot be the one that step built, or ''."""
    import torch

    library = Path(outcome.library)
    marker = library.parent / MARKER_FILE
    if not library.is_file() or not marker.is_file():
        return (f"the library {library} named by {manifest} is missing (cache deleted?): rerun the extension_build "
                "step (snakemake --forcerun extension_build)")
    recorded = json.loads(marker.read_text(encoding="utf-8")).get("name")
    if recorded != outcome.name:
        return f"{library.parent} holds build {recorded!r}, not {outcome.name!r} named by {manifest}"
    if outcome.torch_version and outcome.torch_version != torch.__version__:
        return (f"the library was built against torch {outcome.torch_version}, this process has torch "
                f"{torch.__version__}: rerun the extension_build step")
    return ""


_LAST: list[ExtensionLoad] = []  # what load_from_manifest gave this process


def load_from_manifest(path: str | Path) -> ExtensionLoad:
    """Load exactly the library ``path`` names; its recorded outcome if that was not ``ok``."""
    manifest = Path(path)
    outcome = read_manifest(manifest)
    if outcome.status == "ok":
        stale = _stale_reason(outcome, manifest)
        outcome = replace(outcome, status="failed", reason=stale) if stale else load_library(
            replace(outcome, cached=True))
    _LAST[:] = [outcome]
    return outcome


def manifest_outcome() -> ExtensionLoad:
    """The outcome of this process's :func:`load_from_manifest` call (the job's script makes it with the
    manifest its rule takes as input); ``failed`` when no manifest was loaded."""
    if _LAST:
        return _LAST[0]
    return ExtensionLoad("failed", "no extension manifest was loaded in this process: the job's rule must take "
                         "results/<target>/build/extension_manifest.json as input and load it", "")
