"""Timing through a whole ``eval`` Session, with a fake clock: the warm-up is not timed, each record's
``seconds`` is exactly its own generation's span, and the method order rotates per query index.

The fake clock (``FakeClock``, in place of ``specbench.timing.Clock`` where the Session makes its
clock) advances only when the target runs a forward (prefill or verification): 1 s each in a timed
generation, 1000 s each in a warm-up generation (told apart by the warm-up's ``max_new_tokens``).
Any warm-up time leaking into a record would show as a record of >= 1000 s.
"""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from specbench.configs import conf_dir
from specbench.models.target import Target
from specbench.pipelines import evaluate
from specbench.pipelines.session import core as session_module
from specbench.pipelines.session.schedule import rotation

WARM, MAX_NEW = 3, 8
WARM_COST, TIMED_COST = 1000.0, 1.0


class FakeClock:
    def __init__(self, *args, **kwargs):
        self.t = 0.0
        self.cost = TIMED_COST
        self.phases = False
        self.syncs = 0
        self.boundaries = 0

    def boundary(self) -> float:
        self.boundaries += 1
        return self.t

    def now(self) -> float:
        return self.t


@pytest.fixture
def timed_run(tmp_path, monkeypatch):
    clocks: list[FakeClock] = []
    log: list[dict] = []

    def make_clock(*args, **kwargs):
        clocks.append(FakeClock())
        return clocks[-1]

    def advancing(method):
        def forward(self, *args, **kwargs):
            for c in clocks:
                c.t += c.cost
            return method(self, *args, **kwargs)

        return forward

    original_decode = session_module.decode_rows

    def decode_rows(target, jobs, spec, *args, **kwargs):
        warm, clock = spec.limits.max_new_tokens == WARM, spec.clock
        clock.cost = WARM_COST if warm else TIMED_COST
        start = clock.t
        result = original_decode(target, jobs, spec, *args, **kwargs)
        (gen,) = result.generations  # batch 1: one generation a call
        log.append(
            {"warm": warm, "span": clock.t - start, "tokens": list(gen.tokens), "seconds": gen.seconds}
        )
        clock.cost = TIMED_COST
        return result

    monkeypatch.setattr(session_module, "Clock", make_clock)
    monkeypatch.setattr(session_module, "decode_rows", decode_rows)
    monkeypatch.setattr(Target, "prefill", advancing(Target.prefill))
    monkeypatch.setattr(Target, "score", advancing(Target.score))
    with initialize_config_dir(config_dir=conf_dir(), version_base=None):
        cfg = compose(
            config_name="eval",
            overrides=[
                "target=tiny_llama",
                "pool=tiny",
                "dataset.limit=1",
                "~dataset.sources.code",  # 4 queries x 4 methods
                f"decoding.max_new_tokens={MAX_NEW}",
                f"warmup.max_new_tokens={WARM}",
                "methods=[autoregressive,fixed:*]",
            ],
        )
    out = evaluate.run(cfg, tmp_path / "run")
    examples = [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]
    assert len(clocks) == 1, "the Session makes one clock"
    return examples, log


def test_warm_up_is_not_timed(timed_run):
    examples, log = timed_run
    methods = ["autoregressive", "fixed:quantized", "fixed:prompt_lookup", "fixed:early_exit_1"]
    warm = [e for e in log if e["warm"]]
    timed = [e for e in log if not e["warm"]]
    # one untimed warm-up per method, all before the first timed generation
    assert len(warm) == len(methods) and all(e["warm"] for e in log[: len(methods)])
    assert all(e["span"] >= WARM_COST for e in warm)  # the warm-ups did run forwards on the target
    assert len(timed) == len(examples) == 4 * len(methods)
    # each record's seconds is its own generation's span: no warm-up time, no other generation's
    for rec, gen in zip(examples, timed):
        assert rec["output_ids"] == gen["tokens"]
        assert rec["seconds"] == gen["seconds"] == gen["span"] < WARM_COST
        assert rec["seconds"] == TIMED_COST * (1 + rec["target_calls"])  # the prefill and each verification
    assert sum(r["seconds"] for r in examples) == sum(e["span"] for e in timed)


def test_method_order_rotates_per_query(timed_run):
    examples, _ = timed_run
    methods = ["autoregressive", "fixed:quantized", "fixed:prompt_lookup", "fixed:early_exit_1"]
    queries = list(dict.fromkeys(r["query_id"] for r in examples))
    assert len(queries) == 4
    order = [(r["query_id"], r["method"]) for r in examples]
    expected = [(q, methods[m]) for qi, q in enumerate(queries) for m in rotation(len(methods), qi)]
    assert order == expected
    # so every method ran first once, and last once
    assert sorted(order[qi * 4][1] for qi in range(4)) == sorted(methods)
    assert sorted(order[qi * 4 + 3][1] for qi in range(4)) == sorted(methods)


def test_rotation_and_seeds():
    assert rotation(3, 0) == [0, 1, 2] and rotation(3, 1) == [1, 2, 0] and rotation(3, 5) == [2, 0, 1]
    from specbench.pipelines.session.schedule import seed_for

    assert len({seed_for(0, q, m) for q in range(5) for m in range(5)}) == 25  # one seed per (query, method)
