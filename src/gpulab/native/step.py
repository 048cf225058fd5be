"""The extension_build step: cold build (or the finished build), manifest, warm load in a fresh process,
correctness and bad-input checks; its tables ``extension.csv`` and ``extension_checks.csv``."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpulab.core.device import DeviceInfo, probe
from gpulab.core.tables import Column, TableSchema, write_atomic
from gpulab.core.tools import run_tool
from gpulab.native.checks import EXTENSION_CHECKS, check_bad_inputs, check_ops
from gpulab.native.compile import ExtensionBuildError, ExtensionLoad, build
from gpulab.native.manifest import write_manifest
from gpulab.native.plan import DEFAULT_EXTRA_CFLAGS, SOURCE_DIR

EXTENSION = TableSchema(
    "extension",
    (
        Column("phase", "str",
               "cold_build (compiler ran, or the recorded cold build) | warm_load (fresh process, from the manifest)"),
        Column("backend", "str", "cpu | cuda | rocm: what the library was built for"),
        Column("arch", "str", "GPU architectures compiled (sm_90, gfx90a), or cpu"),
        Column("compiler", "str", "compiler of the kernels and its version"),
        Column("host_compiler", "str", "host C++ compiler and its version"),
        Column("flags", "str", "architecture variable and compiler flags"),
        Column("name", "str", "library name (digest of sources, flags and toolchain)"),
        Column("seconds", "float", "wall time of the phase"),
        Column("cached", "bool", "the phase found a finished build and ran no compiler"),
        Column("measured_at", "str", "when the phase's seconds were measured (UTC)"),
        Column("build_dir", "str", "build directory under the workflow's cache"),
    ),
    path="build/extension.csv",
)


def extension_rows(cold: ExtensionLoad, warm: ExtensionLoad | None, *, target: str, fingerprint: str,
                   now: str) -> list[dict[str, Any]]:
    base = {"target": target, "fingerprint": fingerprint}

    def row(load: ExtensionLoad, phase: str, seconds: float, cached: bool, measured_at: str) -> dict[str, Any]:
        return {**base, "status": load.status, "reason": load.reason, "phase": phase, "backend": load.backend,
                "arch": load.arch if load.status != "skipped" else "", "compiler": load.compiler,
                "host_compiler": load.host_compiler, "flags": load.flags, "name": load.name,
                "seconds": seconds, "cached": cached, "measured_at": measured_at, "build_dir": load.build_dir}

    rows = [row(cold, "cold_build", cold.build_s, cold.cached, cold.built_at or now)]
    if warm is not None:
        rows.append(row(warm, "warm_load", warm.seconds, warm.cached, now))
    return rows


def warm_load_in_subprocess(manifest: Path, timeout_s: float = 600) -> ExtensionLoad:
    """Load the manifest's library in a fresh interpreter, as a later step does."""
    argv = [sys.executable, "-m", "gpulab.native", "load", "--manifest", str(manifest)]
    result = run_tool("python:gpulab.native load", argv, timeout_s=timeout_s)
    if result.status != "ok":
        return ExtensionLoad("failed", f"warm load in a fresh process failed: {result.reason}\n{result.stderr[-2000:]}",
                             "")
    return ExtensionLoad.from_dict(json.loads(result.stdout.strip().splitlines()[-1]))


def _report_failure(cold: ExtensionLoad) -> None:
    print(f"gpulab extension build FAILED ({cold.reason}); compiler output:\n{cold.compiler_output}\n"
          f"full build log: {cold.log_path}", file=sys.stderr)
    if cold.log_path and Path(cold.log_path).is_file():
        print(Path(cold.log_path).read_text(encoding="utf-8", errors="replace"), file=sys.stderr)


def _print_checks(rows: list[dict[str, Any]]) -> None:
    correctness = [r for r in rows if r["kind"] == "correctness"]
    bad = [r for r in correctness if r["status"] != "ok"]
    print(f"correctness: {len(correctness) - len(bad)}/{len(correctness)} within tolerance")
    for r in bad:
        print(f"  INCORRECT {r['op']} {r['dtype']} {r['shape']} {r['layout']}: {r['reason']} "
              f"(max abs err {r['max_abs_err']:.3g})")
    for r in (r for r in rows if r["kind"] == "bad_input"):
        print(f"  bad input {r['case']}: {r['status']} {r.get('reason') or ''}\n      {r.get('message', '')}")


def run_extension_step(
    target: str, fingerprint: str, build_config: Mapping[str, Any], *, out_csv: Path, checks_csv: Path,
    build_log: Path, manifest: Path, cache_root: Path | None = None, device: DeviceInfo | None = None,
    source_dir: Path = SOURCE_DIR,
) -> ExtensionLoad:
    """The extension_build rule. A compile error raises :class:`ExtensionBuildError` after printing the
    compiler's output, so the step fails with the compiler's message in its log (and writes nothing)."""
    pinned = list(build_config.get("offload_archs") or []) or None
    flags = list(build_config.get("extra_cflags", DEFAULT_EXTRA_CFLAGS))
    # The compiler needs the architecture only: it runs before the checks claim the device (gpulab.core.device).
    cold = build(target, pinned_archs=pinned, extra_cflags=flags, cache_root=cache_root, device=device or probe(),
                 source_dir=source_dir)
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    if cold.status == "failed":
        _report_failure(cold)
        raise ExtensionBuildError(f"{cold.reason}\n{cold.compiler_output}")
    cold = replace(cold, target=target)
    write_manifest(cold, manifest)
    how = f"cached, built {cold.built_at}" if cold.cached else "built"
    print(f"extension {cold.name}: {cold.backend} ({cold.arch}) {how} in {cold.build_s:.2f} s; manifest {manifest}")
    if cold.status == "skipped":
        write_atomic(build_log, f"# no extension build on this machine: {cold.reason}\n")
        EXTENSION.write(extension_rows(cold, cold, target=target, fingerprint=fingerprint, now=now), out_csv)
        EXTENSION_CHECKS.write([{"target": target, "fingerprint": fingerprint, "status": "skipped",
                                 "reason": cold.reason}], checks_csv)
        return cold
    warm = warm_load_in_subprocess(manifest)
    print(f"warm load in a fresh process: {warm.status} in {warm.seconds:.3f} s {warm.reason}")
    shutil.copyfile(cold.log_path, build_log)
    # Before this process claims the device: the bad-input process starts PyTorch while another job measures,
    # then claims the device itself.
    bad = check_bad_inputs(target, fingerprint, manifest, device)
    checks = check_ops(target, fingerprint, device) + bad
    _print_checks(checks)
    EXTENSION_CHECKS.write(checks, checks_csv)
    EXTENSION.write(extension_rows(cold, warm, target=target, fingerprint=fingerprint, now=now), out_csv)
    return cold
