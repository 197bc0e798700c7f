"""Dynamo's frontend flags, read from a captured ``python -m dynamo.frontend --help``.

The capture (tests/golden/dynamo/frontend-help-<version>.txt) is the reference ``meshfront frontend`` is held
to: docs/dynamo-flags.md is generated from it (services/frontend/flag_table.py) and a test fails when a flag in
it is neither honoured nor refused, so a new Dynamo flag shows up as a failing test, not as a surprise.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DYNAMO_VERSION = "1.6.1"
HELP_CAPTURE = ROOT / "tests" / "golden" / "dynamo" / f"frontend-help-{DYNAMO_VERSION}.txt"

# An option entry's first line: two spaces, then its option strings (each maybe with a metavar).
_OPTION = r"-[-\w]*(?: (?:[A-Z_\d]+|JSON|\{[^}]*\}))?"
_ENTRY = re.compile(rf"^  ({_OPTION}(?:, {_OPTION})*)(?:\s{{2,}}(.*))?$")
_ENV = re.compile(r"env var: (\w+)(?: \| default: (.*?))?(?: deprecating flag: .*)?$")
_AIS_ENV = re.compile(r"\b(DYN_AIS_\w+)\b")
_NOT_FLAGS = {"-h", "--help", "--version"}


@dataclasses.dataclass(frozen=True)
class DynamoFlag:
    """One option entry of Dynamo's help: its first long spelling, every other spelling, env twin, default."""

    flag: str
    spellings: tuple[str, ...]  # every option string, ``--no-`` forms and deprecated aliases included
    env: str  # "" when the help names none
    default: str  # as the help prints it ("" when it prints none)
    help: str

    @property
    def takes_value(self) -> bool:
        return not any(s.startswith("--no-") for s in self.spellings)

    @property
    def aliases(self) -> tuple[str, ...]:
        """The spellings other than the flag itself and ``--no-`` forms."""
        return tuple(s for s in self.spellings if s != self.flag and not s.startswith("--no-"))


def parse_help(text: str) -> list[DynamoFlag]:
    """Every option entry of a ``--help`` text, in its order (``-h``, ``--help`` and ``--version`` left out)."""
    entries: list[tuple[list[str], list[str]]] = []
    for line in text.splitlines():
        match = _ENTRY.match(line)
        if match:
            spellings = [s.split(" ")[0] for s in match.group(1).split(", ")]
            entries.append((spellings, [match.group(2) or ""]))
        elif entries and line.startswith("      "):
            entries[-1][1].append(line.strip())
        elif line.strip() and not line.startswith(" "):  # a group heading or the usage: no entry goes on
            entries.append(([], []))
    flags = []
    for spellings, lines in entries:
        longs = [s for s in spellings if s.startswith("--")]
        if not longs or set(spellings) <= _NOT_FLAGS:
            continue
        text_ = " ".join(x for x in lines if x)
        env, default = "", ""
        found = next(filter(None, (_ENV.search(x) for x in lines)), None)
        if found:
            env, default = found.group(1), (found.group(2) or "").strip()
        elif ais := _AIS_ENV.search(text_):
            env = ais.group(1)
        flags.append(DynamoFlag(longs[0], tuple(dict.fromkeys(spellings)), env, default,
                                text_.split(" env var: ")[0].strip()))
    return flags


def dynamo_flags(path: Path = HELP_CAPTURE) -> list[DynamoFlag]:
    return parse_help(path.read_text())
