"""MLP profiling: where the time of a forward+backward step goes, per kernel, per precision variant.

The study's model (``Linear -> GeLU`` repeated ``num_layers`` times, loss ``model(x).mean()``) is timed
with :func:`gpulab.core.timing.measure`, checked against a float64 reference, placed against the measured
matmul ceiling and profiled with ``torch.profiler``.

- ``gpulab.mlp.model``: the model, its sizes ("auto" per device), the matmul FLOP count, the variants;
- ``gpulab.core.kernel_trace``: profiler events -> kernel rows classified by phase and category (no torch
  import at module level, so the report can use it);
- ``gpulab.mlp.profile``: the artifacts' schemas and :func:`~gpulab.mlp.profile.profile_mlp`, which runs
  a target's variants and writes ``results/<target>/mlp/``.
"""
