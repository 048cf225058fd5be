"""Every step's not-ok outcomes in one table, on every run (rule ``outcomes_record``), and strict mode's judgement
of them (rule ``outcomes_check``): measuring steps record every outcome and never fail for one, so turning strict on
or off measures nothing again. What the target's machine cannot do by design (:data:`EXPECTED`) is listed apart and
not judged; ``strict: unstable`` also counts an ok row whose timing was not stable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from gpulab.core.ceilings import CEILINGS
from gpulab.core.device import DeviceInfo
from gpulab.core.tables import StrictModeError, write_atomic

# Columns that say which row of a table an outcome is, in the order a reader names them.
IDENTITY = ("tool", "library", "phase", "kind", "case", "method", "arch", "compiler", "source", "kernel", "variant",
            "op", "impl", "model", "engine", "test", "call_order", "dtype", "shape", "size")
OUTCOME_COLUMNS = ("step", "table", "target", "row", "status", "reason", "expected")

# Per table (path under results/<target>/): the not-ok rows the target's machine cannot avoid, and why they are
# expected there. Judged on the device recorded in the target's env/env.json, not on the host that judges.
Expectation = Callable[[pd.DataFrame, DeviceInfo], "pd.Series[bool]"]


def _mlp_unavailable(table: pd.DataFrame, device: DeviceInfo) -> pd.Series:
    from gpulab.mlp.model import VARIANTS

    return table["variant"].map(lambda v: v in VARIANTS and VARIANTS[v].unavailable(device) is not None)


EXPECTED: dict[str, tuple[str, Expectation]] = {
    "env/tools.csv": ("not required on this backend", lambda t, d: ~t["required"].astype(str).str.lower().eq("true")),
    "build/kernel_resources.csv": ("hipcc rows depend on the installed hipcc",
                                   lambda t, d: ~t["compiler"].astype(str).str.startswith("triton")),
    "build/extension_checks.csv": ("bad-input cases that mix a CPU and a GPU tensor need a GPU",
                                   lambda t, d: (t["kind"] == "bad_input") & (t["status"] == "skipped")
                                   & (not d.gpu_available)),
    CEILINGS.path: ("Triton ceilings need a GPU",
                    lambda t, d: (t["status"] == "skipped") & (not d.gpu_available)),
    "mlp/summary.csv": ("the variant does not exist on this backend", _mlp_unavailable),
}


@dataclass(frozen=True)
class Outcome:
    """One outcome that is not ok: where it was recorded, which row, what happened and why."""

    step: str
    table: str
    target: str
    row: str
    status: str
    reason: str
    expected: str = ""  # why the target's machine cannot do better, when it cannot

    def line(self) -> str:
        reason = self.reason or "(no reason)"
        return f"  - {self.target} {self.step} ({self.table}) [{self.row}] {self.status}: {reason}"


def recorded_device(env_json: str | Path) -> DeviceInfo:
    """The device a target's env/env.json recorded, as the measuring steps saw it."""
    device = json.loads(Path(env_json).read_text(encoding="utf-8"))["device"]
    return DeviceInfo(**{f.name: device[f.name] for f in fields(DeviceInfo) if f.name in device})


def _plain(value: Any) -> str:
    """A cell as a person wrote it: 1024, not 1024.0."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _identity(row: Mapping[str, Any], columns: Sequence[str]) -> str:
    cells = ((c, row[c]) for c in columns)
    return ", ".join(f"{c}={_plain(v)}" for c, v in cells
                     if not (v is None or (isinstance(v, float) and math.isnan(v)) or v == ""))


def not_ok(table: pd.DataFrame, unstable: bool = False) -> pd.DataFrame:
    """Rows whose status is not ok; with ``unstable`` also ok rows measured with an unstable timing."""
    bad = table["status"] != "ok"
    if unstable and "stable" in table.columns:
        bad |= (table["status"] == "ok") & table["stable"].astype(str).str.lower().eq("false")
    out = table[bad].copy()
    # An empty reason reads back as NaN: a text column again.
    out["reason"] = out["reason"].astype("object").where(out["reason"].notna(), "") if "reason" in out else ""
    if unstable and "stable" in out.columns:
        is_unstable = (out["status"] == "ok") & out["stable"].astype(str).str.lower().eq("false")
        out.loc[is_unstable, "status"] = "unstable"
        out.loc[is_unstable, "reason"] = "timing not stable (cv, mean over median or too few repetitions)"
    return out


def table_outcomes(step: str, name: str, table: pd.DataFrame, device: DeviceInfo,
                   unstable: bool = False) -> list[Outcome]:
    """Every not-ok outcome of one table ``name`` (its path under results/<target>/) recorded by ``step``."""
    bad = not_ok(table, unstable)
    why, rule = EXPECTED.get(name, ("", None))
    expected = rule(bad, device) if rule is not None and not bad.empty else pd.Series(False, index=bad.index)
    columns = [c for c in IDENTITY if c in bad.columns]
    return [Outcome(step, name, str(row.get("target", "")), _identity(row, columns), str(row["status"]),
                    str(row.get("reason") or ""), why if is_expected else "")
            for (_, row), is_expected in zip(bad.iterrows(), expected.astype(bool), strict=True)]


def collect(tables: Mapping[str, Sequence[str]], results_dir: str | Path, unstable: bool = False) -> list[Outcome]:
    """Every not-ok outcome of every table: ``tables`` maps each step to its recorded tables' paths,
    ``results_dir/<target>/<name>``; each target's device is read from its env/env.json."""
    root = Path(results_dir)
    outcomes: list[Outcome] = []
    for step, paths in tables.items():
        for path in map(Path, paths):
            target, *rest = path.relative_to(root).parts
            device = recorded_device(root / target / "env" / "env.json")
            table = pd.read_csv(path, keep_default_na=True, low_memory=False)
            outcomes += table_outcomes(step, "/".join(rest), table, device, unstable)
    return outcomes


def summary(outcomes: Sequence[Outcome]) -> str:
    """One text: the outcomes that fail strict mode, then the expected ones, each with step, row and reason."""
    judged = [o for o in outcomes if not o.expected]
    lines = [f"strict mode: {len(judged)} outcome(s) are not ok, {len(outcomes) - len(judged)} more expected on "
             "the target's machine"]
    lines += [o.line() for o in judged]
    expected = [o for o in outcomes if o.expected]
    if expected:
        lines.append("  expected on the target's machine (listed, not judged):")
        lines += [f"  {o.line()} (expected: {o.expected})" for o in expected]
    return "\n".join(lines)


def record(tables: Mapping[str, Sequence[str]], results_dir: str | Path, unstable: bool,
           out_csv: str | Path) -> list[Outcome]:
    """Record every not-ok outcome in ``out_csv``: on every run, a header alone where all is ok."""
    outcomes = collect(tables, results_dir, unstable=unstable)
    frame = pd.DataFrame([o.__dict__ for o in outcomes], columns=list(OUTCOME_COLUMNS))
    write_atomic(out_csv, frame.to_csv(index=False))
    print(summary(outcomes))
    return outcomes


def recorded(out_csv: str | Path) -> list[Outcome]:
    frame = pd.read_csv(out_csv, dtype=str, keep_default_na=False)
    return [Outcome(**{c: row[c] for c in OUTCOME_COLUMNS}) for row in frame.to_dict("records")]


def judge(out_csv: str | Path, strict: bool | str, verdict: str | Path) -> list[Outcome]:
    """Strict mode's verdict on the recorded outcomes: with ``strict`` fail, in one summary, if any is not
    expected; else write that summary to ``verdict``."""
    outcomes = recorded(out_csv)
    text = summary(outcomes)
    print(text)
    if strict and any(not o.expected for o in outcomes):
        raise StrictModeError(text)
    write_atomic(verdict, text + "\n")
    return outcomes
