"""Task-quality metrics: pure, offline functions (no ``evaluate.load``, nothing fetched).

Metrics and scales:

- **BLEU** (translation), 0-100, via sacrebleu with its default 13a tokenizer.
  ``bleu`` is sentence-level BLEU with ``effective_order=True`` (n-gram orders with no
  candidate n-grams are left out, so short sentences do not collapse to 0); it is the
  per-example value stored in records.  ``corpus_bleu`` is standard corpus BLEU (n-gram
  counts pooled over all examples, one brevity penalty); summaries should report corpus
  BLEU, because the mean of sentence BLEU is not BLEU.
- **ROUGE** (summarization), 0-100, via ``rouge_score`` with the Porter stemmer: the
  F-measure of ``rouge1`` (unigram overlap), ``rouge2`` (bigram overlap) and ``rougeL``
  (longest common subsequence, sentence-level, not the summary-level ``rougeLsum``).
  rouge_score lowercases, replaces non-alphanumerics with spaces and stems tokens longer
  than three characters.
- **GSM8K accuracy** (math), 1.0 or 0.0: exact match of the normalised final number of the
  model output with the number after the last ``####`` of the reference answer.
  Normalisation drops ``$``, thousands commas, spaces and a trailing period, and trailing
  zeros of decimals (``"1,250" -> "1250"``, ``"$4.50" -> "4.5"``, ``"7.0" -> "7"``).
  In a model output the number after the first ``####`` marker wins if there is one (a model
  that goes on to invent a next question puts its hallucinated answers after later markers);
  otherwise the last number in the text.
- **output_words** (every task), the number of whitespace-separated words in the output.

``score(task, prediction, reference)`` builds the per-example quality dict of a record: the task's metric is
named in the task registry (``tasks/registry.py``: ``TASKS``), its function here (``METRICS``).
"""

from __future__ import annotations

import functools
import re

import sacrebleu
from rouge_score import rouge_scorer

from specbench.tasks.registry import TASKS

__all__ = [
    "bleu",
    "corpus_bleu",
    "METRICS",
    "gsm8k_correct",
    "parse_gsm8k_reference",
    "parse_last_number",
    "rouge",
    "score",
]

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")
GSM8K_MARKER = "####"

# A number: optional minus sign (only when it does not follow a word character or ")" — so the
# hyphen of "10-12" or "x-3" is not a sign), optional "$", then either comma-grouped thousands
# ("1,250", not followed by another digit) or plain digits, then an optional decimal part.  A
# trailing "." with no digit after it ("is 42.") is not part of the number.
_NUMBER = re.compile(
    r"(?P<sign>(?<![\w)])-)?"
    r"(?:\$\s?)?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
    r"(?P<frac>\.\d+)?"
)


# ---------------------------------------------------------------------------- BLEU


@functools.lru_cache(maxsize=1)
def _sentence_bleu_metric() -> sacrebleu.metrics.BLEU:
    return sacrebleu.metrics.BLEU(effective_order=True)


@functools.lru_cache(maxsize=1)
def _corpus_bleu_metric() -> sacrebleu.metrics.BLEU:
    return sacrebleu.metrics.BLEU()


def bleu(prediction: str, reference: str) -> float:
    """Sentence-level BLEU (0-100) of one prediction against one reference."""
    return float(_sentence_bleu_metric().sentence_score(prediction, [reference]).score)


def corpus_bleu(predictions: list[str], references: list[str]) -> float:
    """Corpus BLEU (0-100) of aligned predictions and references (one reference each)."""
    predictions, references = list(predictions), list(references)
    if len(predictions) != len(references):
        raise ValueError(f"corpus_bleu: {len(predictions)} predictions but {len(references)} references")
    if not predictions:
        return 0.0
    return float(_corpus_bleu_metric().corpus_score(predictions, [references]).score)


# ---------------------------------------------------------------------------- ROUGE


@functools.lru_cache(maxsize=1)
def _rouge_scorer() -> rouge_scorer.RougeScorer:
    return rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1/2/L F-measures (0-100) of a prediction against a reference."""
    scores = _rouge_scorer().score(reference, prediction)  # rouge_score's order: (target, prediction)
    return {key: 100.0 * float(scores[key].fmeasure) for key in ROUGE_KEYS}


# ---------------------------------------------------------------------------- GSM8K


def _normalise(match: re.Match) -> str:
    integer = match.group("int").replace(",", "").lstrip("0") or "0"
    frac = (match.group("frac") or "").rstrip("0")
    if frac == ".":
        frac = ""
    text = integer + frac
    if match.group("sign") and text != "0":
        text = "-" + text
    return text


def _numbers(text: str) -> list[str]:
    return [_normalise(m) for m in _NUMBER.finditer(text)]


def parse_gsm8k_reference(answer: str) -> str | None:
    """The normalised number after the last ``####`` of a GSM8K answer; None if there is none."""
    if not isinstance(answer, str) or GSM8K_MARKER not in answer:
        return None
    numbers = _numbers(answer.rsplit(GSM8K_MARKER, 1)[1])
    return numbers[0] if numbers else None


def parse_last_number(text: str) -> str | None:
    """The model's final answer: the number after the first ``####`` marker if the text has one
    with a number after it, else the last number in the text; normalised; None if no number."""
    if not isinstance(text, str):
        return None
    if GSM8K_MARKER in text:
        after = _numbers(text.split(GSM8K_MARKER, 1)[1])
        if after:
            return after[0]
    numbers = _numbers(text)
    return numbers[-1] if numbers else None


def gsm8k_correct(prediction: str, reference_answer: str) -> float:
    """1.0 if the prediction's final number equals the reference's ``####`` number, else 0.0."""
    expected = parse_gsm8k_reference(reference_answer)
    got = parse_last_number(prediction)
    if expected is None or got is None:
        return 0.0
    return 1.0 if got == expected else 0.0


# ---------------------------------------------------------------------------- per example


def _bleu_scores(prediction: str, reference: str) -> dict[str, float]:
    return {"bleu": bleu(prediction, reference)}


def _gsm8k_scores(prediction: str, reference: str) -> dict[str, float]:
    return {"accuracy": gsm8k_correct(prediction, reference)}


# A task's metric (``Task.metric`` in the registry) -> its per-example scores of a prediction against a reference.
METRICS = {"bleu": _bleu_scores, "rouge": rouge, "gsm8k": _gsm8k_scores}


def score(task: str, prediction: str, reference: str | None) -> dict[str, float]:
    """Per-example quality dict: ``output_words`` always, plus the task's metric (``TASKS[task].metric``) when
    the example has a reference (translation: ``bleu``; summarization: ``rouge1/rouge2/rougeL``;
    math: ``accuracy``).  Other tasks (chat, Spec-Bench categories) get ``output_words`` only."""
    prediction = prediction or ""
    out: dict[str, float] = {}
    metric = TASKS[task].metric if task in TASKS else None
    if reference is not None and metric:
        out.update(METRICS[metric](prediction, reference))
    out["output_words"] = float(len(prediction.split()))
    return out
