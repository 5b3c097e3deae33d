"""Build-time hook: the command-line reference, from the CLI's own parser.

Fills ``<!-- generated: cli -->`` in ``reference/cli.md`` by walking ``build_parser()`` of
the module named below: every command and subcommand, with its usage, each argument's
flags, value, default and help.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

from _tables import code, fill, table

MODULE = "semhealth.agent.cli"
PAGE = "reference/cli.md"
MARKER = "<!-- generated: cli -->"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return parser._get_formatter()._expand_help(action)


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return " \\| ".join(code(choice) for choice in action.choices)
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return code(metavar)


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return ""
    if isinstance(action.default, list) and not action.default:
        return ""
    return code(action.default)


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _command(parser: argparse.ArgumentParser, words: list[str], summary: str, depth: int) -> str:
    title = " ".join(words)
    out = [f"{'#' * depth} `{title}`", ""]
    text = parser.description or summary
    if text:
        out += [text, ""]
    usage = " ".join(parser.format_usage().split())
    out += ["```text", usage, "```", ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = ", ".join(code(flag) for flag in action.option_strings) or code(
            action.metavar or action.dest
        )
        rows.append((name, _value(action), _default(action), _help(parser, action)))
    if rows:
        out.append(table(("argument", "value", "default", "meaning"), rows))
    sub = _subparsers(parser)
    if sub is not None:
        helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
        for name, child in sub.choices.items():
            out.append(_command(child, [*words, name], helps.get(name, ""), depth + 1))
    return "\n".join(out)


def render() -> str:
    parser: argparse.ArgumentParser = importlib.import_module(MODULE).build_parser()
    sub = _subparsers(parser)
    assert sub is not None, "the CLI has no commands"
    helps = {choice.dest: choice.help or "" for choice in sub._choices_actions}
    index = table(
        ("command", "what it does"),
        [(f"[`semhealth {name}`](#semhealth-{name})", helps.get(name, "")) for name in sub.choices],
    )
    sections = [
        _command(child, [parser.prog, name], helps.get(name, ""), 2)
        for name, child in sub.choices.items()
    ]
    return "\n".join([index, *sections])


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    return fill(markdown, MARKER, render(), PAGE)
