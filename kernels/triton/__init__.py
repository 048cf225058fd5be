"""Triton kernels in the style of the Triton tutorials (<op>_kernel, *_ptr args, UPPER_CASE constexprs).

The kernel module of a benchmarked op (``<op>.py``, named by its entry in the op registry, gpulab.core.ops) holds
``<op>_kernel`` and the thin wrapper ``<op>(*inputs, out=None, **launch)``. An elementwise kernel (``*_ptr``
arguments, ``n_elements``, ``OFFSETS_64``, ``BLOCK_SIZE``, launched through ``config.launch_elementwise``) needs
nothing else: its tuning candidates and ahead-of-time launches are its family's elementwise list. A kernel that
picks its own launches also defines ``launch_choice`` and ``launch_candidates`` (the tuning sweep) and
``aot_launches`` (the compile table), as ``softmax.py`` does.
"""
