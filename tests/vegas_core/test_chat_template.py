"""A model's chat template is untrusted code: a runaway one fails with one message, fast, instead
of hanging, raising something raw or filling memory; an ordinary one renders as before."""
import sys
import time

import pytest

from tests.vegas_core.conftest import CHATML_TEMPLATE
from vegas_core.chat_template import TIME_LIMIT_S
from vegas_core.errors import InvalidRequestError
from vegas_core.tokenizer import Tokenizer

CONTENT = "{% for c in messages[0].content %}"
HOSTILE = {
    "range of a float": "{% for i in range(1e8) %}x{% endfor %}",
    "range past the sandbox": "{% for i in range(100000000) %}x{% endfor %}",
    "nested ranges": "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
    "nested loops over the prompt": CONTENT * 3 + "{% endfor %}" * 3,
    "repeated string": "{{ 'a' * 1000000000 }}",
    "huge power": "{{ 10 ** 100000000 }}",
    "doubling by ~": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling by +": "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "huge width filter": "{{ 'a'|center(1000000000) }}",
    "huge width method": "{{ 'a'.ljust(1000000000) }}",
    "huge width format": "{{ '%*s' % (1000000000, 'a') }}",
    "endless output": "{% for i in range(99999) %}{{ 'abcdefghij' * 100 }}{% endfor %}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "division by zero": "{{ 1 / 0 }}",
    "sandbox escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
}


@pytest.fixture(scope="module")
def backend(default_model):
    return default_model.tokenizer.backend


@pytest.mark.parametrize("name", HOSTILE)
def test_a_runaway_template_fails_fast_with_one_message(backend, name):
    tok = Tokenizer(backend, chat_template=HOSTILE[name])
    tracer = sys.gettrace()
    t = time.monotonic()
    with pytest.raises(InvalidRequestError, match="^chat template refused the conversation: "):
        tok.apply_chat_template([{"role": "user", "content": "x" * 2000}])
    assert time.monotonic() - t < TIME_LIMIT_S + 1.5
    assert sys.gettrace() is tracer       # a debugger's or coverage's tracer is put back


def test_an_ordinary_template_renders_as_before(backend):
    tok = Tokenizer(backend, chat_template=CHATML_TEMPLATE)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi " * 5000}]
    assert tok.apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n" + "Hi " * 5000 + "<|im_end|>\n"
        "<|im_start|>assistant\n")
    tok = Tokenizer(backend, chat_template="{{ messages | tojson }}{% for i in range(3) %}{{ i }}{% endfor %}")
    assert tok.apply_chat_template([{"role": "user", "content": "é"}]) == '[{"role": "user", "content": "é"}]012'
