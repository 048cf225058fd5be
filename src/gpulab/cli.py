"""``gpulab``: render, compare and check reports outside Snakemake.

Commands: ``report`` (re-render from a results directory; ``--bundle`` zips it with the files it links to),
``compare BASELINE NEW`` (the report with a verdict per cell; results directories or kept runs such as
``results/local@<run>``), ``history`` (the runs kept of each target), ``check-report`` (open it in headless
Chromium), ``example-report`` (the recorded H100 and CPU runs).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from gpulab.core.jobenv import available_cores
from gpulab.workflow.config import ConfigError, load_config, validate_config

console = Console(stderr=True, highlight=False, soft_wrap=True)
# A usage the command refuses (a path that is not a results root, a gate with nothing to read): exit 2, never the
# 1 of a regression, so a CI job cannot mistake one for the other.
REFUSED = 2


class Refused(SystemExit):
    """The command cannot do what was asked: exits :data:`REFUSED`; the message is one line saying why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.code = REFUSED


def _config(path: str | None) -> dict[str, Any]:
    """The given config file, else ./config.yaml (a workflow checkout's), else the schema's defaults."""
    if path is not None:
        return load_config(path)
    local = Path("config.yaml")
    if local.is_file():
        return load_config(local)
    return validate_config({})


def _results_dir(value: str, what: str) -> Path:
    """A results root (``results``, holding ``<target>/<step>/...``); a target directory inside one is refused,
    naming the root to give."""
    from gpulab.core.history import HISTORY
    from gpulab.report.results import ResultsIndex

    path = Path(value)
    if not path.is_dir():
        raise Refused(f"{what} {value!r} is not a directory")
    # What only a target directory holds: its environment capture, kept runs, jobs' records and logs.
    if (path / "env" / "env.json").is_file() or any((path / d).is_dir() for d in (HISTORY, "benchmarks", "logs")):
        raise Refused(f"{value} is a target directory; give its results root: {path.parent}")
    if not ResultsIndex(path).targets:
        raise Refused(f"{what} {value!r} holds no results (expected {value}/<target>/<step>/...)")
    return path


def _report(args: argparse.Namespace, command: str) -> int:
    from gpulab.report.render import render_report

    config = _config(args.config)
    results = _results_dir(args.results or config["results_dir"], "results directory")
    output = Path(args.output or config["report"]["output"])
    rendered = render_report(results, output, config, command, title=args.title, workers=available_cores())
    _summarise(rendered)
    if args.bundle is not None:
        from gpulab.report.bundle import write_bundle

        bundle = write_bundle(rendered.path, results, Path(args.bundle) if args.bundle else output.with_suffix(".zip"))
        print(f"bundle written to {bundle.path} ({bundle.files} files, {bundle.size_bytes / 2**20:.2f} MB): the page "
              "and every results file it links to; unpacked anywhere, its links still open")
        for href in bundle.outside:
            print(f"  not in the bundle (outside {results}): {href}")
    return 0


def _run_or_results(value: str, what: str) -> tuple[Path, str, str | None]:
    """A results directory, or a kept run of a target (gpulab.core.history) as one; its name; the kept run's id."""
    from gpulab.core.history import resolve_results

    try:
        path, run = resolve_results(value)
    except LookupError as exc:
        raise Refused(f"{what}: {exc}") from None
    return _results_dir(str(path), what), run or value, run.split("@", 1)[1] if run else None


def _compare(args: argparse.Namespace, command: str) -> int:
    from gpulab.report.render import render_report, table_limit

    config = _config(args.config)
    baseline, baseline_name, baseline_run = _run_or_results(args.baseline, "baseline results")
    new, new_name, new_run = _run_or_results(args.new, "new results")
    if baseline.resolve() == new.resolve() or baseline_name == new_name:
        raise Refused("BASELINE and NEW are the same directory (or the same kept run); nothing to compare")
    title = args.title or f"{config['report']['title'] or 'gpulab'}: {new_name} against {baseline_name}"
    min_effect = args.min_effect / 100
    # The changes section reads these from here (keys starting with "_" are not configuration).
    config = {**config, "_min_effect": min_effect, "_across_devices": args.across_devices,
              "_runs": (baseline_run, new_run)}
    rendered = render_report(new, Path(args.output), config, command, baseline_dir=baseline, title=title,
                             workers=available_cores())
    _summarise(rendered)
    return _verdicts((baseline, baseline_name, baseline_run), (new, new_name, new_run), min_effect, args.fail_on,
                     args.across_devices, table_limit(config))


# How many cells that are not comparable are named one by one; the rest are counted.
NOT_COMPARABLE_SHOWN = 20


def _cell(row: dict[str, Any]) -> str:
    from rich.markup import escape

    from gpulab.report.compare import shown
    from gpulab.report.results import KEY_COLUMNS

    keys = ", ".join(f"{k}={shown(row[k])}" for k in KEY_COLUMNS if k in row and row[k] == row[k])
    return f"{row['target']} {row['artifact']} {escape(f'[{keys}]')}"


def _verdicts(baseline: tuple[Path, str, str | None], new: tuple[Path, str, str | None], min_effect: float,
              fail_on: str | None, across_devices: bool, limit: int) -> int:
    """Print both runs (device, commit, configuration digest, the configuration keys that differ) and the per-cell
    verdicts; with ``--fail-on regression``, exit 1 on a regression and 2 where the gate has nothing to read."""
    from rich.markup import escape

    from gpulab.report.compare import (
        NOT_COMPARABLE,
        compare_runs,
        config_differences,
        gate_refusal,
        regressions,
        run_summary,
    )
    from gpulab.report.results import ResultsIndex

    old, now = (ResultsIndex(side[0], max_table_bytes=limit) for side in (baseline, new))
    devices = {}
    for target in sorted(set(old.targets) & set(now.targets)):
        sides = run_summary(old, target, baseline[2]), run_summary(now, target, new[2])
        for label, (_, name, _), side in zip(("baseline", "new"), (baseline, new), sides, strict=True):
            console.print(f"{label:<8} {escape(name)}: {target} on {escape(side.device)}, commit {side.commit}, "
                          f"config digest {side.digest}")
        differ = config_differences(*sides)
        console.print(f"{target}: configuration keys that differ: " + (", ".join(
            escape(f"{r['key']} ({r['baseline']} → {r['this run']})") for r in differ.to_dict("records")) or "none"))
        devices[target] = (sides[0].device, sides[1].device)
    deltas = compare_runs(old, now, min_effect, across_devices)
    counts = deltas["verdict"].value_counts().to_dict() if not deltas.empty else {}
    console.print("cells: " + (", ".join(f"{n} {v}" for v, n in counts.items()) or "none measured in both runs"))
    bad = regressions(deltas) if not deltas.empty else deltas
    for row in bad.to_dict("records"):
        change = f"{row['change_pct']:+.1f}%" if row["change_pct"] == row["change_pct"] else ""
        console.print(f"[red]{row['verdict']}[/] {_cell(row)} {change} {escape(str(row.get('note') or ''))}")
    apart = deltas[deltas["verdict"] == NOT_COMPARABLE].to_dict("records") if not deltas.empty else []
    for row in apart[:NOT_COMPARABLE_SHOWN]:
        console.print(f"[yellow]{NOT_COMPARABLE}[/] {_cell(row)} {escape(str(row['note']))}")
    if len(apart) > NOT_COMPARABLE_SHOWN:
        console.print(f"[yellow]{NOT_COMPARABLE}[/]: {len(apart) - NOT_COMPARABLE_SHOWN} more cells")
    refusal = gate_refusal(deltas, devices, across_devices, (old.targets, now.targets))
    if refusal and fail_on == "regression":
        console.print(f"[red]gpulab compare: cannot gate (--fail-on regression): {escape(refusal)}[/]")
        return REFUSED
    if refusal:
        console.print(f"[yellow]gpulab compare: {escape(refusal)}[/]")
    if fail_on == "regression" and not bad.empty:
        console.print(f"[red]gpulab compare: {len(bad)} regression(s) (--fail-on regression)[/]")
        return 1
    return 0


def _history(args: argparse.Namespace, _command: str) -> int:
    from gpulab.core.history import runs, stale
    from gpulab.report.results import target_dirs

    root = Path(args.results or _config(args.config)["results_dir"])
    targets = [t for t in target_dirs(root) if args.target in (None, t.name)]
    if not targets:
        raise SystemExit(f"gpulab: no target {args.target!r} under {root}" if args.target else
                         f"gpulab: {root} holds no results (expected {root}/<target>/<step>/...)")
    out = Console(highlight=False, soft_wrap=True)
    for target in targets:
        kept = runs(target)
        out.print(f"[bold]{target.name}[/]: {len(kept)} run(s) kept under {target / 'history'}")
        out.print("  run (time__commit__config digest)             time (UTC)           steps")
        for run in kept:
            when = run.time.strftime("%Y-%m-%d %H:%M:%S") if run.time else "?"
            out.print(f"  {run.id:<46} {when:<20} {len(run.steps)}: {', '.join(run.steps)}")
        for rel, why in stale(target).items():
            out.print(f"[yellow]stale:[/] {target / rel}: {why}")
    out.print("compare two runs: gpulab compare RESULTS/TARGET@RUN RESULTS/TARGET@RUN (a unique prefix of the run, "
              "or -1 for the latest, -2 the one before)")
    return 0


def _summarise(rendered: Any) -> None:
    console.print(f"report written to [bold]{rendered.path}[/] ({rendered.size_bytes / 2**20:.2f} MB, "
                  f"{len(rendered.sections)} sections)")
    for error in rendered.errors:
        console.print(f"[red]section {error['id']} could not be rendered:[/] {error['message']}")


def _example(args: argparse.Namespace, command: str) -> int:
    from gpulab.report.example import render_example

    try:
        rendered = render_example(Path(args.fixtures), Path(args.output), _config(args.config), command)
    except FileNotFoundError as exc:
        raise SystemExit(f"gpulab example-report: {exc}") from None
    _summarise(rendered)
    return 0


def _check(args: argparse.Namespace, _command: str) -> int:
    from gpulab.report.browser import BrowserUnavailable, check_page

    try:
        check = check_page(args.report, screenshot=args.screenshot, pdf=args.pdf,
                           expected_headings=args.expect or ())
    except (BrowserUnavailable, FileNotFoundError) as exc:
        # One plain line on stderr: rich would wrap it at the terminal's width.
        print(f"gpulab check-report: {exc}", file=sys.stderr)
        return 2
    console.print(f"{check.title}: {len(check.headings)} sections, {len(check.images)} images, "
                  f"{check.height} px tall" + (f", PDF {check.pdf_pages} pages" if check.pdf else ""))
    if check.screenshot:
        console.print(f"screenshot: {check.screenshot}" + (" (cut at the capture limit)" if check.screenshot_truncated
                                                           else ""))
    for warning in check.console_warnings:
        console.print(f"[yellow]console warning:[/] {warning}")
    problems = check.problems()
    for problem in problems:
        console.print(f"[red]problem:[/] {problem}")
    if not problems:
        console.print("[green]ok:[/] no console errors, no network requests, every image decodes, "
                      "every heading present")
    return 1 if problems else 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="gpulab", description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)

    report = sub.add_parser("report", help="render the report from a results directory")
    report.add_argument("results", nargs="?", help="results directory (default: results_dir of the config)")
    report.add_argument("-o", "--output", help="HTML file to write (default: report.output of the config)")
    report.add_argument("--config", help="config file (default: ./config.yaml)")
    report.add_argument("--title", help="page title")
    report.add_argument("--bundle", nargs="?", const="", metavar="ZIP",
                        help="also write one zip archive holding the page and the results files it links to, links "
                             "relative inside it (default: the output's name with .zip)")
    report.set_defaults(run=_report)

    compare = sub.add_parser("compare", help="render the report of NEW with a verdict per cell against BASELINE "
                                             "(95%% bootstrap CI of the ratio of medians and a minimum effect)")
    compare.add_argument("baseline", metavar="RESULTS_A",
                         help="baseline results directory, or a kept run: results/<target>@<run>")
    compare.add_argument("new", metavar="RESULTS_B",
                         help="new results directory, or a kept run: results/<target>@<run>")
    compare.add_argument("-o", "--output", default="reports/compare.html", help="HTML file (default: %(default)s)")
    compare.add_argument("--config", help="config file (default: ./config.yaml)")
    compare.add_argument("--title", help="page title")
    compare.add_argument("--min-effect", type=float, default=3.0, metavar="PCT",
                         help="smallest change of a median, in percent, that is flagged (default: %(default)s); "
                              "calls near the launch floor and latency-bound cases need more (docs/guide/compare.md)")
    compare.add_argument("--fail-on", choices=["regression"],
                         help="exit 1 when a cell is significantly slower or stopped being ok (for CI jobs); exit 2 "
                              "when no cell was judged or the devices differ")
    compare.add_argument("--across-devices", action="store_true",
                         help="judge the cells of a target whose device differs between the runs (otherwise they are "
                              "not comparable)")
    compare.set_defaults(run=_compare)

    history = sub.add_parser("history", help="list the runs kept of each target (time, commit, config digest, steps)")
    history.add_argument("results", nargs="?", help="results directory (default: results_dir of the config)")
    history.add_argument("--target", help="only this target")
    history.add_argument("--config", help="config file (default: ./config.yaml)")
    history.set_defaults(run=_history)

    check = sub.add_parser("check-report", help="open a report in headless Chromium and check it")
    check.add_argument("report", help="HTML report")
    check.add_argument("--screenshot", help="write a full-page PNG screenshot here")
    check.add_argument("--pdf", help="write the printed PDF here")
    check.add_argument("--expect", action="append", metavar="HEADING", help="a section heading that must be present")
    check.set_defaults(run=_check)

    example = sub.add_parser("example-report", help="render the report of the recorded H100 and CPU runs "
                                                    "(tests/fixtures of a checkout): no GPU, no workflow run")
    example.add_argument("-o", "--output", default="reports/example",
                         help="directory for results/ and report.html (default: %(default)s)")
    example.add_argument("--fixtures", default="tests/fixtures", help="recorded runs (default: %(default)s)")
    example.add_argument("--config", help="config file (default: ./config.yaml)")
    example.set_defaults(run=_example)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    command = shlex.join(["gpulab", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.run(args, command)
    except Refused as exc:
        from rich.markup import escape

        console.print(f"[red]gpulab {args.command}: {escape(str(exc))}[/]")
        raise
    except ConfigError as exc:
        console.print(f"[red]{exc}[/]")
        return 2
    except OSError as exc:  # a full disk, a read-only folder: what was there stays, and this one line says why
        from rich.markup import escape

        console.print(f"[red]gpulab {args.command}: {escape(str(exc))}[/]")
        return 1
    except Exception as exc:
        from gpulab.report.render import ReportError

        if isinstance(exc, ReportError):
            console.print(f"[red]gpulab: {exc}[/]")
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
