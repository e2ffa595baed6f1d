"""Chat templates ship inside model files, so they are untrusted code: they render in Jinja's
immutable sandbox, set up as transformers sets it up (trim_blocks, lstrip_blocks, loopcontrols, a
non-escaping `tojson`, `raise_exception`, `strftime_now`), with limits that make a runaway template
fail with one message instead of hanging or filling memory:

- `range` yields at most RANGE_BUDGET items per render, summed over every call (nested loops
  multiply, so the sandbox's own per-call cap does not bound them);
- no string or list the template builds (`*`, `+`, `%`, `~`, a filter, a method call) and no
  integer argument (a width, a count) exceeds MAX_TEXT, and `**` stays below MAX_POWER_BITS;
- the rendered text stops at MAX_TEXT characters;
- a render still running after TIME_LIMIT_S stops at its next template line (a trace hook on the
  template's own frames: a thread cannot be killed, but its Python code can be interrupted).

Every failure is a `ChatTemplateError` (a `jinja2.TemplateError`).
"""
from __future__ import annotations

import functools
import json
import math
import sys
import threading
import time
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

RANGE_BUDGET = 100_000
MAX_TEXT = 1 << 22            # characters (or list items); a 4M-character prompt is far past any context
MAX_POWER_BITS = 1 << 16
TIME_LIMIT_S = 2.0
_TEMPLATE_FILE = "<template>"   # the file name Jinja gives code compiled from a string


class ChatTemplateError(jinja2.TemplateError):
    """A chat template that failed, or ran past one of the limits."""


def compile_chat_template(source: str) -> "ChatTemplate":
    """Parse and compile `source` (raises jinja2.TemplateSyntaxError)."""
    return ChatTemplate(source)


class ChatTemplate:
    def __init__(self, source: str):
        self._env = _LimitedSandbox()
        self._template = self._env.from_string(source)

    def render(self, **variables) -> str:
        """The rendered text; raises ChatTemplateError past a limit (or for the template's own errors)."""
        state = self._env.state
        state.range_left = RANGE_BUDGET
        deadline = time.monotonic() + TIME_LIMIT_S
        parts, size = [], 0
        with _deadline(deadline):
            for piece in self._template.generate(**variables):
                size += len(piece)
                if size > MAX_TEXT:
                    raise ChatTemplateError(f"the rendered text passes {MAX_TEXT:,} characters")
                parts.append(piece)
        return "".join(parts)


class _Codegen(CodeGenerator):
    """`a ~ b` (Concat) goes through the environment's size check, like the intercepted binops."""

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.checked_size(")
        super().visit_Concat(node, frame)
        self.write(")")


class _LimitedSandbox(ImmutableSandboxedEnvironment):
    code_generator_class = _Codegen
    intercepted_binops = frozenset({"*", "+", "%", "**"})

    def __init__(self):
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        self.state = threading.local()          # the budget of the render in this thread
        self.filters = {name: _checked_filter(f, self) for name, f in self.filters.items()}
        self.filters["tojson"] = _checked_filter(_tojson, self)
        self.globals.update(range=self._range, raise_exception=_raise_exception,
                            strftime_now=lambda fmt: datetime.now().strftime(fmt))

    def _range(self, *args):
        rng = range(*args)
        left = getattr(self.state, "range_left", RANGE_BUDGET)
        if len(rng) > left:
            raise ChatTemplateError(f"the template's loops over range() pass {RANGE_BUDGET:,} items in all")
        self.state.range_left = left - len(rng)
        return rng

    def checked_size(self, value):
        if isinstance(value, (str, bytes, list, tuple, dict)) and len(value) > MAX_TEXT:
            raise ChatTemplateError(f"the template built a value of {len(value):,} items (limit {MAX_TEXT:,})")
        return value

    def call_binop(self, context, op: str, left, right):
        if op == "**" and _ints(left, right) and abs(left) > 1 and right * math.log2(abs(left)) > MAX_POWER_BITS:
            raise ChatTemplateError(f"{left} ** {right} is too large")
        if op == "*" and (_too_many(left, right) or _too_many(right, left)):
            raise ChatTemplateError(f"repeating a value {right if isinstance(right, int) else left} times is too much")
        if op == "%" and isinstance(left, str):
            _check_ints(right if isinstance(right, tuple) else (right,))
        return self.checked_size(super().call_binop(context, op, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 -- Jinja's own signature
        _check_ints(args + tuple(kwargs.values()))
        return __self.checked_size(super().call(__context, __obj, *args, **kwargs))


def _checked_filter(f, env: _LimitedSandbox):
    @functools.wraps(f)    # keeps Jinja's pass_context / pass_environment marks
    def checked(*args, **kwargs):
        _check_ints(args + tuple(kwargs.values()))
        return env.checked_size(f(*args, **kwargs))
    return checked


def _ints(*xs) -> bool:
    return all(isinstance(x, int) and not isinstance(x, bool) for x in xs)


def _too_many(seq, n) -> bool:
    return isinstance(seq, (str, list, tuple)) and _ints(n) and len(seq) * n > MAX_TEXT


def _check_ints(values) -> None:
    big = next((v for v in values if _ints(v) and abs(v) > MAX_TEXT), None)
    if big is not None:
        raise ChatTemplateError(f"the template passed {big} as a size or count (limit {MAX_TEXT:,})")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # Jinja's own tojson HTML-escapes; templates expect plain JSON
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


class _deadline:
    """Within the block, code compiled from a template string stops at its next line once
    `deadline` (time.monotonic()) has passed. Only template frames get the line hook, and the
    thread's previous trace function (a debugger, coverage) is put back afterwards."""

    def __init__(self, deadline: float):
        self.deadline = deadline

    def _line(self, frame, event, arg):
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"the template ran longer than {TIME_LIMIT_S:g} s")
        return self._line

    def _call(self, frame, event, arg):
        return self._line if frame.f_code.co_filename == _TEMPLATE_FILE else None

    def __enter__(self):
        self.previous = sys.gettrace()
        sys.settrace(self._call)

    def __exit__(self, *exc):
        sys.settrace(self.previous)
        return False


__all__ = ["ChatTemplate", "ChatTemplateError", "compile_chat_template", "MAX_TEXT", "RANGE_BUDGET",
           "TIME_LIMIT_S"]
