"""Greedy equality across the paper-scale stand-ins, 32 tokens per method.

The paper-scale dry run (``test_paper_dry_run.py``) checks the plumbing with 3 new tokens (one or two
rounds). Here one paper experiment per stand-in architecture runs through its own command with the
dry run's stand-ins, local data and CPU, but ``decoding.max_new_tokens=32``, and:

- every lossless method (greedy: every ``eval`` method, the cascades' ``sd``) has ``exact_match`` /
  ``agreement_exact`` 1.0 and output ids equal to the autoregressive arm's on every query, after
  rounds that really drafted (so the draft was verified 32 tokens long, not one round);
- the stand-in target's autoregressive decode through the loop equals Hugging Face's greedy
  ``generate`` (32 tokens, or up to its EOS), and so does a speculative (int8) decode.

Architectures: Llama at 32000 tokens (Vicuna-7B, its 68M drafters), EAGLE-1 (the Vicuna head),
T5 (T5-large and its small drafters), LayerSkip (a 16-layer Llama-3 with early exits), Gemma-2
(9B-it drafted by 2B-it, the cascades experiment, here greedy and with its first rule only). Runtime: ~3-11 s per case, ~40 s in all.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
from omegaconf import open_dict

from tests.integration.test_paper_dry_run import StandIns, compose_for, tiny_run

MAX_NEW = 32
CASES = {  # architecture -> (experiment, command)
    "llama32000": ("metasd_vicuna", "eval"),
    "eagle1": ("metasd_vicuna_eagle", "eval"),
    "t5": ("huang_t5", "eval"),
    "layerskip": ("huang_early_exit", "eval"),
    "gemma2": ("cascades_gemma_gsm8k", "cascades"),
}
SLOW: set[str] = set()  # every case runs in ~3-11 s


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    return StandIns(tmp_path_factory.mktemp("stand_ins_greedy"))


def run_case(name: str, command: str, stand_ins: StandIns, tmp_path):
    cfg = compose_for(command, [f"experiment={name}"])
    tiny_run(cfg, stand_ins, tmp_path)
    with open_dict(cfg):
        cfg.decoding.max_new_tokens = MAX_NEW
        cfg.decoding.temperature = 0.0  # greedy (the Gemma cascades experiment samples)
        if command == "cascades":  # one rule's grid: the lossless point and the baseline are what is checked
            cfg.rules = [str(cfg.rules[0])]
    if command == "eval":
        from specbench.pipelines import evaluate

        evaluate.run(cfg, tmp_path / "run")
    else:
        from specbench.pipelines import cascades

        cascades.run(cfg, tmp_path / "run")
    examples = [json.loads(x) for x in (tmp_path / "run" / "examples.jsonl").read_text().splitlines()]
    return cfg, examples


def hf_greedy(model, ids: list[int], max_new: int, eos: int | None, encoder_decoder: bool) -> list[int]:
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=False,
            max_new_tokens=max_new,
            eos_token_id=eos,
            pad_token_id=eos if eos is not None else 0,
        )[0].tolist()
    return out[1:] if encoder_decoder else out[len(ids) :]


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW else a for a in CASES])
def test_stand_in_greedy_equality(arch, stand_ins, tmp_path, tiny_decode):
    name, command = CASES[arch]
    cfg, examples = run_case(name, command, stand_ins, tmp_path)

    # 1. every lossless method's output equals the autoregressive arm's, 32 tokens long
    by_query: dict[str, dict[str, dict]] = {}
    for e in examples:
        by_query.setdefault(e["query_id"], {})[e["method"]] = e
    lossless = (lambda m: True) if command == "eval" else (lambda m: m in ("autoregressive", "sd"))
    drafted = 0
    for qid, methods in by_query.items():
        ref = methods["autoregressive"]
        assert ref["new_tokens"] == MAX_NEW or ref["stop"] == "eos", (qid, ref["new_tokens"], ref["stop"])
        for method, e in methods.items():
            if lossless(method):
                assert e["output_ids"] == ref["output_ids"], (arch, qid, method)
                drafted += e["drafted"]
    assert drafted > 0
    if command == "eval":
        summary = pd.read_csv(tmp_path / "run" / "summary.csv")
        assert len(set(summary.method)) >= 3
        assert (summary.exact_match == 1.0).all(), summary[summary.exact_match != 1.0][["task", "method"]]
    else:
        curves = pd.read_csv(tmp_path / "run" / "curves.csv")
        assert (curves[curves.method == "sd"].agreement_exact == 1.0).all()

    # 2. the stand-in target through the loop equals Hugging Face's greedy generate
    from specbench.drafters import build_pool
    from specbench.models import Target, load_model

    target = Target(load_model(str(cfg.target.model), dtype="float32", device="cpu"))
    pool = build_pool(
        target, {"quantized": {"_target_": "specbench.drafters.quantized.build", "scheme": "weight_int8"}}
    )
    tok = target.tokenizer
    eos = tok.eos_token_id
    for text in ("The quick brown fox jumps over the lazy dog. The quick brown", "abc abc abc abc"):
        ids = tok(text)["input_ids"]
        expected = hf_greedy(target.model, ids, MAX_NEW, eos, target.is_encoder_decoder)
        for arm in ("autoregressive", "quantized"):
            gen = tiny_decode(
                target,
                pool,
                arm,
                ids,
                max_new_tokens=MAX_NEW,
                draft_length=4,
                eos_ids=frozenset() if eos is None else None,
            )
            assert gen.tokens == expected, (arch, arm, text)
