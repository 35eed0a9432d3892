"""Prompt building: chat history for the second turn, plain and chat styles, truncation."""

import pytest

from specbench.errors import SpecbenchError
from specbench.models.tiny import byte_tokenizer
from specbench.tasks import PromptFormat, Query, build_prompt, truncate_fields

TEMPLATES = {"chat": "{turn}", "summarization": "summarize: {document}", "default": "{turn}"}
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture
def chat_tokenizer():
    tok = byte_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def test_second_turn_contains_first_answer(chat_tokenizer):
    q = Query(
        id="q1", task="chat", fields={"turn": "Name a colour."}, turns=["Name a colour.", "Why that one?"]
    )
    first = chat_tokenizer.decode(build_prompt(q, chat_tokenizer, PromptFormat("chat", TEMPLATES)))
    assert first == "<user>Name a colour.\n<assistant>"
    second = chat_tokenizer.decode(
        build_prompt(
            q,
            chat_tokenizer,
            PromptFormat("chat", TEMPLATES),
            turn=1,
            history=[("Name a colour.", "Teal, like the sea.")],
        )
    )
    assert second == (
        "<user>Name a colour.\n<assistant>Teal, like the sea.\n<user>Why that one?\n<assistant>"
    )


def test_plain_style_joins_history():
    tok = byte_tokenizer()
    q = Query(id="q1", task="chat", fields={"turn": "A?"}, turns=["A?", "B?"])
    text = tok.decode(build_prompt(q, tok, PromptFormat("plain", TEMPLATES), turn=1, history=[("A?", "yes")]))
    assert text == "A?\n\nyes\n\nB?"


def test_system_message(chat_tokenizer):
    q = Query(id="q1", task="chat", fields={"turn": "Hi"}, turns=["Hi"])
    text = chat_tokenizer.decode(
        build_prompt(q, chat_tokenizer, PromptFormat("chat", TEMPLATES, system="Be brief."))
    )
    assert text.startswith("<system>Be brief.\n<user>Hi\n")


def test_chat_style_needs_a_chat_template():
    q = Query(id="q1", task="chat", fields={"turn": "Hi"}, turns=["Hi"])
    with pytest.raises(SpecbenchError, match="no chat template"):
        build_prompt(q, byte_tokenizer(), PromptFormat("chat", TEMPLATES))


def test_unknown_style_and_missing_template():
    tok = byte_tokenizer()
    q = Query(id="x", task="summarization", fields={"document": "d"})
    with pytest.raises(SpecbenchError, match="unknown prompt style"):
        build_prompt(q, tok, PromptFormat("fancy", TEMPLATES))
    with pytest.raises(SpecbenchError, match="no prompt template for task 'summarization'"):
        build_prompt(q, tok, PromptFormat("plain", {"chat": "{turn}"}))
    with pytest.raises(SpecbenchError, match="uses field 'question'"):
        build_prompt(q, tok, PromptFormat("plain", {"summarization": "{question}"}))


def test_truncation_is_logged(caplog):
    tok = byte_tokenizer()  # one token per byte
    q = Query(id="long", task="summarization", fields={"document": "abcdefghij"}, reference="r")
    short = truncate_fields(q, tok, 4)
    assert short.fields["document"] == "abcd" and short.reference == "r"
    assert "truncated" in caplog.text
    assert truncate_fields(q, tok, None) is q


def vicuna_prompt():
    from omegaconf import OmegaConf

    from specbench.configs import conf_dir

    return OmegaConf.load(f"{conf_dir()}/target/vicuna_7b_v1_3.yaml").prompt


def test_vicuna_prompt_is_fastchats_vicuna_v1_1():
    """Vicuna v1.3's tokenizer has no chat template: the target config's own reproduces FastChat's
    `vicuna_v1.1` conversation (system prompt, USER:/ASSISTANT:, " " and "</s>" separators), every turn."""
    prompt = vicuna_prompt()
    tok = byte_tokenizer(bos_token="<s>")
    assert not getattr(tok, "chat_template", None)
    q = Query(id="q1", task="writing", fields={"turn": "Hi"}, turns=["Hi", "More?"], kind="chat")
    fmt = PromptFormat(prompt.style, TEMPLATES, prompt.system, chat_template=prompt.chat_template)
    first = tok.decode(build_prompt(q, tok, fmt))
    system = (
        "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
        "detailed, and polite answers to the user's questions."
    )
    assert first == f"<s>{system} USER: Hi ASSISTANT:"
    second = tok.decode(build_prompt(q, tok, fmt, turn=1, history=[("Hi", "Hello there.")]))
    assert second == f"<s>{system} USER: Hi ASSISTANT: Hello there.</s>USER: More? ASSISTANT:"


def test_config_chat_template_wins_over_the_tokenizers(chat_tokenizer):
    q = Query(id="q1", task="chat", fields={"turn": "Hi"}, turns=["Hi"])
    fmt = PromptFormat(
        "chat", TEMPLATES, chat_template="{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    )
    text = chat_tokenizer.decode(build_prompt(q, chat_tokenizer, fmt))
    assert text == "[Hi]"


def test_templates_are_checked_against_every_record_before_decoding():
    """The first record a template does not fit is named, with how many more fail, before any decoding."""
    from specbench.tasks import check_templates

    ok = Query(id="a", task="summarization", fields={"document": "d"})
    bad = [Query(id=f"b{i}", task="math", fields={"question": "q"}) for i in range(3)]
    check_templates([ok], {"summarization": "{document}"})
    with pytest.raises(
        SpecbenchError,
        match=r"query b0 \(task 'math'\): the template for task 'math' uses field "
        r"'answer'.*2 more of the 3 failing queries",
    ):
        check_templates([ok, *bad], {"summarization": "{document}", "math": "{question} {answer}"})
    two_turns = Query(id="c", task="chat", fields={"turn": "x"}, turns=["x", "y"])
    check_templates([two_turns], {"chat": "{turn}"}, max_turns=2)
