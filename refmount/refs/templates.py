"""Rendering the jinja strings of version 1 reference sets, safely.

A refs file is untrusted input, so rendering uses jinja2's immutable sandbox: no dunder
attributes, no globals, no mutation.  On top of the sandbox, undefined names are errors,
only expressions are allowed (``{% for %}`` loops could spin for hours), filters are an
allow-list of those whose output stays near the size of their input, arithmetic that
would build huge values (``'a' * 10**9``, ``9**9**9``) is refused, the output of one
rendering is capped, and template recursion is bounded.

Templates whose value itself contains ``{{`` are *callables*: with ``"f": "{{c}}"``,
``{{f(c='text')}}`` renders ``text`` (the spec's own example).  Other templates are plain
values.  Strings that only use ``{{name}}`` placeholders of plain templates take a fast
path of plain substitution, without jinja.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from refmount.errors import RefsError

MAX_OUTPUT = 64 * 1024  # characters in one rendered string
MAX_DEPTH = 16  # nested calls of callable templates
MAX_SEQUENCE = 1 << 20  # elements or characters a * may build
MAX_EXPONENT_BITS = 256  # bits a ** result may have

_PLACEHOLDER = re.compile(r"{{\s*([A-Za-z_][A-Za-z0-9_]*)\s*}}")


_SAFE_FILTERS = (
    "abs", "capitalize", "d", "default", "first", "float", "int", "join", "last", "length",
    "list", "lower", "max", "min", "round", "string", "sum", "title", "trim", "upper",
)  # fmt: skip


class _Environment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "<<", "%"})

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        if operator_ == "*":
            for seq, count in ((left, right), (right, left)):
                sized = isinstance(seq, str | bytes | list | tuple) and isinstance(count, int)
                if sized and len(seq) * max(count, 0) > MAX_SEQUENCE:
                    raise RefsError("template builds a value that is too large")
            return left * right
        if operator_ == "**":
            ints = isinstance(left, int) and isinstance(right, int) and right > 0
            if ints and abs(left) > 1 and right * abs(left).bit_length() > MAX_EXPONENT_BITS:
                raise RefsError("template computes a number that is too large")
            return left**right
        if operator_ == "%":
            if isinstance(left, str | bytes):
                raise RefsError("template uses %-formatting, which is not allowed")
            return left % right
        if operator_ == "<<":
            if isinstance(right, int) and right > MAX_EXPONENT_BITS:
                raise RefsError("template computes a number that is too large")
            return operator.lshift(left, right)
        return super().call_binop(context, operator_, left, right)


_ENV = _Environment(undefined=jinja2.StrictUndefined, autoescape=False, cache_size=0)
_ENV.filters = {name: _ENV.filters[name] for name in _SAFE_FILTERS}
_ENV.tests = {}


@lru_cache(maxsize=4096)
def _compile(source: str) -> jinja2.Template:
    return _ENV.from_string(source)


class Templates:
    """The ``templates`` of a version 1 set, ready to render jinja strings with."""

    def __init__(self, templates: Mapping[str, Any]) -> None:
        if not isinstance(templates, Mapping):
            raise RefsError('"templates" must be a JSON object')
        self.plain: dict[str, str] = {}
        self.callables: dict[str, str] = {}
        for name, value in templates.items():
            if not isinstance(value, str):
                raise RefsError(f"template {name!r}: expected a string, got {type(value).__name__}")
            (self.callables if "{{" in value else self.plain)[name] = value
        self._depth = 0
        self._context: dict[str, Any] = dict(self.plain)
        for name, source in self.callables.items():
            self._context[name] = self._callable(name, source)

    def _callable(self, name: str, source: str) -> Callable[..., str]:
        # A closure, not an object: the sandbox lets templates read public attributes of
        # objects, and a closure exposes none.
        def call(**kwargs: Any) -> str:
            return self._render(source, kwargs, f"template {name!r}")

        return call

    def render(self, source: str, variables: Mapping[str, Any] | None = None, *, what: str) -> str:
        """Render ``source``; ``what`` names the key or field in error messages."""
        if "{{" not in source and "{%" not in source:
            return source
        fast = self._substitute(source, variables)
        if fast is not None:
            return fast
        return self._render(source, variables or {}, what)

    def _substitute(self, source: str, variables: Mapping[str, Any] | None) -> str | None:
        """Plain substitution when every placeholder is a bare name of a plain value."""
        if "{%" in source or "{#" in source:
            return None
        pieces = _PLACEHOLDER.split(source)
        if "{{" in "".join(pieces[::2]):
            return None  # expressions that are not bare names
        out = []
        for i, piece in enumerate(pieces):
            if i % 2 == 0:
                out.append(piece)
                continue
            if variables is not None and piece in variables:
                value = variables[piece]
            elif piece in self.plain:
                value = self.plain[piece]
            else:
                return None  # a callable, or undefined: let jinja produce the error
            out.append(str(value))
        result = "".join(out)
        if len(result) > MAX_OUTPUT:
            raise RefsError(f"{_subject(source)}: rendered text exceeds {MAX_OUTPUT} characters")
        return result

    def _render(self, source: str, variables: Mapping[str, Any], what: str) -> str:
        if "{%" in source:
            raise RefsError(f"{what}: template statements ({{% ... %}}) are not allowed")
        if self._depth >= MAX_DEPTH:
            raise RefsError(f"{what}: templates nest deeper than {MAX_DEPTH} calls")
        self._depth += 1
        try:
            result = _compile(source).render({**self._context, **variables})
        except RefsError as exc:
            raise RefsError(f"{what}: {exc}") from None
        except jinja2.UndefinedError as exc:
            raise RefsError(f"{what}: undefined name in template {source!r}: {exc}") from None
        except jinja2.TemplateSyntaxError as exc:
            raise RefsError(f"{what}: template syntax error in {source!r}: {exc}") from None
        except jinja2.exceptions.SecurityError as exc:
            raise RefsError(f"{what}: template refused by the sandbox: {exc}") from None
        except (RecursionError, MemoryError, OverflowError) as exc:
            raise RefsError(f"{what}: template too costly ({type(exc).__name__})") from None
        except Exception as exc:
            raise RefsError(f"{what}: template failed: {type(exc).__name__}: {exc}") from None
        finally:
            self._depth -= 1
        if len(result) > MAX_OUTPUT:
            raise RefsError(f"{what}: rendered text exceeds {MAX_OUTPUT} characters")
        return result


def _subject(source: str) -> str:
    return f"template {source[:80]!r}"
