"""Strict mode's one judgement of recorded outcomes (gpulab.workflow.outcomes), on tables as the steps write them."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gpulab.core.device import DeviceInfo
from gpulab.core.tables import StrictModeError
from gpulab.workflow.failures import final_error
from gpulab.workflow.outcomes import collect, judge, record, summary, table_outcomes

CPU = DeviceInfo(backend="cpu", torch_version="2.x", hip_version=None, cuda_version=None, gpu_available=False,
                 reason="PyTorch is a CPU-only build")
CUDA = DeviceInfo(backend="cuda", torch_version="2.x", hip_version=None, cuda_version="13.0", gpu_available=True,
                  name="H100", arch="sm_90")


def rows(*statuses: tuple[str, str], **columns: list) -> pd.DataFrame:
    return pd.DataFrame({"target": "local", "fingerprint": "f", "status": [s for s, _ in statuses],
                         "reason": [r for _, r in statuses], **columns})


def write_target(root: Path, target: str, device: DeviceInfo, tables: dict[str, pd.DataFrame]) -> dict[str, list]:
    (root / target / "env").mkdir(parents=True)
    (root / target / "env" / "env.json").write_text(json.dumps({"device": device.as_dict()}))
    paths = {}
    for name, table in tables.items():
        path = root / target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        table.assign(target=target).to_csv(path, index=False)
        paths[name] = str(path)
    return paths


def test_every_not_ok_row_is_listed_with_its_step_row_and_reason():
    cell = rows(("ok", ""), ("skipped", "Triton needs a GPU"), ("failed", "out of range"),
                op=["gelu", "gelu", "add"], impl=["native", "triton", "triton"], size=[4096.0, 4096.0, 1000.0])
    found = table_outcomes("bench_cell", "bench/gelu.csv", cell, CPU)
    assert [(o.status, o.row, o.reason, o.expected) for o in found] == [
        ("skipped", "op=gelu, impl=triton, size=4096", "Triton needs a GPU", ""),
        ("failed", "op=add, impl=triton, size=1000", "out of range", "")]
    assert found[0].line() == "  - local bench_cell (bench/gelu.csv) [op=gelu, impl=triton, size=4096] skipped: " \
                              "Triton needs a GPU"


def test_what_the_targets_machine_cannot_do_is_listed_apart_and_not_judged():
    tools = rows(("skipped", "rocm-smi not found"), ("skipped", "nvidia-smi not found"),
                 tool=["rocm-smi", "nvidia-smi"], required=[False, True])
    on_cuda = table_outcomes("env_capture", "env/tools.csv", tools, CUDA)
    assert [(o.row, bool(o.expected)) for o in on_cuda] == [("tool=rocm-smi", True), ("tool=nvidia-smi", False)]
    ceilings = rows(("skipped", "Triton needs a GPU"), kind=["copy"], method=["triton"], dtype=["fp32"])
    assert table_outcomes("bench_ceilings", "bench/ceilings.csv", ceilings, CPU)[0].expected
    assert not table_outcomes("bench_ceilings", "bench/ceilings.csv", ceilings, CUDA)[0].expected
    mlp = rows(("skipped", "TF32 is a CUDA matmul mode"), variant=["tf32"])
    assert table_outcomes("mlp_profile", "mlp/summary.csv", mlp, CPU)[0].expected
    assert not table_outcomes("mlp_profile", "mlp/summary.csv", mlp, CUDA)[0].expected


def test_unstable_timings_count_only_where_strict_says_so():
    cell = rows(("ok", ""), ("ok", ""), op=["gelu", "gelu"], size=[1, 2], stable=[True, False])
    assert table_outcomes("bench_cell", "bench/gelu.csv", cell, CUDA) == []
    (unstable,) = table_outcomes("bench_cell", "bench/gelu.csv", cell, CUDA, unstable=True)
    assert unstable.status == "unstable" and unstable.row == "op=gelu, size=2" and "not stable" in unstable.reason


def check(tables: dict, root: Path, strict: bool | str, out: Path) -> list:
    """The workflow's two steps: every outcome recorded, then strict mode's judgement of them."""
    record(tables, root, strict == "unstable", out)
    return judge(out, strict, root / "strict.txt")


def test_check_fails_once_with_every_outcome_of_every_step_and_target(tmp_path):
    tables = {}
    for target, device in (("local", CPU), ("h100", CUDA)):
        paths = write_target(tmp_path, target, device, {
            "bench/gelu.csv": rows(("skipped", "Triton needs a GPU"), op=["gelu"], impl=["triton"]),
            "mlp/summary.csv": rows(("skipped", "TF32 is a CUDA matmul mode"), variant=["tf32"]),
            "build/extension_checks.csv": rows(("skipped", "needs a GPU"), kind=["bad_input"], case=["mixed"])})
        for name, step in (("bench/gelu.csv", "bench_cell"), ("mlp/summary.csv", "mlp_profile"),
                           ("build/extension_checks.csv", "extension_build")):
            tables.setdefault(step, []).append(paths[name])
    out = tmp_path / "outcomes.csv"
    with pytest.raises(StrictModeError) as failed:
        check(tables, tmp_path, True, out)
    text = str(failed.value)
    # On the CPU target the MLP's TF32 and the GPU-only bad-input case are expected; on the H100 they are failures.
    assert text.startswith("strict mode: 4 outcome(s) are not ok, 2 more expected on the target's machine")
    for line in ("local bench_cell (bench/gelu.csv) [op=gelu, impl=triton] skipped: Triton needs a GPU",
                 "h100 mlp_profile (mlp/summary.csv) [variant=tf32] skipped: TF32 is a CUDA matmul mode",
                 "h100 extension_build (build/extension_checks.csv) [kind=bad_input, case=mixed] skipped"):
        assert line in text
    # The failure summary of the run (gpulab.workflow.failures) quotes the whole list from the step's log.
    assert final_error(f"Traceback (most recent call last):\n  File x\ngpulab.core.tables.StrictModeError: {text}\n") \
        == f"gpulab.core.tables.StrictModeError: {text}"
    assert len(pd.read_csv(out)) == 6  # the failed judgement leaves the recorded outcomes in place
    assert len(check(tables, tmp_path, False, out)) == 6  # off: recorded, not judged
    assert (tmp_path / "strict.txt").read_text().startswith("strict mode: 4 outcome(s) are not ok")
    assert summary(collect(tables, tmp_path)) == text


def test_a_run_where_all_is_ok_records_a_table_of_no_rows(tmp_path):
    paths = write_target(tmp_path, "local", CUDA, {"bench/add.csv": rows(("ok", ""), op=["add"])})
    out = tmp_path / "outcomes.csv"
    assert record({"bench_cell": [paths["bench/add.csv"]]}, tmp_path, False, out) == []
    assert pd.read_csv(out).empty and list(pd.read_csv(out).columns) == ["step", "table", "target", "row", "status",
                                                                         "reason", "expected"]


def test_strict_unstable_from_the_command_line_fails_on_an_unstable_measurement(tmp_path):
    from gpulab.workflow.config import validate_config

    strict = validate_config({"strict": "unstable"})["strict"]
    paths = write_target(tmp_path, "local", CUDA, {"bench/add.csv": rows(("ok", ""), op=["add"], stable=[False])})
    tables = {"bench_cell": [paths["bench/add.csv"]]}
    assert check(tables, tmp_path, True, tmp_path / "outcomes.csv") == []
    with pytest.raises(StrictModeError, match=r"\[op=add\] unstable: timing not stable"):
        check(tables, tmp_path, strict, tmp_path / "outcomes.csv")
