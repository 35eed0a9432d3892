"""Full information for draft heads (issue 20, item 4; HedgeSpec's "Not-a-Bandit" feedback).

Under a ``full_information`` selector, an eagle head that was not played replays the round on its
own state (caught up to the committed tokens from the target features the loop recorded, then its
chain along the played draft) and reports the Block Divergence it would have had, with the greedy
acceptance it would have had had it been played. On the tiny Llama with two different heads:

- the unplayed head is observed on every drafting round, the played one never;
- its recorded acceptance (when exact) equals what it accepts when actually played from the same
  state (a second generation that switches to it at that round), and a censored one is a lower bound;
- its side BD equals block_divergence recomputed from a fresh, cacheless head forward;
- with full information off, heads are not observed; with it on, decoding stays lossless.
"""

from __future__ import annotations

import pytest
import torch

from specbench.decoding.drafter import AUTOREGRESSIVE, Verification
from specbench.decoding.sampling import SamplingParams
from specbench.drafters import build_pool
from specbench.drafters.eagle import HeadObservation
from specbench.drafters.head_files import save_head, vocab_fingerprint
from specbench.selection import UCB
from specbench.selection.base import Selector
from tests.integration.test_eagle import PROMPTS, near_target_head

MAX_NEW = 40
K = 4
A_STEPS, B_STEPS = 60, 150


def fitted_head(target, seed, steps, sequences):
    """A pass-through head (``near_target_head``) fitted for ``steps`` Adam steps to the target's own
    greedy continuations of the test prompts (in-sample: the pass-through heads alone accept almost
    nothing on the tiny Llama, and the walk along the played draft would go no deeper than one token)."""
    head = near_target_head(target, seed=seed, noise=0.05)
    layer = int(target.config.num_hidden_layers)
    embed, lm_head = target.model.get_input_embeddings(), target.model.get_output_embeddings()
    data = []
    for ids in sequences:
        states = target.prefill(ids, layers=(layer,)).states
        with torch.no_grad():
            x = embed(torch.tensor([ids[1:-1]]))[0].clone()
        data.append((states[layer].clone(), x, torch.tensor(ids[2:])))
    torch.manual_seed(seed)
    opt = torch.optim.Adam(head.parameters(), lr=3e-3)
    head.train()
    for _ in range(steps):
        for f, x, y in data:
            out = head(f[:-1][None], x[None])[0]  # predicts f_1 .. and the token after each pair
            loss = torch.nn.functional.cross_entropy(lm_head(out).float(), y)
            loss = loss + torch.nn.functional.smooth_l1_loss(out, f[1:])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return head.eval()


@pytest.fixture(scope="module")
def heads(tiny_llama_target, tmp_path_factory, tiny_decode):
    """Heads A (full vocabulary) and B (another seed, fitted longer, a sub-vocabulary), both fitted to the
    target's continuations so that both accept several tokens and still disagree."""
    target = tiny_llama_target
    tmp = tmp_path_factory.mktemp("fi_heads")
    meta = {"kind": "eagle", "target": "embedded:tiny_llama", "vocab": vocab_fingerprint(target.tokenizer)}
    auto = build_pool(target, {})
    sequences = []
    for text in PROMPTS:
        prompt = target.tokenizer(text)["input_ids"]
        sequences.append(
            prompt + tiny_decode(target, auto, AUTOREGRESSIVE, prompt, max_new_tokens=MAX_NEW).tokens
        )
    save_head(fitted_head(target, 0, A_STEPS, sequences), None, tmp / "a", meta)
    save_head(fitted_head(target, 1, B_STEPS, sequences), torch.arange(3, 3 + 200), tmp / "b", meta)
    pool = build_pool(
        target,
        {
            "A": {"_target_": "specbench.drafters.eagle.build", "checkpoint": str(tmp / "a")},
            "B": {"_target_": "specbench.drafters.eagle.build", "checkpoint": str(tmp / "b")},
        },
    )
    return target, pool


class PlayA(Selector):
    """Plays ``schedule(round)`` (A by default) and records every side observation with its round."""

    def __init__(self, arms, full_information=True, schedule=None):
        super().__init__(arms)
        self.full_information = full_information
        self.schedule = schedule or (lambda i: "A")
        self.round = -1
        self.side: list[tuple[int, str, float]] = []

    def select(self):
        self.round += 1
        return self.schedule(self.round)

    def observe(self, arm, bd):
        self.side.append((self.round, arm, bd))


def capture(drafter, seen: list):
    """Wrap ``drafter.observe`` to record (verification, what it returned) on the instance."""
    original = type(drafter).observe

    def observe(v):
        out = original(drafter, v)
        seen.append((v, out))
        return out

    drafter.observe = observe
    return lambda: drafter.__dict__.pop("observe", None)


@pytest.mark.parametrize("text", PROMPTS)
def test_unplayed_head_is_observed_every_round_and_acceptance_is_exact(heads, tiny_decode, text):
    target, pool = heads
    prompt = target.tokenizer(text)["input_ids"]
    ref = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=MAX_NEW)
    rec = PlayA(list(pool))
    gen = tiny_decode(target, pool, rec, prompt, max_new_tokens=MAX_NEW, draft_length=K)
    assert gen.tokens == ref.tokens  # lossless with observation on
    drafting = [r.index for r in gen.rounds if r.drafted > 0]
    assert [(i, arm) for i, arm, _ in rec.side] == [(i, "B") for i in drafting]  # B every round, A never
    obs = {i: bd for i, _, bd in rec.side}
    assert all(isinstance(o, HeadObservation) and 0.0 <= o <= 1.0 for o in obs.values())
    starts = [len(prompt) + sum(r.emitted for r in gen.rounds[:i]) for i in range(len(gen.rounds))]
    assert all(obs[i].start == starts[i] for i in obs)
    assert any(obs[i].accepted >= 2 for i in obs)  # the walk goes along the played draft
    assert any(not obs[i].exact for i in obs)  # and some leave it (censored)
    assert any(obs[i].accepted != gen.rounds[i].accepted for i in obs)  # B is not A
    # Replay: play A before round i and B at round i; B's real acceptance is the recorded one.
    for i in sorted(obs):
        sel = PlayA(list(pool), full_information=False, schedule=lambda r, i=i: "B" if r == i else "A")
        again = tiny_decode(target, pool, sel, prompt, max_new_tokens=MAX_NEW, draft_length=K)
        assert again.tokens == ref.tokens
        played = again.rounds[i]
        assert played.arm == "B"
        assert len(prompt) + sum(r.emitted for r in again.rounds[:i]) == obs[i].start
        if obs[i].exact:
            assert played.accepted == obs[i].accepted, (i, obs[i])
        else:  # censored: B's own draft left the played one, which was rejected there
            assert played.accepted >= obs[i].accepted, (i, obs[i])


def test_side_bd_equals_a_fresh_head_along_the_played_draft(heads, tiny_decode):
    target, pool = heads
    b = pool["B"]
    seen: list = []
    restore = capture(b, seen)
    try:
        prompt = target.tokenizer(PROMPTS[1])["input_ids"]
        tiny_decode(target, pool, PlayA(list(pool)), prompt, max_new_tokens=30, draft_length=K)
    finally:
        restore()
    rounds = [(v.context, list(v.draft), v.p.clone(), out) for v, out in seen if out is not None]
    assert len(rounds) >= 3
    layer = b.layer
    d2t = b.logits.d2t
    lm_head = target.model.get_output_embeddings()
    for context, draft, p_loop, out in rounds[:: max(1, len(rounds) // 4)]:
        # the target, independently: features at the committed positions, p at the drafted ones
        states = target.prefill(context, layers=(layer,)).states
        f = states[layer]  # [n - 1, H]: f_0 .. f_{n-2}
        p = torch.softmax(target.score(draft).logits.float()[: len(draft)], -1)
        torch.testing.assert_close(p, p_loop, atol=1e-5, rtol=1e-5)
        # the head, cacheless: h_0 from every committed pair, then h_j appended to the feature stream
        feats, ids, q = f, list(context[1:]), []
        with torch.inference_mode():
            for j in range(len(draft)):
                emb = b.embed(torch.tensor([ids]))
                h = b.head(feats[None], emb)[0, -1]
                sub = torch.softmax(torch.nn.functional.linear(h, lm_head.weight[d2t]).float(), -1)
                q.append(torch.zeros(target.vocab_size).index_put_((d2t,), sub))
                feats, ids = torch.cat([feats, h[None]]), ids + [draft[j]]
        q = torch.stack(q)
        bd = float(torch.minimum(p, q).sum()) / len(draft)
        assert float(out) == pytest.approx(bd, abs=1e-4)


def test_heads_are_not_observed_without_full_information(heads, tiny_decode):
    target, pool = heads
    prompt = target.tokenizer(PROMPTS[0])["input_ids"]
    seen: list = []
    restore = capture(pool["B"], seen)
    try:
        rec = PlayA(list(pool), full_information=False)
        gen = tiny_decode(target, pool, rec, prompt, max_new_tokens=20, draft_length=K)
    finally:
        restore()
    assert gen.drafted > 0 and rec.side == [] and seen == []
    # and a verification of a query that asked for no side observations gets none
    v = Verification(
        draft=[5],
        p=torch.full((1, target.vocab_size), 1.0 / target.vocab_size),
        accepted=0,
        played="A",
        sampling=SamplingParams(),
        context=list(target.tokens[:-1]),
        query=pool["A"]._query,
    )
    assert pool["B"].observe(v) is None


def test_full_information_ucb_over_heads_is_lossless(heads, tiny_decode):
    target, pool = heads
    prompt = target.tokenizer(PROMPTS[1])["input_ids"]
    ref = tiny_decode(target, pool, AUTOREGRESSIVE, prompt, max_new_tokens=MAX_NEW)
    sel = UCB(list(pool), full_information=True, beta=0.5)
    gen = tiny_decode(target, pool, sel, prompt, max_new_tokens=MAX_NEW, draft_length=K)
    assert gen.tokens == ref.tokens
    for arm in ("A", "B"):  # each head counted more often than it was played
        assert sel.counts[sel.candidates.index(arm)] > sum(r.arm == arm for r in gen.rounds)
