"""gpulab: a reproducible GPU operator-optimisation study (ROCm/HIP, CUDA, CPU).

Packages by layer, each importing only those below it (docs/architecture.md): ``core``, ``env``,
``native``/``mlp``/``llm``, ``bench``, ``toolchains``, ``workflow``, ``report``, then ``cli``.
"""

__version__ = "0.1.0"
