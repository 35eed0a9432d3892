"""Spec-Bench's answer format, written from a run's records (``eval`` with ``spec_bench_answers=true``).

Spec-Bench (Xia et al. 2024, github.com/hemingkx/Spec-Bench) writes one JSONL file per method, one
line per question, and its ``evaluation/speed.py`` compares a method's file with the baseline's:

- ``question_id``, ``category``, ``answer_id``, ``model_id``, ``tstamp``;
- ``choices``: one choice ``{index: 0, turns, decoding_steps, new_tokens, wall_time, accept_lengths}``
  with one entry per turn in ``turns`` (the answer text), ``decoding_steps`` (target forward passes),
  ``new_tokens`` and ``wall_time`` (seconds), and ``accept_lengths``: the tokens each step emitted
  (accepted draft tokens + the target's own token; 1 per step for the baseline), every step of
  every turn. ``speed.py`` reads ``new_tokens``, ``wall_time`` and ``accept_lengths`` of a method,
  and ``turns`` (re-tokenized) and ``wall_time`` of the baseline, per ``category``.

Files: ``<out>/<model_id>-<method>.jsonl`` (``autoregressive`` is the baseline), e.g.
``python evaluation/speed.py --file-path <out>/vicuna-7b-v1.3-fixed-vicuna_68m.jsonl
--base-path <out>/vicuna-7b-v1.3-autoregressive.jsonl --tokenizer-path <vicuna-7b-v1.3>``.
A pure function of ``examples.jsonl`` and ``rounds.jsonl``: rerun it on any finished run directory.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from omegaconf import DictConfig

from specbench.files import atomic_write_text

_QUESTION = re.compile(r"(?:^|/)q(\d+)$")


def model_id(cfg: DictConfig) -> str:
    """The target's name as Spec-Bench's model ids start (``lmsys/vicuna-7b-v1.3`` -> ``vicuna-7b-v1.3``)."""
    return str(cfg.target.model).rstrip("/").split("/")[-1].split(":")[-1]


def question_of(query_id: str) -> tuple[str, int | str]:
    """``(base id, Spec-Bench question_id)``: ``q81/turn2`` -> ``("q81", 81)``; other ids stay strings."""
    base = query_id.split("/turn")[0]
    match = _QUESTION.search(base)
    return base, int(match.group(1)) if match else base


def answers(examples: Iterable[dict], rounds: Iterable[dict], model: str) -> dict[str, list[dict]]:
    """``{method: [answer line, ...]}`` in the order questions first appear in ``examples``."""
    steps: dict[tuple[str, str], list[int]] = defaultdict(list)
    for r in rounds:
        steps[(r["query_id"], r["method"])].append(int(r["emitted"]))
    turns: dict[str, dict[str, list[dict]]] = defaultdict(dict)
    for e in examples:  # a conversation_length run's chat is one multi-turn answer, under its first question
        base, _ = question_of(e.get("conversation") or e["query_id"])
        turns[e["method"]].setdefault(base, []).append(e)
    out: dict[str, list[dict]] = {}
    for method, questions in turns.items():
        lines = []
        for base, exs in questions.items():
            exs = sorted(exs, key=lambda e: int(e.get("conversation_turn") or e.get("turn") or 1))
            lengths = [n for e in exs for n in _own_steps(steps.get((e["query_id"], method), []), e)]
            lines.append(
                {
                    "question_id": question_of(base)[1],
                    "category": exs[0].get("category") or exs[0]["task"],
                    "answer_id": f"{model}-{method}-{base}",
                    "model_id": f"{model}-{method}",
                    "choices": [
                        {
                            "index": 0,
                            "turns": [e["text"] for e in exs],
                            "decoding_steps": [int(e["target_calls"]) for e in exs],
                            "new_tokens": [int(e["new_tokens"]) for e in exs],
                            "wall_time": [float(e["seconds"]) for e in exs],
                            "accept_lengths": lengths,
                        }
                    ],
                    "tstamp": None,
                }
            )
        out[method] = lines
    return out


def _own_steps(steps: list[int], example: dict) -> list[int]:
    """The rounds of one generation: the last ``rounds`` lines of its (query, method) (a directory written
    before resumes dropped orphan rounds may hold an unfinished earlier try's rounds before them)."""
    n = example.get("rounds")
    return steps[len(steps) - n :] if isinstance(n, int) and 0 <= n < len(steps) else steps


def file_name(model: str, method: str) -> str:
    return f"{model}-{method.replace(':', '-').replace('/', '_')}.jsonl"


def write_answers(examples: list[dict], rounds: list[dict], out_dir: Path, model_id: str) -> list[Path]:
    """One Spec-Bench answer file per method in ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for method, lines in answers(examples, rounds, model_id).items():
        path = out_dir / file_name(model_id, method)
        atomic_write_text(path, "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
        paths.append(path)
    return paths
