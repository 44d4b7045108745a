"""Rendering version 1 templates: the spec's semantics, and nothing more."""

from __future__ import annotations

import os
import time

import pytest

from refmount.errors import RefsError
from refmount.refs.templates import MAX_OUTPUT, Templates

SPEC = Templates({"u": "server.domain/path", "f": "{{c}}"})


def test_plain_placeholders_and_callable_templates() -> None:
    assert SPEC.render("http://{{u}}", what="k") == "http://server.domain/path"
    assert SPEC.render("http://{{ u }}_{{i}}", {"i": 3}, what="k") == "http://server.domain/path_3"
    assert SPEC.render("http://{{f(c='text')}}", what="k") == "http://text"
    assert SPEC.render("{{(i + 1) * 1000}}", {"i": 4}, what="k") == "5000"
    assert SPEC.render("no placeholders", what="k") == "no placeholders"


def test_callable_templates_may_use_other_templates() -> None:
    t = Templates({"host": "h.example", "path": "{{proto}}://{{host}}/{{name}}"})
    assert t.render("{{path(proto='s3', name='x')}}", what="k") == "s3://h.example/x"


def test_the_fast_path_does_not_use_jinja(monkeypatch: pytest.MonkeyPatch) -> None:
    import refmount.refs.templates as module

    def refuse(source: str) -> None:
        raise AssertionError(f"jinja used for {source!r}")

    monkeypatch.setattr(module, "_compile", refuse)
    assert SPEC.render("s3://{{u}}/{{ i }}", {"i": 7}, what="k") == "s3://server.domain/path/7"


HOSTILE = [
    "{{ f.__globals__ }}",
    "{{ f.__closure__ }}",
    "{{ ''.__class__.__mro__ }}",
    "{{ u.__class__ }}",
    "{{ cycler.__init__.__globals__.os.environ }}",
    "{{ lipsum.__globals__ }}",
    "{{ self.__init__ }}",
    "{{ config }}",
    "{{ request }}",
    "{% for x in range(99999) %}{% for y in range(99999) %}{% endfor %}{% endfor %}",
    "{{ 'a' * 10**9 }}",
    "{{ [1] * 10**9 }}",
    "{{ 9**9**9 }}",
    "{{ 1 << 10**9 }}",
    "{{ '%999999999d' % 1 }}",
    "{{ 'a'|center(10**9) }}",
    "{{ 'a'|indent(10**9) }}",
    "{{ range(10**9)|list }}",
    "{{ undefined_name }}",
    "{{ u.upper.__self__ }}",
    "{{ f.__call__ }}",
    "{{ 1 is odd }}",
]


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_templates_are_refused_quickly(source: str) -> None:
    os.environ["REFMOUNT_TEST_SECRET"] = "s3cr3t"
    started = time.monotonic()
    with pytest.raises(RefsError) as error:
        SPEC.render(source, what="key 'k'")
    assert time.monotonic() - started < 2
    assert "key 'k'" in str(error.value)
    assert "s3cr3t" not in str(error.value)


def test_recursive_templates_are_bounded() -> None:
    t = Templates({"loop": "{{loop()}}x"})
    with pytest.raises(RefsError, match="nest deeper"):
        t.render("{{loop()}}", what="k")


def test_output_is_capped() -> None:
    t = Templates({"big": "x" * (MAX_OUTPUT // 2 + 1)})
    with pytest.raises(RefsError, match="exceeds"):
        t.render("{{big}}{{big}}", what="k")
    with pytest.raises(RefsError, match="exceeds"):
        t.render("{{big ~ big}}", what="k")
