"""``man refmount``: written from the parsers, installed with the package, renders cleanly
and names every option of the mount and of its subcommands."""

from __future__ import annotations

import argparse
import os
import subprocess
import tomllib

import pytest

from refmount import manpage
from refmount.cli import check_parser, status_parser
from refmount.options import build_parser
from tests.support.mounting import REPO

PAGE = REPO / "man" / "refmount.1"


def rendered() -> str:
    """The page as ``man -l`` shows it, in plain ASCII and wide enough for no wrapping."""
    env = dict(os.environ, LC_ALL="C", MANWIDTH="200", MAN_KEEP_FORMATTING="")
    done = subprocess.run(
        ["man", "--warnings", "-l", str(PAGE)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def test_the_installed_page_is_the_generated_one() -> None:
    assert PAGE.read_text() == manpage.render(), "python -m refmount.manpage -o man/refmount.1"


def test_the_page_is_installed_with_the_package() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    data_files = project["tool"]["setuptools"]["data-files"]
    assert data_files["share/man/man1"] == ["man/refmount.1"]


def test_man_renders_it_without_warnings() -> None:
    text = rendered()
    for heading in ("NAME", "SYNOPSIS", "OPTIONS", "COMMANDS", "EXIT STATUS", "SEE ALSO"):
        assert f"\n{heading}\n" in text


@pytest.mark.parametrize(
    ("parser", "start", "end"),
    [
        (build_parser, "\nOPTIONS\n", "\nMOUNT OPTIONS\n"),
        (check_parser, "\n   refmount check [OPTIONS] REFS", "\n   refmount status [OPTIONS]"),
        (status_parser, "\n   refmount status [OPTIONS] MOUNTPOINT", "\nENVIRONMENT\n"),
    ],
    ids=["refmount", "check", "status"],
)
def test_every_option_has_its_paragraph(parser, start: str, end: str) -> None:
    text = rendered()
    section = text[text.index(start) : text.index(end)]
    tags = {
        option
        for line in section.splitlines()
        if line.startswith("       -")  # an option's tag, at the paragraph's indent
        for option in tag_options(line)
    }
    assert tags == options(parser())


def tag_options(line: str) -> list[str]:
    """``-f, --foreground`` -> both; ``--json print ...`` (a tag short enough to share its
    line with the text) -> ``--json``: options up to the first not followed by a comma."""
    found = []
    for word in line.split():
        found.append(word.rstrip(","))
        if not word.endswith(","):
            break
    return found
