"""``torch.compile`` with static shapes, as the torch.compile implementation and the ceilings use it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Static-shape graphs dynamo may keep for one code object: every case of a cell (sizes x dtypes) at once.
RECOMPILE_LIMIT = 256


def static_compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile(fn, dynamic=False)``, with dynamo's recompile limit raised to RECOMPILE_LIMIT and reaching it
    an error: every shape and dtype it is called with keeps a static graph of its own, never eager PyTorch."""
    import torch

    config = torch._dynamo.config
    for name in ("recompile_limit", "accumulated_recompile_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True
    return torch.compile(fn, dynamic=False)
