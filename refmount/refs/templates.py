"""Rendering the jinja strings of version 1 reference sets, safely and within budgets.

A refs file is untrusted input, so rendering uses jinja2's immutable sandbox: no dunder
attributes, no mutation.  On top of the sandbox: no globals at all (``range``,
``lipsum``, ``cycler``, ``joiner``, ``namespace`` and ``dict`` are gone: a reference set
only substitutes names, see fsspec's and kerchunk's ``templateize``), the only callables
are the set's own templates (no ``'a'.center(10**9)``), undefined names are errors, only
expressions are allowed (``{% for %}`` loops could spin for hours), and filters are an
allow-list whose inputs are size-checked before they run.

What one template may cost is bounded by the constants below, and so is what all the
renderings of one reference set may cost together: a budget is per set, not per call,
so templates calling templates cannot multiply it.  Every operation that can build a
large value (``*``, ``+``, a filter, a printed value, a call's arguments) is checked
*before* it runs, so memory stays near the bounds rather than being measured after.

Templates whose value itself contains ``{{`` are *callables*: with ``"f": "{{c}}"``,
``{{f(c='text')}}`` renders ``text`` (the spec's own example).  Other templates are plain
values.  Strings that only use ``{{name}}`` placeholders of plain templates take a fast
path of plain substitution, without jinja.
"""

from __future__ import annotations

import functools
import operator
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg

from refmount.errors import RefsError

#: Characters of a string that is rendered, and of a template's value.
MAX_SOURCE = 8 * 1024
#: Characters one rendering may output.
MAX_OUTPUT = 64 * 1024
#: Characters (or elements) of a value one operation may build: ``*``, ``+``, a filter's
#: input and result, a template call's arguments.
MAX_VALUE = 8 * 1024
#: Characters all the operations of one rendering (its template calls included) may build.
MAX_BUILT = 1 << 20
#: Nested calls of callable templates.
MAX_DEPTH = 8
#: Template calls one rendering may make, nested ones included.
MAX_CALLS = 64
#: Bits an integer result may have (``9**9**9``, ``1 << 10**9``).
MAX_INT_BITS = 256
#: Characters all the renderings of one reference set may output together (keys, URLs,
#: offsets and lengths of ``refs`` and ``gen``; what template calls return counts too).
MAX_RENDERED = 256 << 20
#: Jinja evaluations (renderings that need jinja, and template calls) of one set.
MAX_EVALUATIONS = 10_000_000
#: CPU seconds all jinja evaluations of one set may take together.
MAX_SECONDS = 60.0

_PLACEHOLDER = re.compile(r"{{\s*([A-Za-z_][A-Za-z0-9_]*)\s*}}")
_COMPILED_CACHE = 256  # compiled sources kept per set

_SAFE_FILTERS = (
    "abs", "capitalize", "d", "default", "first", "float", "int", "join", "last", "length",
    "list", "lower", "max", "min", "round", "string", "sum", "title", "trim", "upper",
)  # fmt: skip


def _weight(value: Any, limit: int) -> int:
    """About the length of ``str(value)``, counted no further than just past ``limit``
    (without building it, and without recursion: a value may nest deeply)."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += len(item)
        elif isinstance(item, list | tuple):
            total += 2 + 2 * len(item)
            stack.extend(item[: limit + 1])
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            stack.extend(list(item.items())[: limit + 1])
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() // 3 + 1
        else:
            total += 32
    return total


class _TemplateCall:
    """A callable template as a template sees it: the only thing a template may call.
    No public attributes, so the sandbox shows nothing of it."""

    __slots__ = ("_function",)

    def __init__(self, function: Callable[..., str]) -> None:
        self._function = function

    def __call__(self, **kwargs: Any) -> str:
        return self._function(**kwargs)

    def __repr__(self) -> str:
        return "<template>"


class _Meter:
    """What the renderings of one reference set have cost so far, and of the current
    top-level rendering."""

    def __init__(self) -> None:
        self.rendered = 0
        self.evaluations = 0
        self.seconds = 0.0
        self.built = 0  # of the current top-level rendering
        self.calls = 0  # of the current top-level rendering

    def check(self, value: Any, limit: int = MAX_VALUE) -> Any:
        if _weight(value, limit) > limit:
            raise RefsError(f"template builds a value of more than {limit} characters")
        return value

    def build(self, size: int) -> None:
        if size > MAX_VALUE:
            raise RefsError(f"template builds a value of more than {MAX_VALUE} characters")
        self.built += size
        if self.built > MAX_BUILT:
            raise RefsError(f"template builds more than {MAX_BUILT} characters in one rendering")

    def output(self, size: int) -> None:
        self.rendered += size
        if self.rendered > MAX_RENDERED:
            raise RefsError(
                f"the templates of this reference set render more than {MAX_RENDERED >> 20} "
                "MiB in all"
            )

    def evaluate(self) -> None:
        self.evaluations += 1
        if self.evaluations > MAX_EVALUATIONS:
            raise RefsError(
                f"the templates of this reference set need more than {MAX_EVALUATIONS} "
                "jinja evaluations"
            )
        if self.seconds > MAX_SECONDS:
            raise RefsError(
                f"the templates of this reference set take more than {MAX_SECONDS:g} s to render"
            )


class _Environment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "+", "**", "<<", "%"})

    def __init__(self, meter: _Meter) -> None:
        super().__init__(
            undefined=jinja2.StrictUndefined,
            autoescape=False,
            cache_size=0,
            finalize=functools.partial(meter.check, limit=MAX_OUTPUT),
        )
        self.meter = meter
        self.globals = {}
        self.tests = {}
        self.filters = {name: _bounded(name, self.filters[name], meter) for name in _SAFE_FILTERS}

    def is_safe_callable(self, obj: Any) -> bool:
        return isinstance(obj, _TemplateCall)

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        meter = self.meter
        if operator_ == "%" and isinstance(left, str | bytes):
            raise RefsError("template uses %-formatting, which is not allowed")
        if operator_ == "*":
            for seq, count in ((left, right), (right, left)):
                if isinstance(seq, str | bytes | list | tuple) and isinstance(count, int):
                    if count > 0 and _weight(seq, MAX_VALUE) * count > MAX_VALUE:
                        raise RefsError(
                            f"template builds a value of more than {MAX_VALUE} characters"
                        )
                    meter.build(_weight(seq, MAX_VALUE) * max(count, 0))
        elif operator_ == "+" and isinstance(left, str | bytes | list | tuple):
            meter.build(_weight(left, MAX_VALUE) + _weight(right, MAX_VALUE))
        if isinstance(left, int) and isinstance(right, int):
            _check_int_operation(operator_, left, right)
        return {
            "*": operator.mul,
            "+": operator.add,
            "**": operator.pow,
            "<<": operator.lshift,
            "%": operator.mod,
        }[operator_](left, right)


def _check_int_operation(operator_: str, left: int, right: int) -> None:
    if operator_ == "**":
        bits = right * abs(left).bit_length() if right > 0 and abs(left) > 1 else 0
    elif operator_ == "<<":
        bits = left.bit_length() + right
    elif operator_ == "*":
        bits = left.bit_length() + right.bit_length()
    else:
        return
    if bits > MAX_INT_BITS:
        raise RefsError(f"template computes a number of more than {MAX_INT_BITS} bits")


def _bounded(name: str, filter_: Callable[..., Any], meter: _Meter) -> Callable[..., Any]:
    """``filter_`` with its input checked before it runs and its result counted."""
    passes_argument = _PassArg.from_obj(filter_) is not None

    @functools.wraps(filter_)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        inputs = args[1:] if passes_argument else args
        size = _weight([*inputs, *kwargs.values()], MAX_VALUE)
        if name == "join" and inputs and isinstance(inputs[0], list | tuple):
            separator = inputs[1] if len(inputs) > 1 else kwargs.get("d", "")
            size += _weight(separator, MAX_VALUE) * len(inputs[0])
        if size > MAX_VALUE:
            raise RefsError(f"template filter input exceeds {MAX_VALUE} characters")
        result = filter_(*args, **kwargs)
        meter.build(_weight(result, MAX_VALUE))
        return result

    return bounded


class Templates:
    """The ``templates`` of a version 1 set, ready to render jinja strings with.  One
    instance renders one reference set: its budgets are for all of that set."""

    def __init__(self, templates: Mapping[str, Any]) -> None:
        if not isinstance(templates, Mapping):
            raise RefsError('"templates" must be a JSON object')
        self.plain: dict[str, str] = {}
        self.callables: dict[str, str] = {}
        for name, value in templates.items():
            if not isinstance(value, str):
                raise RefsError(f"template {name!r}: expected a string, got {type(value).__name__}")
            if len(value) > MAX_SOURCE:
                raise RefsError(f"template {name!r}: longer than {MAX_SOURCE} characters")
            (self.callables if "{{" in value else self.plain)[name] = value
        self._meter = _Meter()
        self._env: _Environment | None = None  # made when first needed: most sets never do
        self._depth = 0
        self._context: dict[str, Any] = dict(self.plain)
        for name, source in self.callables.items():
            self._context[name] = self._callable(name, source)

    def _callable(self, name: str, source: str) -> _TemplateCall:
        def call(**kwargs: Any) -> str:
            meter = self._meter
            meter.calls += 1
            if meter.calls > MAX_CALLS:
                raise RefsError(f"template {name!r}: more than {MAX_CALLS} template calls")
            for value in kwargs.values():
                meter.check(value)
            return self._render(source, kwargs, f"template {name!r}")

        return _TemplateCall(call)

    def render(self, source: str, variables: Mapping[str, Any] | None = None, *, what: str) -> str:
        """Render ``source``; ``what`` names the key or field in error messages."""
        if "{{" not in source and "{%" not in source:
            return source
        if len(source) > MAX_SOURCE:
            raise RefsError(f"{what}: a template longer than {MAX_SOURCE} characters")
        fast = self._substitute(source, variables, what)
        if fast is not None:
            return fast
        self._meter.built = self._meter.calls = 0
        return self._render(source, variables or {}, what)

    def _substitute(
        self, source: str, variables: Mapping[str, Any] | None, what: str
    ) -> str | None:
        """Plain substitution when every placeholder is a bare name of a plain value."""
        if "{%" in source or "{#" in source:
            return None
        pieces = _PLACEHOLDER.split(source)
        if "{{" in "".join(pieces[::2]):
            return None  # expressions that are not bare names
        out = []
        size = 0
        for i, piece in enumerate(pieces):
            if i % 2 == 0:
                text = piece
            elif variables is not None and piece in variables:
                text = str(variables[piece])
            elif piece in self.plain:
                text = self.plain[piece]
            else:
                return None  # a callable, or undefined: let jinja produce the error
            size += len(text)
            if size > MAX_OUTPUT:
                raise RefsError(f"{what}: rendered text exceeds {MAX_OUTPUT} characters")
            out.append(text)
        self._output(size, what)
        return "".join(out)

    def _output(self, size: int, what: str) -> None:
        try:
            self._meter.output(size)
        except RefsError as exc:
            raise RefsError(f"{what}: {exc}") from None

    def _compile(self, source: str) -> jinja2.Template:
        if self._env is None:
            self._env = _Environment(self._meter)
            self._compiled = functools.lru_cache(maxsize=_COMPILED_CACHE)(self._env.from_string)
        return self._compiled(source)

    def _render(self, source: str, variables: Mapping[str, Any], what: str) -> str:
        if "{%" in source:
            raise RefsError(f"{what}: template statements ({{% ... %}}) are not allowed")
        if self._depth >= MAX_DEPTH:
            raise RefsError(f"{what}: templates nest deeper than {MAX_DEPTH} calls")
        meter = self._meter
        self._depth += 1
        started = time.thread_time() if self._depth == 1 else 0.0
        try:
            meter.evaluate()
            result = self._compile(source).render({**self._context, **variables})
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
            if not self._depth:
                meter.seconds += time.thread_time() - started
        if len(result) > MAX_OUTPUT:
            raise RefsError(f"{what}: rendered text exceeds {MAX_OUTPUT} characters")
        self._output(len(result), what)
        return result
