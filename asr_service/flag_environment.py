"""Command-line flags that can also be set by environment variables, as deployments expect.

``--max-batch-size 8`` can also be given as ``ASR_MAX_BATCH_SIZE=8``: the variable's name is the
flag's, upper-cased, with ``ASR_`` before it and ``_`` for ``-``. A flag given on the command line
wins over its variable. A variable's text is read as the flag's value would be (a list flag takes
its values separated by spaces or commas, a repeatable flag its values separated by spaces; a
switch takes 1/true/yes/on or 0/false/no/off), and a value the flag would refuse is refused
naming the variable.

Why not each flag's ``default=os.environ.get(...)``: argparse converts a string default with the
flag's type but never checks it against ``choices``, and its errors would name the flag, not the
variable that was wrong.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PREFIX = "ASR_"
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


class EnvironmentFlagError(ValueError):
    pass


@dataclass(frozen=True)
class EnvironmentFlag:
    flag: str  # "--max-batch-size"
    variable: str  # "ASR_MAX_BATCH_SIZE"
    action: argparse.Action
    repeatable: bool = False  # action="append": --model A --model B, one word pair per value


def variable_for(flag: str) -> str:
    return PREFIX + flag.lstrip("-").replace("-", "_").upper()


class EnvironmentFlags:
    """Adds flags to a parser, each with its variable named in its help, and turns the variables
    that are set into command-line words."""

    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser
        self.flags: list[EnvironmentFlag] = []

    def add(self, flag: str, **kwargs) -> argparse.Action:
        variable = variable_for(flag)
        kwargs["help"] = f"{kwargs.get('help') or ''} [env {variable}]".lstrip()
        action = self.parser.add_argument(flag, **kwargs)
        self.flags.append(EnvironmentFlag(flag, variable, action, repeatable=kwargs.get("action") == "append"))
        return action

    def words(self, environ: Mapping[str, str], argv: Sequence[str]) -> list[str]:
        """The command-line words for the variables set in ``environ`` whose flags ``argv`` does
        not give; raises EnvironmentFlagError for a value the flag would refuse."""
        given = {word.split("=", 1)[0] for word in argv if word.startswith("--")}
        words: list[str] = []
        for f in self.flags:
            text = environ.get(f.variable)
            if text is None or f.flag in given or _negated(f.flag) in given:
                continue
            words += _words_for(f, text.strip())
        return words


def _negated(flag: str) -> str:
    return "--no-" + flag[2:]


def _words_for(f: EnvironmentFlag, text: str) -> list[str]:
    action = f.action
    if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):  # a switch
        if text.lower() in TRUE_WORDS:
            return [f.flag]
        if text.lower() in FALSE_WORDS:
            if isinstance(action, argparse.BooleanOptionalAction):
                return [_negated(f.flag)]
            return []
        raise EnvironmentFlagError(f"{f.variable}={text!r}: use one of {', '.join(TRUE_WORDS + FALSE_WORDS)}")
    repeatable = f.repeatable
    if action.nargs in ("+", "*"):
        values = text.replace(",", " ").split()
    else:  # a repeatable flag's values are separated by spaces only (a value may hold commas)
        values = text.split() if repeatable else [text]
    if not text or not values:
        raise EnvironmentFlagError(f"{f.variable} is set but empty; unset it or give {f.flag}'s value")
    for value in values:
        try:
            parsed = action.type(value) if action.type else value
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            raise EnvironmentFlagError(f"{f.variable}={value!r} is not a valid {f.flag} value: {e}") from None
        if action.choices is not None and parsed not in action.choices:
            choices = ", ".join(map(str, action.choices))
            raise EnvironmentFlagError(f"{f.variable}={value!r}: {f.flag} takes one of {choices}")
    return [word for value in values for word in (f.flag, value)] if repeatable else [f.flag, *values]
