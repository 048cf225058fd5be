"""The configuration schema as written (package data ``schemas/config.schema.yaml``), for the defaults a step reads.

The lists only the registries know (ops, implementations, engines) are filled in by
:func:`gpulab.workflow.config.load_schema`, which validation uses; reading the file here keeps a step's code free of
every registry it does not run.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpulab.core.paths import CONFIG_SCHEMA


@functools.cache
def schema_file(path: Path = CONFIG_SCHEMA) -> dict[str, Any]:
    """The schema as written; shared, so never modified."""
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def config_hash(config: Mapping[str, Any]) -> str:
    """Stable short hash of the effective configuration, recorded in the environment fingerprint."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]
