"""The repository's ``kernels/`` directory, importable as the package ``gpulab.kernels``.

Kernel sources (HIP/CUDA C++ and Triton) live at the top of the repository, as the study lays them out;
giving this module a ``__path__`` makes ``import gpulab.kernels.triton.gelu`` load
``kernels/triton/gelu.py`` with no install step, on the GPU hosts too (``PYTHONPATH=workflow``).
"""

from gpulab.paths import KERNELS_DIR

__path__ = [str(KERNELS_DIR)]
