"""Load and validate the workflow configuration against ``gpulab/schemas/config.schema.yaml`` (package data).

The schema is the single source of truth for keys, types, allowed values and defaults; this module
only turns jsonschema's findings into messages that name the offending key and what it may be.

``snakemake --config key=value`` hands nested values over as strings (``mlp='{dim: 1024}'`` gives
``{"dim": "1024"}``), so strings are first converted to the type the schema expects at that key
(:func:`coerce_config`). A string that does not convert stays as typed, and the error quotes it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from gpulab.core.paths import CONFIG_SCHEMA
from gpulab.core.schema import config_hash, schema_file  # noqa: F401 - config_hash: part of this module's API


class ConfigError(ValueError):
    """The configuration does not match the schema; the message lists every problem found."""


def load_schema(path: Path = CONFIG_SCHEMA) -> dict[str, Any]:
    """The schema with the names only the registries know filled in: the ops (gpulab.core.ops), their
    implementations (gpulab.bench.impls) and per-op sizes, and the LLM engines (gpulab.llm.engines)."""
    from gpulab.bench.impls import IMPLS
    from gpulab.core.ops import OPS, size_schema
    from gpulab.llm.engines import ENGINES

    schema = copy.deepcopy(schema_file(path))
    bench = schema["properties"]["bench"]["properties"]
    _choices(bench["ops"], list(OPS))
    _choices(bench["impls"], list(IMPLS))
    per_op = next(branch for branch in bench["sizes"]["oneOf"] if branch.get("type") == "object")
    per_op["properties"] = {name: size_schema(spec) for name, spec in OPS.items()}
    _choices(schema["properties"]["llm"]["properties"]["engines"], list(ENGINES))
    return schema


def _choices(node: dict[str, Any], names: list[str]) -> None:
    """A list setting whose items are registered names, all of them by default."""
    node["items"] = {"type": "string", "enum": names}
    node["default"] = names


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


def _resolve(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    while "$ref" in schema:
        node: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


_INTEGER = re.compile(r"[-+]?[0-9]+")
_BOOLEANS = {"true": True, "false": False}
_NULLS = {"null", "~"}


def _scalar(text: str, kind: str) -> tuple[bool, Any]:
    """Convert command-line text to one JSON-schema type, as YAML would read it; (False, None) if it does not."""
    if kind == "null" and text.lower() in _NULLS:
        return True, None
    if kind == "boolean" and text.lower() in _BOOLEANS:
        return True, _BOOLEANS[text.lower()]
    if kind in ("integer", "number") and _INTEGER.fullmatch(text.strip()):
        return True, int(text)
    if kind == "number":
        try:
            value = float(text)
        except ValueError:
            return False, None
        return (True, value) if value == value and abs(value) != float("inf") else (False, None)
    return False, None


def _matches(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any]) -> bool:
    import jsonschema

    return jsonschema.Draft202012Validator({**schema, "$defs": root.get("$defs", {})}).is_valid(value)


def coerce_config(value: Any, schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> Any:
    """Convert strings inside ``value`` to the types ``schema`` expects there (numbers, booleans, null),
    recursing into mappings and lists; anything that does not convert is returned unchanged."""
    root = schema if root is None else root
    schema = _resolve(schema, root)
    branches = schema.get("oneOf") or schema.get("anyOf")
    if branches:
        for branch in branches:  # the first branch the converted value satisfies
            candidate = coerce_config(value, branch, root)
            if _matches(candidate, branch, root):
                return candidate
        return value
    kinds = schema.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    if isinstance(value, str):
        if "null" in kinds and value.lower() in _NULLS:
            return None  # as YAML reads `partition: null`
        if "const" in schema or "enum" in schema or "string" in kinds:
            return value
        for kind in ("null", "boolean", "integer", "number"):
            if kind in kinds:
                ok, converted = _scalar(value, kind)
                if ok:
                    return converted
        return value
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [coerce_config(v, schema["items"], root) for v in value]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {
            k: coerce_config(v, props[k], root) if k in props
            else coerce_config(v, extra, root) if isinstance(extra, Mapping) else v
            for k, v in value.items()
        }
    return value


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
    config = coerce_config(dict(config), schema)
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


def run_targets(config: Mapping[str, Any]) -> list[str]:
    """Targets one invocation produces results for: all configured machine classes, else the local one."""
    return sorted(config["targets"]) if config.get("targets") else [config["target"]]
