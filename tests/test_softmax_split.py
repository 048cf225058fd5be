"""Triton softmax for rows wider than one program: which kernel launch_choice picks (split on a GPU, looped in
the interpreter), the bound on SPLIT, labels and overrides; on a GPU host, the split kernel against torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from gpulab.kernels.triton.config import Target, softmax_config
from gpulab.kernels.triton.softmax import SoftmaxLaunch, launch_candidates, launch_choice

H100 = Target("cuda", 32, "sm_90", units=132)
MI300 = Target("hip", 64, "gfx942", units=304)
INTERPRETER = Target("interpreter", 32)


@pytest.mark.parametrize("target", [H100, MI300], ids=["nvidia", "cdna"])
def test_wide_rows_are_split_into_chunks_of_the_measured_size(target):
    config = softmax_config(target)
    chunk, threads = config.split_elems, config.split_elems // config.split_elems_per_thread
    for itemsize in (4, 2):
        assert launch_choice(2048, 131072, itemsize, target) == SoftmaxLaunch(
            "split", 1, chunk, threads // target.warp_size, split=131072 // chunk)
        ragged = launch_choice(3, 100003, itemsize, target)  # 100003 / 16 rounds up to the chunk
        assert (ragged.kernel, ragged.split, ragged.block_n) == ("split", 16, chunk)
        assert launch_choice(4, chunk * 4, itemsize, target).split == 4
        budget = config.max_fused_cols
        assert launch_choice(4096, budget, itemsize, target).kernel == "fused"  # fits: one program per row


def test_split_is_bounded_by_the_programs_the_device_runs_at_once():
    small = Target("cuda", 32, "sm_90", units=4)
    assert launch_choice(8, 32768, 4, small).split == 4  # 4 programs per row on 4 SMs: allowed
    assert launch_choice(8, 65536, 4, small).kernel == "looped"  # 8 would wait on programs that may never run
    with pytest.raises(ValueError, match="exceed the 4 SMs/CUs"):
        launch_choice(8, 65536, 4, small, split=8)
    with pytest.raises(ValueError, match="power of two"):
        launch_choice(8, 131072, 4, H100, split=12)
    with pytest.raises(ValueError, match="wider than one program"):
        launch_choice(8, 131072, 4, H100, split=4)  # 32768 fp32 columns a program
    assert launch_choice(8, 131072, 2, H100, split=4).block_n == 32768  # the same bytes in bf16: allowed
    # A target without a known unit count (ahead-of-time compiles) is not bounded.
    assert launch_choice(8, 1 << 24, 4, Target("cuda", 32, "sm_90")).split == 2048


def test_the_interpreter_never_splits():
    """Its programs run one after the other: the first would wait for the rest of its row until it gave up."""
    assert launch_choice(3, 100003, 4, INTERPRETER).kernel == "looped"
    with pytest.raises(ValueError, match="interpreter"):
        launch_choice(3, 100003, 4, INTERPRETER, split=8)


def test_split_labels_and_overrides_round_trip():
    found = [c for c in launch_candidates(2048, 131072, 4, H100) if c.kernel == "split"]
    assert {c.split for c in found} == {8, 16, 32, 64}
    for launch in found:
        assert launch.label == f"split SPLIT={launch.split} BLOCK_N={launch.block_n} num_warps={launch.num_warps}"
        assert launch_choice(2048, 131072, 4, H100, **launch.overrides()) == launch
        assert 4 <= launch.block_n // (launch.num_warps * 32) <= 64 and launch.split * launch.block_n == 131072
    looped = launch_choice(2048, 131072, 4, H100, looped_block=4096)
    assert looped.label.startswith("looped ") and looped.overrides()["split"] is None
    # The sweep keeps the study-style looped kernel beside the split one, so the report can name both.
    assert {c.kernel for c in launch_candidates(2048, 131072, 4, H100)} == {"split", "looped"}


# The interpreter runs programs one after the other, so the row's programs cannot wait for each other: the
# arrival counts are preset to "all in", and a second launch reads the partials the first one stored. What is
# checked is the kernel's arithmetic (chunks, masks, a chunk of only -inf, the combine, the strided store).
INTERPRETED_SPLIT = """
import torch
from gpulab.core.ops import check
from gpulab.kernels.triton.softmax import softmax_split_kernel, split_workspace
for rows, cols, split, block in ((3, 100003, 8, 16384), (2, 40000, 4, 16384), (1, 5000, 2, 4096)):
    x = torch.randn(rows, cols + 9)[:, 3:3 + cols] * 4
    x[0, :block] = float("-inf")
    y = torch.full_like(x, float("nan"))
    ticket, count, maxes, sums = split_workspace(rows, split, x.device)
    for _ in range(2):
        ticket.zero_()
        count.fill_(split)
        softmax_split_kernel[(rows * split,)](x, y, ticket, count, maxes, sums, cols, x.stride(0), y.stride(0),
                                              SPLIT=split, BLOCK_N=block)
    result = check("softmax", y, [x], "fp32")
    assert result.passed, (rows, cols, result.reason)
    assert (y[0, :block] == 0).all()
"""

# A row whose programs never all arrive: with the spin bound cut to 3 reads, every program but the row's last
# gives up and writes NaN (the gate's `incorrect`), instead of waiting forever.
INTERPRETED_GIVE_UP = """
import torch
import triton.language as tl
from gpulab.kernels.triton import softmax as module
module.SPLIT_MAX_SPINS = tl.constexpr(3)
x = torch.randn(1, 4 * 1024)
y = torch.zeros_like(x)
module.softmax_split_kernel[(4,)](x, y, *module.split_workspace(1, 4, x.device), 4096, 4096, 4096, SPLIT=4,
                                  BLOCK_N=1024)
assert y[0, :3 * 1024].isnan().all() and not y[0, 3 * 1024:].isnan().any()
"""


@pytest.mark.parametrize("code", [INTERPRETED_SPLIT, INTERPRETED_GIVE_UP], ids=["arithmetic", "gives_up"])
def test_split_kernel_in_the_interpreter(code):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif(not _gpu(), reason="needs a GPU: the split kernel's programs run side by side")
@pytest.mark.parametrize("rows, cols, dtype, strided", [
    (2048, 131072, "float32", False), (2048, 131072, "bfloat16", False), (3, 100003, "float32", False),
    (64, 65536, "bfloat16", True), (1, 131072, "float32", False), (5, 40000, "float32", True)])
def test_split_kernel_matches_torch_on_the_gpu(rows, cols, dtype, strided):
    """Every element against torch.softmax (the bench's gate: no NaN, the dtype's tolerance)."""
    import torch

    from gpulab.core.ops import check
    from gpulab.kernels.triton.config import current_target
    from gpulab.kernels.triton.softmax import softmax

    assert launch_choice(rows, cols, 4, current_target()).kernel == "split"
    torch.manual_seed(0)
    base = (torch.randn(rows, cols + 40 if strided else cols, device="cuda") * 4).to(getattr(torch, dtype))
    x = base[:, 7:7 + cols] if strided else base  # a row stride past the width, an unaligned start
    assert x.stride(0) == base.shape[1]
    for _ in range(3):  # repeated calls: a fresh workspace each time
        y = softmax(x)
        assert not y.isnan().any()
        result = check("softmax", y, [x], {"float32": "fp32", "bfloat16": "bf16"}[dtype])
        assert result.passed, result.reason


@pytest.mark.skipif(not _gpu(), reason="needs a GPU: the split kernel's programs run side by side")
def test_split_kernel_gives_zeros_for_a_chunk_of_only_minus_infinity():
    """A masked stretch as wide as a chunk: its program's max is -inf, yet the row is finite, so 0, not NaN."""
    import torch

    from gpulab.core.ops import check
    from gpulab.kernels.triton.softmax import softmax

    x = torch.randn(4, 131072, device="cuda")
    x[:, :40000] = float("-inf")
    y = softmax(x)
    assert (y[:, :40000] == 0).all() and check("softmax", y, [x], "fp32").passed
