"""The option machinery both commands share: one `Option` per setting (flag, environment variable,
parser, default, help), its argparse registration, and the rule flag > environment > default.

The tables themselves live with the settings they make: `vgpud run`'s in vgpud.config, `vgpud
webhook`'s in vgpud.webhook.config. A value that does not parse is a `ConfigError` naming where it
came from (the flag, the variable, or the default); the CLI prints it as one line and exits 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A setting or combination of settings that vgpud refuses to start with."""


@dataclass(frozen=True)
class Option:
    """One setting: its flag, its environment variable (or none), its parser and default."""

    dest: str
    flag: str
    env: str | None
    parse: Callable[[str], Any]
    default: str | None
    help: str
    metavar: str | None = None
    #: a path default that --root-prefix moves under the prefix
    rebased: bool = False
    #: a flag that takes no value (present = true); its environment variable takes true/false
    switch: bool = False
    #: what the help says when `default` is None (what happens without the setting)
    unset: str = ""

    def help_text(self) -> str:
        """The help line: what it does, its default, its environment variable."""
        if self.default not in (None, ""):
            default = f" (default: {self.default})"
        elif self.unset:
            default = f" (default: {self.unset})"
        else:
            default = ""
        env = f" [env {self.env}]" if self.env else ""
        return f"{self.help}{default}{env}"


def add_arguments(parser: argparse.ArgumentParser, options: Iterable[Option]) -> None:
    """Register the options; values stay raw strings (None: not given) until `resolve`."""
    for option in options:
        if option.switch:
            parser.add_argument(
                option.flag, dest=option.dest, action="store_const", const="true", help=option.help_text()
            )
        else:
            parser.add_argument(
                option.flag, dest=option.dest, default=None, metavar=option.metavar, help=option.help_text()
            )


def resolve(option: Option, args: argparse.Namespace, environ: Mapping[str, str], prefix: Path | None) -> Any:
    """The parsed value: flag > environment (an empty variable counts as unset) > default."""
    raw = getattr(args, option.dest, None)
    source = option.flag
    if raw is None and option.env and environ.get(option.env, "") != "":
        raw, source = environ[option.env], f"{option.env} (environment)"
    if raw is None:
        if option.default is None:
            return None
        raw, source = option.default, f"{option.flag} default"
        if option.rebased and prefix is not None:
            raw = str(prefix) + raw
    try:
        return option.parse(raw)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None
