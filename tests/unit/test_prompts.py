"""Prompt building: chat history for the second turn, plain and chat styles, truncation."""

import pytest

from specbench.errors import SpecbenchError
from specbench.models.tiny import byte_tokenizer
from specbench.tasks import Query, build_prompt, truncate_fields

TEMPLATES = {"chat": "{turn}", "summarization": "summarize: {document}", "default": "{turn}"}
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<assistant>{% endif %}")


@pytest.fixture
def chat_tokenizer():
    tok = byte_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def test_second_turn_contains_first_answer(chat_tokenizer):
    q = Query(id="q1", task="chat", fields={"turn": "Name a colour."}, turns=["Name a colour.", "Why that one?"])
    first = chat_tokenizer.decode(build_prompt(q, chat_tokenizer, "chat", TEMPLATES))
    assert first == "<user>Name a colour.\n<assistant>"
    second = chat_tokenizer.decode(build_prompt(q, chat_tokenizer, "chat", TEMPLATES, turn=1,
                                                history=[("Name a colour.", "Teal, like the sea.")]))
    assert second == ("<user>Name a colour.\n<assistant>Teal, like the sea.\n<user>Why that one?\n<assistant>")


def test_plain_style_joins_history():
    tok = byte_tokenizer()
    q = Query(id="q1", task="chat", fields={"turn": "A?"}, turns=["A?", "B?"])
    text = tok.decode(build_prompt(q, tok, "plain", TEMPLATES, turn=1, history=[("A?", "yes")]))
    assert text == "A?\n\nyes\n\nB?"


def test_system_message(chat_tokenizer):
    q = Query(id="q1", task="chat", fields={"turn": "Hi"}, turns=["Hi"])
    text = chat_tokenizer.decode(build_prompt(q, chat_tokenizer, "chat", TEMPLATES, system="Be brief."))
    assert text.startswith("<system>Be brief.\n<user>Hi\n")


def test_chat_style_needs_a_chat_template():
    q = Query(id="q1", task="chat", fields={"turn": "Hi"}, turns=["Hi"])
    with pytest.raises(SpecbenchError, match="no chat template"):
        build_prompt(q, byte_tokenizer(), "chat", TEMPLATES)


def test_unknown_style_and_missing_template():
    tok = byte_tokenizer()
    q = Query(id="x", task="summarization", fields={"document": "d"})
    with pytest.raises(SpecbenchError, match="unknown prompt style"):
        build_prompt(q, tok, "fancy", TEMPLATES)
    with pytest.raises(SpecbenchError, match="no prompt template for task 'summarization'"):
        build_prompt(q, tok, "plain", {"chat": "{turn}"})
    with pytest.raises(SpecbenchError, match="uses field 'question'"):
        build_prompt(q, tok, "plain", {"summarization": "{question}"})


def test_truncation_is_logged(caplog):
    tok = byte_tokenizer()  # one token per byte
    q = Query(id="long", task="summarization", fields={"document": "abcdefghij"}, reference="r")
    short = truncate_fields(q, tok, 4)
    assert short.fields["document"] == "abcd" and short.reference == "r"
    assert "truncated" in caplog.text
    assert truncate_fields(q, tok, None) is q
