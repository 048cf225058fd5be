"""Record where this job ran (its Slurm variables) and the environment its target gave it."""

from gpulab.core.logs import to_log

to_log(snakemake.log[0])

import json  # noqa: E402
import os  # noqa: E402
import socket  # noqa: E402

from gpulab.workflow.cluster import apply_target_env  # noqa: E402

applied = apply_target_env(snakemake.config, snakemake.wildcards.target)
record = {
    "target": snakemake.wildcards.target,
    "host": socket.gethostname(),
    "slurm": {name: value for name, value in os.environ.items() if name.startswith("SLURM_")},
    "applied": applied,
    "environ": {name: os.environ.get(name) for name in ("GPULAB_CI_OVERRIDDEN", "GPULAB_CI_INHERITED",
                                                         "GPULAB_CI_MARK", "HSA_OVERRIDE_GFX_VERSION")},
}
with open(snakemake.output[0], "w", encoding="utf-8") as fh:
    json.dump(record, fh, indent=2, sort_keys=True)
