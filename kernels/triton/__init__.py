"""Triton kernels in the style of the Triton tutorials (<op>_kernel, *_ptr args, UPPER_CASE constexprs).

An op's module (``<op>.py``, named by its op registry entry) holds ``<op>_kernel`` and the wrapper
``<op>(*inputs, out=None, **launch)``. An elementwise kernel needs nothing else; one that picks its own launches
also defines ``launch_choice``, ``launch_candidates`` and ``aot_launches``, as ``softmax.py`` does.
"""
