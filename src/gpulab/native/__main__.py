"""Fresh-process helpers of the extension step (``python -m gpulab.native``), each printing one JSON line.

``load --manifest M``: load the library the manifest names (the step's warm load);
``case --manifest M --case NAME [--case NAME ...] --device D [--claim-device]``: bad-input calls in order, one
JSON line each, printed as each ends (a crash kills only this process; the caller sees which case did it).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpulab.native", description=__doc__)
    parser.add_argument("command", choices=("load", "case"))
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--case", action="append", default=[],
                        help="bad-input case name (gpulab.native.checks.BAD_CASES); repeatable")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--claim-device", action="store_true",
                        help="wait for, then hold, the run's device lock (gpulab.core.device) before the cases")
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (imported first: its import time is not the extension's load time)

    from gpulab.native.checks import call_case
    from gpulab.native.manifest import load_from_manifest

    loaded = load_from_manifest(args.manifest)
    if args.command == "load":
        print(json.dumps(loaded.as_dict(), default=str))
        return 0 if loaded.status != "failed" else 1
    loaded.raise_for_status()
    if args.claim_device:
        from gpulab.core.device_lock import claim_device

        claim_device()
    for name in args.case:
        print(json.dumps({"case": name, **call_case(name, args.device)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
