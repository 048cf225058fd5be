"""MLP profiling: where the time of a forward+backward step goes, per kernel, per precision variant.

The study's model (``Linear -> GeLU`` x ``num_layers``, loss ``model(x).mean()``) is checked against a float64
reference, timed, placed against the measured matmul ceiling and profiled: ``model`` (sizes, FLOPs, variants),
``profile`` (the tables and :func:`~gpulab.mlp.profile.profile_mlp`), ``ceilings`` (its own GEMM ceilings).
"""
