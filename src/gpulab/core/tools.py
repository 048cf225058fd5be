"""External tools run as recorded outcomes: a missing binary is skipped, a failure keeps its exit status and words."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Where the toolkits install their compilers when their bin directory is not on PATH.
TOOLKIT_DIRS = {"hipcc": ("ROCM_PATH", "ROCM_HOME", "/opt/rocm"), "nvcc": ("CUDA_HOME", "CUDA_PATH", "/usr/local/cuda")}


def find_compiler(name: str, environ: Mapping[str, str] | None = None, *, toolkit_dirs: bool = True,
                  homes: Sequence[str | None] | None = None) -> str | None:
    """Where the device compiler ``name`` (hipcc, nvcc) is: in ``<home>/bin`` of ``homes`` only, where given (the
    toolkit another tool pins, as torch's extension builder does); else on PATH, then, unless ``toolkit_dirs`` is
    off, in its toolkit's bin directory ($ROCM_PATH, $CUDA_HOME, the default prefix)."""
    env = os.environ if environ is None else environ
    if homes is None:
        found = shutil.which(name, path=env.get("PATH", ""))
        if found or not toolkit_dirs:
            return found
        homes = [env.get(entry) if not entry.startswith("/") else entry for entry in TOOLKIT_DIRS[name]]
    for home in homes:
        if home and (candidate := Path(home) / "bin" / name).is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@dataclass(frozen=True)
class ToolResult:
    """One external tool run: what was run, how it ended, and what it said."""

    tool: str
    argv: tuple[str, ...]
    status: str  # ok | skipped | failed
    exit_status: int | None
    reason: str
    stdout: str
    stderr: str

    def summary(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("stdout")
        out.pop("stderr")
        out["argv"] = " ".join(self.argv)
        return out


def run_tool(
    tool: str, argv: Sequence[str], timeout_s: float = 120, env: Mapping[str, str] | None = None
) -> ToolResult:
    """Run an external tool; a missing binary is ``skipped``, a non-zero exit or time-out ``failed``."""
    argv = tuple(argv)
    exe = argv[0] if os.sep in argv[0] else shutil.which(argv[0])
    if exe is None or not Path(exe).exists():
        return ToolResult(tool, argv, "skipped", None, f"{argv[0]} not found on PATH", "", "")
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            errors="replace",
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as exc:
        return ToolResult(
            tool, argv, "failed", None, f"timed out after {timeout_s:g} s", _text(exc.stdout), _text(exc.stderr)
        )
    except OSError as exc:
        return ToolResult(tool, argv, "failed", None, f"could not start: {exc}", "", "")
    if proc.returncode != 0:
        first = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1][:300]
        return ToolResult(
            tool, argv, "failed", proc.returncode, f"exit status {proc.returncode}: {first}", proc.stdout, proc.stderr
        )
    return ToolResult(tool, argv, "ok", 0, "", proc.stdout, proc.stderr)


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value
