"""Snakemake script of rule kernels_compile: every kernel compiled for one architecture (no GPU needed)."""

from gpulab.logs import to_log

to_log(snakemake.log[0])

from gpulab.env_capture import read_fingerprint  # noqa: E402
from gpulab.kernel_compile.job import compile_arch  # noqa: E402
from gpulab.tables import enforce_strict, write_atomic  # noqa: E402

table = compile_arch(
    snakemake.wildcards.arch,
    tuple(snakemake.params.dtypes),
    target=snakemake.wildcards.target,
    fingerprint=read_fingerprint(snakemake.input.env),
    sizes=snakemake.params.sizes,
)
write_atomic(snakemake.output[0], table.to_csv(index=False))
columns = ["kernel", "variant", "dtype", "status", "registers", "spilled_regs", "occupancy", "compile_s", "reason"]
print(table[columns].to_string(index=False))
# Triton ships its compilers, so its rows must compile anywhere; hipcc rows depend on the installed hipcc
# (absent on NVIDIA hosts, without gfx1151 in Debian's), which strict mode does not judge.
enforce_strict(table[table["compiler"].str.startswith("triton")], snakemake.params.strict, "kernels_compile")
