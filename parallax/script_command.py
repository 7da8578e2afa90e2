"""What the commands that run a user's script (`python -m parallax.verify`, `python -m
parallax.plan`) share: their options may come anywhere; the first other word is the script,
the rest (and everything after `--`) its arguments."""
from __future__ import annotations

import argparse
import os
from typing import List, Sequence, Tuple


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]
          ) -> Tuple[argparse.Namespace, str, List[str]]:
    """The command's options, the script, and the script's arguments."""
    argv = list(argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    options, others = parser.parse_known_args(argv)
    if not others:
        parser.error("no SCRIPT given")
    if others[0].startswith("-"):
        parser.error(f"unknown option {others[0]} before SCRIPT")
    if not os.path.isfile(others[0]):
        parser.error(f"SCRIPT {others[0]!r} is not a file")
    return options, others[0], others[1:] + rest


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value
