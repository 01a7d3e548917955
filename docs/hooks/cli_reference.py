"""MkDocs hook: the command-line reference from the argument parsers themselves, and a check of
every option the pages name.

- ``<!-- cli-reference: etkit-export -->`` (or ``etkit``) in a page becomes the command's usage
  and a table of its options (each subcommand's for ``etkit``), from its ``argparse`` parser,
  and ``<!-- config-keys -->`` the table of ``--config`` keys: the reference cannot drift from
  the code.
- In every page, an option named on a command line (``etkit-export ... --verify``,
  ``etkit run ... --input``, in a code block or a code span) must be one of that command's
  options, and a code span holding only an option (`` `--sizes` ``) one of etkit's options or
  of ``FOREIGN_OPTIONS`` (other tools' options the pages name); otherwise a warning, which
  ``mkdocs build --strict`` turns into a failure.
- A dotted etkit name in a code span (`` `etkit_quant.graph.tensor_value` ``) must name a
  module, class, function or attribute of the sources: a moved or renamed one is a warning too.
"""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.plugins.etkit_cli")

MARKER = re.compile(r"<!-- cli-reference: ([\w-]+) -->")
CONFIG_MARKER = "<!-- config-keys -->"
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*")
# Options of other tools that the pages name on their own in a code span.
FOREIGN_OPTIONS = frozenset(
    {
        "--scenario",  # scenario_runner's
        "--package",  # scripts/check.sh's
        "--no-run",  # scripts/setup.sh's
        "--find-links",  # pip's
        "--extra-index-url",
        "--release",  # scripts/api_check.py's
        "--strict",  # mkdocs build's
        "--change",  # duplicates'
        "--no-deps",  # pip's
        "--extensions",  # model-explorer's
        "--timeout",  # bench/fuzz.py's
        "--models",  # the benches'
        "--checkpoint-every",  # apps/exporter/examples/qat_torchrun.py's
        "--resume",
    }
)

DOTTED = re.compile(r"`(etkit_[a-z]+(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")
SOURCES = (
    "libs/quant/src",
    "libs/partition/src",
    "libs/layout/src",
    "libs/gridsampler/src",
    "libs/pterunner/src",
    "apps/exporter/src",
)

_PARSERS: dict[str, argparse.ArgumentParser] = {}
_MODULES: dict[str, Any] = {}


def parsers() -> dict[str, argparse.ArgumentParser]:
    """The parsers by command: ``etkit-export``, ``etkit``, ``etkit run``, ..."""
    if not _PARSERS:
        from etkit_exporter.cli import export, main

        _PARSERS["etkit-export"] = export._parser()
        top = main._parser()
        _PARSERS["etkit"] = top
        for name, sub in subcommands(top).items():
            _PARSERS[f"etkit {name}"] = sub
    return _PARSERS


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = parser._get_formatter()._expand_help(action) if action.help else ""
    if not text and action.default not in (None, False, [], argparse.SUPPRESS):
        text = f"default {action.default}"
    return text.replace("|", "\\|").replace("\n", " ")


def _table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | meaning |", "|---|---|"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            metavar = action.metavar or (action.dest.upper() if action.nargs != 0 else None)
            if action.choices and not action.metavar:
                metavar = "{" + ",".join(map(str, action.choices)) + "}"
            names = ", ".join(
                f"`{s} {metavar}`" if metavar and action.nargs != 0 else f"`{s}`"
                for s in action.option_strings
            )
        else:
            names = f"`{action.metavar or action.dest}`"
        rows.append(f"| {names} | {_help(parser, action)} |")
    return rows


def reference(command: str) -> str:
    """The Markdown reference of ``command`` (``etkit-export`` or ``etkit``)."""
    found = parsers()
    if command not in found:
        raise ValueError(f"no command {command!r}: one of {sorted(found)}")
    parser = found[command]
    lines = ["```text", parser.format_usage().strip(), "```", "", parser.description or "", ""]
    lines += _table(parser)
    for name, sub in subcommands(parser).items():
        lines += ["", f"### `{command} {name}`", "", "```text", sub.format_usage().strip()]
        lines += ["```", "", sub.description or "", "", *_table(sub)]
    if parser.epilog:
        lines += ["", "```text", parser.epilog.strip(), "```"]
    return "\n".join(lines)


def config_keys() -> str:
    """The ``--config`` keys (``etkit_exporter.cli.config.OPTIONS``) as a table, each with the
    help of the ``etkit-export`` option of that name."""
    from etkit_exporter.cli.config import OPTIONS

    parser = parsers()["etkit-export"]
    helps = {a.dest: _help(parser, a) for a in parser._actions}
    kinds = {"str": "a string", "list": "a list of strings", "bool": "true or false"}
    rows = ["| key | value | meaning |", "|---|---|---|"]
    for key, kind in OPTIONS.items():
        name = key.replace("_", "-")
        rows.append(f"| `{name}` | {kinds.get(kind, kind)} | {helps.get(key, '')} |")
    return "\n".join(rows)


def unknown_options(markdown: str) -> list[str]:
    """The options ``markdown`` names that their command does not have, one line each."""
    found = parsers()
    known = set().union(*(options(p) for p in found.values())) | FOREIGN_OPTIONS
    problems = []
    blocks = re.findall(r"```[^\n]*\n(.*?)```", markdown, re.S)
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", markdown, flags=re.S))
    block_lines = {line for block in blocks for line in block.splitlines()}
    for line in [*block_lines, *spans]:
        line = line.split("#", 1)[0] if line.lstrip().startswith(("etkit", "$")) else line
        command = re.search(r"(?:^|[\s$;(])(etkit-export|etkit (?:\w[\w-]*))\b", line)
        if command is not None:
            name = command.group(1)
            parser = found.get(name) or found["etkit"]
            allowed = options(parser) | options(found["etkit"])
            rest = line[command.end() :]
            rest = re.split(r"\s(?:&&|\||;)\s|\bsh\b|\bscenario_runner\b", rest)[0]
            problems += [f"{name}: no option {o}" for o in OPTION.findall(rest) if o not in allowed]
        elif line not in block_lines and re.fullmatch(r"--[a-z][a-z0-9_-]*(?:[ =].*)?", line):
            option = OPTION.match(line.strip())
            if option is not None and option.group(0) not in known:
                problems.append(f"no etkit option {option.group(0)}")
    return problems


def missing_names(markdown: str, root: str = ".") -> list[str]:
    """The dotted etkit names in ``markdown``'s code spans (`` `etkit_quant.graph.tensor_value` ``)
    that name no module, class, function or attribute of the sources (griffe, no imports)."""
    import griffe

    if not _MODULES:
        loader = griffe.GriffeLoader(search_paths=[f"{root}/{s}" for s in SOURCES])
        for source in SOURCES:
            for package in sorted(p.parent.name for p in Path(root, source).glob("*/__init__.py")):
                _MODULES[package] = loader.load(package)
    problems = []
    for path in sorted(set(DOTTED.findall(markdown))):
        package, *parts = path.split(".")
        if package not in _MODULES:  # a file name such as etkit_scenario.json
            continue
        obj = _MODULES[package]
        for part in parts:
            try:
                obj = obj[part] if obj is not None else None
            except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                obj = None
        if obj is None:
            problems.append(f"no {path} in the sources")
    return problems


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    markdown = MARKER.sub(lambda m: reference(m.group(1)), markdown)
    if CONFIG_MARKER in markdown:
        markdown = markdown.replace(CONFIG_MARKER, config_keys())
    for problem in [*unknown_options(markdown), *missing_names(markdown)]:
        log.warning("%s: %s", page.file.src_path, problem)
    return markdown
