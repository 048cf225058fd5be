"""Load and validate the workflow configuration against ``workflow/schemas/config.schema.yaml``.

The schema is the single source of truth for keys, types, allowed values and defaults; this module
only turns jsonschema's findings into messages that name the offending key and what it may be.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpulab.paths import CONFIG_SCHEMA


class ConfigError(ValueError):
    """The configuration does not match the schema; the message lists every problem found."""


def load_schema(path: Path = CONFIG_SCHEMA) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def _key_path(parts: Iterator[Any]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<top level>"


def _allowed(schema: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    """Describe what a (sub)schema admits, resolving local $refs, for error messages."""
    if "$ref" in schema:
        ref = schema["$ref"].removeprefix("#/").split("/")
        node: Any = root
        for part in ref:
            node = node[part]
        return _allowed(node, root)
    if "enum" in schema:
        return "one of " + ", ".join(repr(v) for v in schema["enum"])
    if "const" in schema:
        return repr(schema["const"])
    if "oneOf" in schema:
        return " or ".join(_allowed(s, root) for s in schema["oneOf"])
    kind = schema.get("type", "any value")
    bounds = []
    if "minimum" in schema:
        bounds.append(f">= {schema['minimum']}")
    if "exclusiveMinimum" in schema:
        bounds.append(f"> {schema['exclusiveMinimum']}")
    if "maximum" in schema:
        bounds.append(f"<= {schema['maximum']}")
    if "pattern" in schema:
        bounds.append(f"matching {schema['pattern']}")
    return f"{kind} {' '.join(bounds)}".strip()


def _describe(error: Any, root: Mapping[str, Any]) -> str:
    if error.validator == "oneOf" and error.context and not isinstance(error.instance, str):
        # Report the branch that got furthest into the value (e.g. a negative size inside a list).
        deepest = max(error.context, key=lambda e: len(e.absolute_path))
        if len(deepest.absolute_path) > len(error.absolute_path):
            return _describe(deepest, root)
    where = _key_path(iter(error.absolute_path))
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        prefix = f"{where}." if error.absolute_path else ""
        names = ", ".join(f"'{prefix}{k}'" for k in extra)
        return f"unknown key {names}; allowed keys here: {', '.join(allowed)}"
    if error.validator in {"enum", "const", "oneOf", "type", "minimum", "exclusiveMinimum", "maximum", "pattern"}:
        return f"{where}: {error.instance!r} is not allowed; expected {_allowed(error.schema, root)}"
    return f"{where}: {error.message}"


def _fill_defaults(instance: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> None:
    """Insert schema defaults for missing keys, recursing into objects (what snakemake's validate does)."""
    if "$ref" in schema:
        node: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = node
    if not isinstance(instance, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            _fill_defaults(instance[key], sub, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in instance.items():
            if key not in schema.get("properties", {}):
                _fill_defaults(value, extra, root)


def validate_config(config: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return a validated copy of ``config`` with defaults filled in, or raise :class:`ConfigError`."""
    import jsonschema  # imported here: GPU hosts that only run steps need not have it

    schema = schema or load_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        lines = "\n".join(f"  - {_describe(e, schema)}" for e in errors)
        raise ConfigError(f"invalid gpulab configuration ({len(errors)} problem(s)):\n{lines}")
    filled = copy.deepcopy(dict(config))
    _fill_defaults(filled, schema, schema)
    # Defaults must themselves be valid: a schema bug should fail here, not inside a job.
    validator.validate(filled)
    return filled


def load_config(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        raw = yaml.safe_load(fh) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the configuration must be a mapping of keys to values")
    return validate_config(raw)


def config_hash(config: Mapping[str, Any]) -> str:
    """Stable short hash of the effective configuration, recorded in the environment fingerprint."""
    blob = json.dumps(config, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def run_targets(config: Mapping[str, Any]) -> list[str]:
    """Targets one invocation produces results for: all configured machine classes, else the local one."""
    return sorted(config["targets"]) if config.get("targets") else [config["target"]]
