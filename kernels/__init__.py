"""The study's kernels, installed as ``gpulab.kernels`` (pyproject.toml maps this directory onto the package).

``triton/`` holds the Triton kernels (Python modules); ``ext/`` and ``hip/`` hold the C++/HIP sources that the
build steps compile.
"""
