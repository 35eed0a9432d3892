"""Task-quality metrics against hand-computed values."""

from __future__ import annotations

import pytest

from specbench.tasks import metrics
from specbench.tasks.metrics import (
    bleu,
    corpus_bleu,
    gsm8k_correct,
    parse_gsm8k_reference,
    parse_last_number,
    rouge,
    score,
)

CAT = "the cat sat on the mat"
CAT_LAY = "the cat lay on the mat"


# ---------------------------------------------------------------------------- BLEU


def test_bleu_identical_is_100():
    assert bleu(CAT, CAT) == pytest.approx(100.0)


def test_bleu_disjoint_is_zero():
    assert bleu("alpha beta gamma delta", "one two three four") == pytest.approx(0.0, abs=1e-9)


def test_bleu_hand_computed_with_exp_smoothing():
    # n-gram precisions of CAT vs CAT_LAY: 5/6, 3/5, 1/4, and 0/3 for 4-grams, which sacrebleu's
    # default "exp" smoothing turns into 1/(2*3); equal lengths, so no brevity penalty.
    expected = 100 * (5 / 6 * 3 / 5 * 1 / 4 * 1 / 6) ** 0.25  # = 100 * (1/48) ** 0.25 = 37.99
    assert bleu(CAT, CAT_LAY) == pytest.approx(expected, abs=1e-6)


def test_bleu_short_sentence_uses_effective_order():
    # Two tokens, identical: no 3/4-grams exist, effective order keeps the score at 100.
    assert bleu("hello world", "hello world") == pytest.approx(100.0)


def test_corpus_bleu_identical_lists_is_100():
    sents = [CAT, "a quick brown fox jumps over the dog"]
    assert corpus_bleu(sents, list(sents)) == pytest.approx(100.0)


def test_corpus_bleu_pools_counts():
    # Pooled matches/totals: 1-grams (6+5)/12, 2-grams (5+3)/10, 3-grams (4+1)/8, 4-grams (3+0)/6.
    expected = 100 * (11 / 12 * 8 / 10 * 5 / 8 * 3 / 6) ** 0.25  # = 69.19
    got = corpus_bleu([CAT, CAT], [CAT, CAT_LAY])
    assert got == pytest.approx(expected, abs=1e-6)
    mean_sentence = (bleu(CAT, CAT) + bleu(CAT, CAT_LAY)) / 2  # = 68.99: not the same thing
    assert abs(got - mean_sentence) > 0.1


def test_corpus_bleu_length_mismatch_and_empty():
    with pytest.raises(ValueError):
        corpus_bleu([CAT], [CAT, CAT])
    assert corpus_bleu([], []) == 0.0


# ---------------------------------------------------------------------------- ROUGE


def test_rouge_cat_pair_hand_computed():
    # LCS "the cat on the mat" = 5 of 6 tokens each side: P = R = F = 5/6.
    # Bigrams: the-cat, on-the, the-mat shared, 3 of 5 each side: F = 3/5.
    r = rouge(CAT, CAT_LAY)
    assert set(r) == {"rouge1", "rouge2", "rougeL"}
    assert r["rougeL"] == pytest.approx(100 * 5 / 6)
    assert r["rouge1"] == pytest.approx(100 * 5 / 6)
    assert r["rouge2"] == pytest.approx(60.0)


def test_rouge_stemming_lowercase_punctuation():
    # Tokenised and stemmed: [the, dog, are, run, fast] vs [a, dog, run, fast].
    # rouge1: 3 shared -> P = 3/5, R = 3/4, F = 2/3.
    # rouge2: [the dog, dog are, are run, run fast] vs [a dog, dog run, run fast]: 1 shared ->
    #   P = 1/4, R = 1/3, F = 2/7.  LCS "dog run fast" = 3 -> rougeL = rouge1 here.
    r = rouge("The dogs are running fast.", "A dog runs fast")
    assert r["rouge1"] == pytest.approx(100 * 2 / 3)
    assert r["rouge2"] == pytest.approx(100 * 2 / 7)
    assert r["rougeL"] == pytest.approx(100 * 2 / 3)


def test_rouge_precision_recall_order():
    # Prediction is a prefix of the reference: P = 1, R = 2/4 -> F = 2/3 either way, but
    # rouge1 must use the reference as the target (checked through the scorer directly).
    raw = metrics._rouge_scorer().score("a b c d", "a b")
    assert raw["rouge1"].recall == pytest.approx(0.5) and raw["rouge1"].precision == pytest.approx(1.0)
    assert rouge("a b", "a b c d")["rouge1"] == pytest.approx(100 * 2 / 3)


def test_rouge_empty_prediction_is_zero():
    assert rouge("", CAT) == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}


def test_rouge_scorer_built_once():
    assert metrics._rouge_scorer() is metrics._rouge_scorer()


# ---------------------------------------------------------------------------- GSM8K parsing


LONG_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
    "#### 72"
)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("#### 1,250", "1250"),
        ("She pays 3 - 6 = <<3-6=-3>>-3\n#### -3", "-3"),
        ("#### $4.50", "4.5"),
        ("#### 7.0", "7"),
        ("#### 42.", "42"),
        ("#### $ 1,000", "1000"),
        ("#### 18", "18"),
        (LONG_SOLUTION, "72"),
        ("first #### 5 then #### 6", "6"),  # the last marker of a reference
        ("no marker here 12", None),
        ("#### ", None),
    ],
)
def test_parse_gsm8k_reference(answer, expected):
    assert parse_gsm8k_reference(answer) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 1,250", "1250"),
        ("The total is -12", "-12"),
        ("Each costs 3.75 dollars", "3.75"),
        ("She paid $4.50", "4.5"),
        ("So the answer is 42.", "42"),
        ("It was 7.0", "7"),
        ("He had 5 apples, bought 3 more, so 8 apples.", "8"),  # last number wins
        ("First 10, then 20, finally 30", "30"),
        ("The answer is 1,250.50 dollars", "1250.5"),
        ("pages 10-12", "12"),  # a hyphen after a digit is not a minus sign
        ("5 - 3 = 2", "2"),
        ("So x = -$5", "-5"),
        (LONG_SOLUTION, "72"),
        ("#### 72\nThe next question has 15 eggs and 3 hens.", "72"),  # marker wins over last
        ("#### 72\n\nQuestion: how many?\n#### 9", "72"),  # the first marker of an output
        ("She has 3 cats. #### $1,250.", "1250"),
        ("#### unknown, but maybe 4", "4"),  # first number after the marker
        ("I don't know.", None),
        ("", None),
    ],
)
def test_parse_last_number(text, expected):
    assert parse_last_number(text) == expected


def test_parse_last_number_marker_without_number_falls_back():
    assert parse_last_number("He ate 3 then 4 ####") == "4"


def test_gsm8k_correct():
    assert gsm8k_correct("Natalia sold 72 clips in total.", LONG_SOLUTION) == 1.0
    assert gsm8k_correct("She earned $1,250.00.", "#### 1250") == 1.0
    assert gsm8k_correct("The answer is 4.5", "#### $4.50") == 1.0
    assert gsm8k_correct("So 24 clips... #### 72", LONG_SOLUTION) == 1.0
    assert gsm8k_correct("She sold 24 clips.", LONG_SOLUTION) == 0.0
    assert gsm8k_correct("The loss is 3", "#### -3") == 0.0
    assert gsm8k_correct("72 then 73", LONG_SOLUTION) == 0.0
    assert gsm8k_correct("no idea", LONG_SOLUTION) == 0.0  # prediction does not parse
    assert gsm8k_correct("72", "seventy-two, no marker") == 0.0  # reference does not parse


# ---------------------------------------------------------------------------- score()


def test_score_translation():
    out = score("translation", CAT, CAT)
    assert set(out) == {"bleu", "output_words"}
    assert out["bleu"] == pytest.approx(100.0)
    assert out["output_words"] == 6.0


def test_score_summarization():
    out = score("summarization", CAT, CAT_LAY)
    assert set(out) == {"rouge1", "rouge2", "rougeL", "output_words"}
    assert out["rougeL"] == pytest.approx(100 * 5 / 6)


def test_score_math():
    out = score("math", "The answer is\n 72.", LONG_SOLUTION)
    assert out == {"accuracy": 1.0, "output_words": 4.0}
    assert score("math", "71", LONG_SOLUTION)["accuracy"] == 0.0


@pytest.mark.parametrize("task", ["translation", "summarization", "math", "chat", "writing", "roleplay"])
def test_score_without_reference_is_output_words_only(task):
    assert score(task, "one two  three\nfour", None) == {"output_words": 4.0}


@pytest.mark.parametrize("task", ["chat", "coding", "extraction"])
def test_score_other_tasks_ignore_reference(task):
    assert score(task, "a b c", "some reference") == {"output_words": 3.0}


def test_score_values_are_floats():
    for task, ref in [("translation", CAT), ("summarization", CAT), ("math", "#### 6"), ("chat", None)]:
        assert all(isinstance(v, float) for v in score(task, CAT, ref).values())
    assert score("chat", "", None) == {"output_words": 0.0}
