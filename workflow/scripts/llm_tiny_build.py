"""Snakemake script of rule llm_tiny_build: thin wrapper over gpulab.llm.tiny."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

import json  # noqa: E402
from pathlib import Path  # noqa: E402

from gpulab.llm.tiny import build_tiny  # noqa: E402

path = build_tiny(snakemake.output[0], seed=int(snakemake.params.seed))
print(f"tiny model written to {path}: {json.loads((Path(path) / 'gpulab_tiny.json').read_text())}")
