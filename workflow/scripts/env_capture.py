"""Snakemake script of rule env_capture: thin wrapper over gpulab.env_capture."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.cluster import apply_target_env  # noqa: E402

# Before device detection: a target's variables (e.g. HSA_OVERRIDE_GFX_VERSION) change what it reports.
apply_target_env(snakemake.config, snakemake.wildcards.target)

from pathlib import Path  # noqa: E402

from gpulab.env_capture import TOOLS, capture  # noqa: E402
from gpulab.tables import enforce_strict  # noqa: E402

out_dir = Path(snakemake.output.env).parent
env = capture(
    out_dir,
    target=snakemake.wildcards.target,
    timeout_s=snakemake.params.timeout_s,
)
print(f"fingerprint {env['fingerprint']}: {env['device']['backend']} / {env['device']['name']}")
tools = TOOLS.read(snakemake.output.tools)
enforce_strict(tools[tools["required"]], snakemake.params.strict, "env_capture (tools required on this backend)")
