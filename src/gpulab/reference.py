"""Reference pages written from their sources, so the documentation cannot drift from them.

:func:`config_reference` turns the configuration's JSON schema into a Markdown page (one row per key,
nested keys dotted) and :func:`cli_reference` turns the ``gpulab`` command's argparse parser into one.
The documentation build (``docs/hooks.py``) writes both pages at build time.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Mapping
from typing import Any

from gpulab.workflow.config import load_schema

SCHEMA_NAME = "src/gpulab/schemas/config.schema.yaml"


def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """``node`` with a local ``$ref`` merged in (its own keys win)."""
    ref = node.get("$ref", "")
    if ref.startswith("#/$defs/"):
        return {**_resolve(defs[ref.removeprefix("#/$defs/")], defs), **{k: v for k, v in node.items() if k != "$ref"}}
    return dict(node)


def _type(node: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    node = _resolve(node, defs)
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return " | ".join(json.dumps(v) for v in node["enum"])
    for combiner in ("oneOf", "anyOf"):
        if combiner in node:
            return " or ".join(_type(option, defs) for option in node[combiner])
    kind = node.get("type", "any")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    bounds = [f"{word} {node[key]}" for key, word in (("minimum", "≥"), ("exclusiveMinimum", ">"),
                                                       ("maximum", "≤")) if key in node]
    if kind == "array" and "items" in node:
        kind = f"list of {_type(node['items'], defs)}"
    return f"{kind} {' '.join(bounds)}".strip()


def schema_keys(schema: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted key, resolved node) of every key the schema documents; ``<name>`` stands for a free key."""
    defs = schema.get("$defs", {})

    def walk(prefix: str, node: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        node = _resolve(node, defs)
        for name, child in node.get("properties", {}).items():
            key = f"{prefix}{name}"
            yield key, _resolve(child, defs)
            yield from walk(f"{key}.", child)
        for option in node.get("oneOf", []) + node.get("anyOf", []):
            yield from walk(prefix, option)
        extra = node.get("additionalProperties")
        if isinstance(extra, Mapping) and "properties" in _resolve(extra, defs):
            yield from walk(f"{prefix}<name>.", extra)

    yield from walk("", schema)


def _cell(text: Any) -> str:
    """One table cell: one line, pipes escaped, and ``<name>`` shown as text rather than read as an HTML tag."""
    return " ".join(str(text).split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def config_reference(schema: Mapping[str, Any] | None = None) -> str:
    """The configuration reference page: every key with its type, default and description."""
    schema = schema if schema is not None else load_schema()
    defs = schema.get("$defs", {})
    lines = [
        "# Configuration reference",
        "",
        f"Generated from `{SCHEMA_NAME}` when the documentation is built; the workflow validates every run's",
        "configuration against the same schema before any job starts. "
        + _cell(schema.get("description", "")),
        "",
        "Set keys in `config.yaml`, in a file passed with `--configfile`, or on the command line "
        "(`snakemake --config timing='{min_time_s: 0.5}'`). `<name>` stands for a name you choose.",
        "",
        "| key | type | default | description |",
        "| --- | --- | --- | --- |",
    ]
    for key, node in schema_keys(schema):
        default = f"`{json.dumps(node['default'])}`" if "default" in node else ""
        description = _cell(node.get("description", ""))
        lines.append(f"| `{key}` | {_cell(_type(node, defs))} | {_cell(default)} | {description} |")
    return "\n".join(lines) + "\n"


def _usage(parser: argparse.ArgumentParser) -> str:
    return " ".join(parser.format_usage().removeprefix("usage: ").split())


def _options(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | description |", "| --- | --- |"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(action.option_strings) or action.metavar or action.dest
        text = (action.help or "") % {"default": action.default} if action.help else ""
        if action.choices:
            text += f" (one of: {', '.join(map(str, action.choices))})"
        rows.append(f"| `{name}` | {_cell(text)} |")
    return rows


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """The command-line reference page: every subcommand of ``gpulab`` with its usage and arguments."""
    if parser is None:
        from gpulab.cli import parser as gpulab_parser

        parser = gpulab_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    lines = ["# Command-line reference", "",
             "Generated from the argparse parser of `gpulab` (`src/gpulab/cli.py`) when the documentation is built.",
             "", _cell(parser.description or ""), ""]
    for name, command in sub.choices.items():
        lines += [f"## `gpulab {name}`", "", _cell(helps.get(name, "")), "",
                  "```text", _usage(command), "```", "", *_options(command), ""]
    return "\n".join(lines)
