"""Read what every target left under ``results/``: the report's only input."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class ResultsIndex:
    """All targets found under a results directory, including ones copied in from other machines."""

    root: Path

    @property
    def targets(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))

    def path(self, target: str, relpath: str) -> Path:
        return self.root / target / relpath

    def env(self, target: str) -> dict[str, Any] | None:
        path = self.path(target, "env/env.json")
        if not path.exists():
            return None
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)

    def table(self, relpath: str) -> pd.DataFrame:
        """One artifact (e.g. ``bench/gelu.csv``) of every target that has it, concatenated."""
        frames = [pd.read_csv(p) for t in self.targets if (p := self.path(t, relpath)).exists()]
        frames = [f for f in frames if not f.empty]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def tables(self, pattern: str) -> pd.DataFrame:
        """Every file matching a glob under each target (e.g. ``llm/*.csv``), concatenated."""
        frames = []
        for target in self.targets:
            for path in sorted((self.root / target).glob(pattern)):
                frame = pd.read_csv(path)
                if not frame.empty:
                    frames.append(frame)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def outcome_files(self, target: str) -> Iterator[tuple[str, pd.DataFrame]]:
        """Every CSV of a target that records outcomes (has a status column), by step/file."""
        base = self.root / target
        for path in sorted(base.rglob("*.csv")):
            try:
                frame = pd.read_csv(path)
            except (pd.errors.EmptyDataError, pd.errors.ParserError):
                continue
            if "status" in frame.columns:
                yield str(path.relative_to(base)), frame
