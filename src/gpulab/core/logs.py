"""Send a step's output to its Snakemake log before anything else runs."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def to_log(path: str | os.PathLike[str]) -> None:
    """Redirect this process's stdout and stderr (file descriptors too, so compilers and other child
    processes land in the log) to ``path`` and configure logging to write there."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = log
    sys.stderr = log
    logging.basicConfig(
        stream=log,
        level=logging.INFO,
        format=LOG_FORMAT,
        force=True,
    )
