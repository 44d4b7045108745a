"""README.md and docs/ against the code: every option documented and every documented
option real, every error message listed, every link between the pages leading somewhere."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from refmount.cli import check_parser, status_parser
from refmount.options import build_parser
from tests.support import messages
from tests.support.mounting import REPO

DOCS = REPO / "docs"
CONFIGURATION = DOCS / "configuration.md"
#: configuration.md's sections: the mount's options, then each subcommand's.
SECTIONS = {
    "refmount": (build_parser, None),
    "refmount check": (check_parser, "## `refmount check"),
    "refmount status": (status_parser, "## `refmount status"),
}
_OPTION = re.compile(r"`(--?[A-Za-z][\w-]*)")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def parser_options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def documented_options(text: str) -> set[str]:
    """Options named in the first column of the tables of ``text``."""
    found = set()
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| option |"):
            found |= set(_OPTION.findall(line.split(" | ")[0]))
    return found


def configuration_sections() -> dict[str, str]:
    text = CONFIGURATION.read_text()
    check = text.index(SECTIONS["refmount check"][1])
    status = text.index(SECTIONS["refmount status"][1])
    return {
        "refmount": text[:check],
        "refmount check": text[check:status],
        "refmount status": text[status:],
    }


@pytest.mark.parametrize("command", SECTIONS)
def test_every_option_is_documented_and_every_documented_option_exists(command: str) -> None:
    in_code = parser_options(SECTIONS[command][0]())
    in_docs = documented_options(configuration_sections()[command])
    assert in_code - in_docs == set(), f"{command}: not in docs/configuration.md"
    assert in_docs - in_code == set(), f"{command}: documented, but not an option"


def test_the_readme_is_a_front_page_with_its_two_commands_first() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first_block = text.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    assert [line.split()[:2] for line in first_block] == [
        ["bash", "examples/quickstart.sh"],
        ["bash", ".ci/test"],
    ]


def test_documented_options_are_read_from_the_tables() -> None:
    table = "| `--a N`, `-b` | x `--not-this` |\n| option | `--nor-this` |\n"
    assert documented_options(table) == {"--a", "-b"}


def test_every_message_of_the_code_is_listed() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    expected = messages.render(messages.all_messages())
    listed = messages.listed(page)
    missing = set(expected.splitlines()) - set(listed.splitlines())
    stale = set(listed.splitlines()) - set(expected.splitlines())
    assert not missing and not stale, (
        f"docs/troubleshooting.md: not listed {sorted(missing)}, no longer in the code "
        f"{sorted(stale)}; python -m tests.support.messages --write"
    )
    assert listed == expected


def test_the_common_messages_are_messages_of_the_code() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    common = page.split("## Common messages", 1)[1].split("\n## ", 1)[0]
    quoted = [
        line.split(" | ")[0].removeprefix("| ").strip("`")
        for line in common.splitlines()
        if line.startswith("| `")
    ]
    assert len(quoted) >= 10
    assert set(quoted) - {m.text for m in messages.all_messages()} == set()


def test_messages_are_read_with_their_values_named(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "log.warning('key %s: %d bytes', key, self.size)\n"
        "raise RefsError(f'{path}: not JSON ({exc})')\n"
        "raise RefsError(message)\n"
        "raise FetchError(f'{url}')\n"
        "HINT = 'pip install it'\n"
        "def load(x):\n"
        "    message = f'{x} needs it: {HINT}'\n"
        "    raise RefsError(message)\n"
        "class CertificateError(Exception):\n"
        "    def __init__(self, host):\n"
        "        super().__init__(f'{host}: TLS failed')\n"
    )
    found = {m.text for m in messages.messages_in(source, section="refs")}
    assert found == {
        "key <key>: <size> bytes",
        "<path>: not JSON (<exc>)",
        "<x> needs it: pip install it",
        "<host>: TLS failed",
    }


def anchors(page: Path) -> set[str]:
    text = page.read_text()
    found = set(re.findall(r'<a id="([^"]+)">', text))
    for heading in re.findall(r"^#+ (.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", [REPO / "README.md", *sorted(DOCS.glob("*.md"))], ids=str)
def test_links_lead_somewhere(page: Path) -> None:
    broken = []
    for link in _LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        known = not anchor or target.suffix != ".md" or anchor in anchors(target)
        if not target.exists() or not known:
            broken.append(link)
    assert broken == [], f"{page.name}: broken links"
