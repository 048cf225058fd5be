"""Triton kernels in the style of the Triton tutorials (<op>_kernel, *_ptr args, UPPER_CASE constexprs)."""
