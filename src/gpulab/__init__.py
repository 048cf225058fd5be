"""gpulab: a reproducible GPU operator-optimisation study (ROCm/HIP, CUDA, CPU).

Each concept lives in one module: ``device`` (backend detection), ``timing`` (the one timing
function), ``tables`` (CSV schemas and atomic writes), ``env_capture`` (fingerprint and runtime stack),
``ceilings`` (measured hardware limits), ``config`` (schema validation) and ``report`` (the HTML page).
"""

__version__ = "0.1.0"
