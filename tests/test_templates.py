"""Rendering version 1 templates: the spec's semantics, and nothing more."""

from __future__ import annotations

import os

import pytest

from refmount.errors import RefsError
from refmount.refs.templates import MAX_OUTPUT, MAX_SOURCE, Templates

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
    def refuse(self: Templates, source: str) -> None:
        raise AssertionError(f"jinja used for {source!r}")

    monkeypatch.setattr(Templates, "_compile", refuse)
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
    with pytest.raises(RefsError) as error:
        SPEC.render(source, what="key 'k'")
    assert "key 'k'" in str(error.value)
    assert "s3cr3t" not in str(error.value)


def test_recursive_templates_are_bounded() -> None:
    t = Templates({"loop": "{{loop()}}x"})
    with pytest.raises(RefsError, match="nest deeper"):
        t.render("{{loop()}}", what="k")


def test_output_is_capped() -> None:
    t = Templates({"big": "x" * MAX_SOURCE})
    copies = MAX_OUTPUT // MAX_SOURCE + 1
    with pytest.raises(RefsError, match="exceeds"):
        t.render("{{big}}" * copies, what="k")
    with pytest.raises(RefsError, match="more than 65536 characters"):
        t.render("{{" + " ~ ".join(["big"] * copies) + "}}", what="k")


MORE_HOSTILE = [
    ("{{ lipsum(n=10**6) }}", "not safely callable"),
    ("{{ cycler(1, 2) }}", "not safely callable"),
    ("{{ joiner() }}", "not safely callable"),
    ("{{ namespace(a=1) }}", "not safely callable"),
    ("{{ range(10) }}", "not safely callable"),
    ("{{ 'a'.center(10**8) }}", "not safely callable"),
    ("{{ 'x'.ljust(10**8) }}", "not safely callable"),
    ("{{ (['a' * 1000] * 9) | join }}", "more than 8192 characters"),
    ("{{ (['a'] * 1000) | join('b' * 1000) }}", "filter input exceeds"),
    ("{{ ['a' * 8000, 'a' * 8000] | string }}", "filter input exceeds"),
    ("{{ 'a' * 5000 + 'a' * 5000 }}", "more than 8192 characters"),
    ("{{ [[1] * 3000] * 3000 }}", "more than 8192 characters"),
    ("{{ (2 ** 200) * (2 ** 200) }}", "more than 256 bits"),
]


@pytest.mark.parametrize(("source", "message"), MORE_HOSTILE)
def test_globals_methods_and_growing_values_are_refused(source: str, message: str) -> None:
    with pytest.raises(RefsError, match=message) as error:
        Templates({}).render(source, what="key 'k'")
    assert str(error.value).startswith("key 'k': ")


def test_template_calls_fanning_out_are_bounded_per_rendering() -> None:
    # each level calls the next ten times: 10**6 calls if nothing stopped it
    levels = {f"t{n}": "{{" + " ~ ".join([f"t{n + 1}()"] * 10) + "}}" for n in range(6)}
    t = Templates({**levels, "t6": "{{ 'x' }}"})
    with pytest.raises(RefsError, match=r"template 't\d': more than 64 template calls"):
        t.render("{{ t0() }}", what="key 'k'")  # counted: 64 calls, not 10**6


def test_the_budgets_are_for_the_whole_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import refmount.refs.templates as module

    monkeypatch.setattr(module, "MAX_RENDERED", 1000)
    t = Templates({"u": "x" * 100})
    for _ in range(10):
        t.render("{{u}}", what="k")  # 100 characters each: 1000 in all
    with pytest.raises(RefsError, match="render more than"):
        t.render("{{u}}", what="key 'last'")
    monkeypatch.setattr(module, "MAX_EVALUATIONS", 5)
    t = Templates({"f": "{{c}}"})
    for n in range(2):
        t.render("{{ f(c=1) }}", {"n": n}, what="k")  # a rendering and a call each
    with pytest.raises(RefsError, match="more than 5 jinja evaluations"):
        t.render("{{ f(c=1) }}", what="k")


def test_no_globals_are_left_but_the_spec_example_works() -> None:
    t = Templates({"u": "s3://b", "f": "{{c}}-{{u}}"})
    assert t.render("{{ f(c='x') }}/{{ (i + 1) * 10 }}", {"i": 2}, what="k") == "x-s3://b/30"
    with pytest.raises(RefsError, match=r"undefined|not safely callable"):
        t.render("{{ dict(a=1) }}", what="k")


def test_the_cpu_budget_is_for_the_whole_set(monkeypatch: pytest.MonkeyPatch) -> None:
    import refmount.refs.templates as module

    monkeypatch.setattr(module, "MAX_SECONDS", 0.05)
    t = Templates({"f": "{{c}}"})
    with pytest.raises(RefsError, match=r"key 'k\d+': .* take more than 0.05 s to render"):
        for n in range(1_000_000):  # each rendering is quick; together they are not
            t.render("{{ f(c=n) ~ n * 2 }}", {"n": n}, what=f"key 'k{n}'")
