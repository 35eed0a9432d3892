"""The one decode loop over several rows (``decoding/engine.py``, ``models/batched.py``) on the tiny Llama in fp32:
every row's greedy output equals the same prompt decoded alone (``decode``), at batch 2 and 4, with rows of different
prompt lengths, different drafters (prompt lookup, the retrieval drafter, the autoregressive arm, model drafters and
heads drafting their rows together) and different accepted lengths; a finished row leaves the others unchanged, and
its place goes to a waiting prompt; what cannot batch yet is refused before any forward, naming the fix; each row may
choose its drafter every round with its own selector (a router routes, a tree selector verifies a token tree, a
cost-model plan builds its round, each row's round as it would alone); the batch budget's cut drafts leave every
row's output unchanged, cutting nothing where tokens are free and everything where each costs a step."""

from __future__ import annotations

import copy

import pytest
import torch

from specbench.decoding.batch_budget import BatchBudget, ForwardCosts, first_path
from specbench.decoding.drafter import Draft, Drafter
from specbench.decoding.engine import Player, Rows
from specbench.decoding.loop import DecodeSpec, Limits
from specbench.decoding.sampling import SamplingParams
from specbench.drafters.base import with_tree
from specbench.drafters.prompt_lookup import PromptLookup
from specbench.drafters.suffix import SuffixDrafter
from specbench.errors import SpecbenchError
from specbench.models.batched import BatchedLM
from specbench.timing import Clock
from tests.batching import decode_batch

TEXTS = [
    "the cat sat on the mat and the cat sat on the mat and the",
    "one two three one two three one",
    "abc abc abc abc abc abc abc abc abc abc",
    "a long prompt that repeats itself, a long prompt that repeats itself, a long prompt",
]


def _spec(target, max_new_tokens=24, draft_length=4, eos=True):
    eos_ids = frozenset({int(target.tokenizer.eos_token_id)}) if eos else frozenset()
    return DecodeSpec(
        SamplingParams(), Limits(max_new_tokens=max_new_tokens, draft_length=draft_length), eos_ids, Clock()
    )


def _prompts(target, n):
    return [target.tokenizer(t)["input_ids"] for t in TEXTS[:n]]


def _alone_gen(target, pool, arm, prompt, tiny_decode, spec):
    """The prompt decoded alone (``decode``) with ``arm`` (a pool key or a selector) under ``spec``'s limits."""
    return tiny_decode(
        target,
        pool,
        arm,
        prompt,
        max_new_tokens=spec.limits.max_new_tokens,
        draft_length=spec.limits.draft_length,
        eos_ids=spec.eos_ids,
    )


def _alone(target, pool, arm, prompt, tiny_decode, spec):
    return _alone_gen(target, pool, arm, prompt, tiny_decode, spec).tokens


def _rounds_as_alone(target, pool, arms, prompts, result, tiny_decode, spec) -> None:
    """Each row's output, and each of its rounds' drafted and accepted tokens, are its prompt's alone."""
    for arm, prompt, gen in zip(arms, prompts, result.generations):
        alone = _alone_gen(target, pool, arm, prompt, tiny_decode, spec)
        assert gen.tokens == alone.tokens, arm
        assert [(r.drafted, r.accepted) for r in gen.rounds] == [
            (r.drafted, r.accepted) for r in alone.rounds
        ], arm


class Scripted(Drafter):
    """Drafts the known greedy continuation of its prompts (``references``: prompt + output), wrong at every
    position whose index is a multiple of ``wrong_every``: its acceptance varies from round to round, and two of them
    with different ``wrong_every`` accept different lengths in the same forwards. Stateless: every row may share it."""

    deterministic = True

    def __init__(self, name: str, references: list[list[int]], wrong_every: int):
        self.name, self.references, self.wrong_every = name, references, wrong_every

    def for_row(self) -> Scripted:
        return self

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset(), stop_below=0.0) -> Draft:
        ref = next((r for r in self.references if r[: len(tokens)] == list(tokens)), [])
        nxt = ref[len(tokens) : len(tokens) + k]  # none past its reference
        return Draft(
            tokens=[
                (t + 1) % 256 if (len(tokens) + i) % self.wrong_every == 0 else t for i, t in enumerate(nxt)
            ],
            probs=None,
        )


@pytest.fixture(scope="module")
def row_pool(tiny_llama_target, tiny_llama_pool, tiny_decode):
    from specbench.drafters import AutoregressiveArm

    target = tiny_llama_target
    pool = {"autoregressive": AutoregressiveArm()}
    spec = _spec(target)
    references = [
        p + _alone(target, pool, "autoregressive", p, tiny_decode, spec) for p in _prompts(target, 4)
    ]
    return {
        **pool,
        "prompt_lookup": PromptLookup("prompt_lookup", max_ngram=3),
        "suffix": SuffixDrafter("suffix", memory=False),
        "scripted_2": Scripted("scripted_2", references, 2),
        "scripted_5": Scripted("scripted_5", references, 5),
        "hf": tiny_llama_pool["hf"],  # a model drafter: its rows draft in one forward (drafters/batched.py)
        "early_exit": tiny_llama_pool["early_exit"],
    }


@pytest.mark.parametrize(
    "arms",
    [
        ("scripted_5", "autoregressive"),
        ("scripted_2", "prompt_lookup", "scripted_5", "suffix"),
        ("hf", "scripted_2", "hf", "early_exit"),
    ],
)
def test_every_row_equals_its_prompt_decoded_alone(tiny_llama_target, row_pool, tiny_decode, arms):
    target = tiny_llama_target
    spec = _spec(target)
    prompts = _prompts(target, len(arms))
    assert len({len(p) for p in prompts}) == len(prompts)  # rows of different lengths
    result = decode_batch(
        target, [row_pool[a] for a in arms], prompts, spec, torch.Generator().manual_seed(0)
    )
    for arm, prompt, gen in zip(arms, prompts, result.generations):
        assert gen.tokens == _alone(target, row_pool, arm, prompt, tiny_decode, spec), arm
        assert gen.target_calls == len(gen.rounds) and all(r.arm == arm for r in gen.rounds)
    accepted = [sum(r.accepted for r in g.rounds) for g in result.generations]
    assert len(set(accepted)) > 1  # the rows accepted different lengths in the same forwards
    assert result.forwards == max(g.target_calls for g in result.generations)


def test_a_finished_row_leaves_the_others_unchanged(tiny_llama_target, row_pool, tiny_decode):
    """Row 0 ends early (its output's first token that no other row emits is made the EOS, so it leaves the batch
    after a few rounds while the others run on): every row still equals its prompt decoded alone, and the others
    equal a batch without any EOS."""
    target = tiny_llama_target
    prompts = _prompts(target, 3)
    arms = ["scripted_2", "autoregressive", "scripted_5"]
    rng = torch.Generator().manual_seed(0)
    free = _spec(target, max_new_tokens=20, eos=False)
    drafters = [row_pool[a] for a in arms]
    running = decode_batch(target, drafters, prompts, free, rng)
    others = {t for g in running.generations[1:] for t in g.tokens}
    stop = next(t for t in running.generations[0].tokens[2:15] if t not in others)
    ending = DecodeSpec(free.sampling, free.limits, frozenset({stop}), Clock())
    ended = decode_batch(target, drafters, prompts, ending, rng)
    first = ended.generations[0]
    assert first.stop == "eos" and first.tokens[-1] == stop and len(first.tokens) < 20
    assert [g.tokens for g in ended.generations[1:]] == [g.tokens for g in running.generations[1:]]
    for arm, prompt, gen in zip(arms, prompts, ended.generations):
        assert gen.tokens == _alone(target, row_pool, arm, prompt, tiny_decode, ending), arm


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_waiting_prompts_take_finished_rows_places_and_decode_as_alone(
    tiny_llama_target, row_pool, tiny_decode, monkeypatch, rows
):
    """Continuous batching: six prompts (one a single token, so its prefill caches nothing; one longer than the batch's
    rows when it joins) with at most ``rows`` in flight; each waiting prompt joins the batch (``BatchedLM.admit``) when
    a row finishes, and every row's output and rounds equal its prompt decoded alone, drafters that draft many rows in
    one forward (the HF drafter) included."""
    target = tiny_llama_target
    spec = _spec(target, max_new_tokens=12, eos=False)
    texts = [
        *TEXTS,
        TEXTS[3] + " and once more, a long prompt that repeats itself, a long prompt that repeats",
    ]
    prompts = [target.tokenizer(t)["input_ids"] for t in texts]
    prompts.insert(2, prompts[0][:1])
    arms = ("scripted_2", "hf", "prompt_lookup", "autoregressive", "hf", "scripted_5")
    admitted = []
    original = BatchedLM.admit

    def counting(self, sequences, *args):
        if self.model is target.model:
            admitted.append((self.rows, max(self.lengths, default=0), [len(s) for s in sequences]))
        return original(self, sequences, *args)

    monkeypatch.setattr(BatchedLM, "admit", counting)
    result = decode_batch(target, [row_pool[a] for a in arms], prompts, spec, torch.Generator(), rows=rows)
    _rounds_as_alone(target, row_pool, arms, prompts, result, tiny_decode, spec)
    if rows > 1:  # some prompts joined a batch that was still decoding, one of them longer than its rows
        assert admitted and any(max(lengths) > slots for _, slots, lengths in admitted)
        assert result.forwards < sum(g.target_calls for g in result.generations)
    # each row is in every forward from the one it joined to the one it finished; no place stays empty while a
    # prompt waits: forward f holds min(rows, the prompts not finished before it) rows
    spans = [[r.forward for r in g.rounds] for g in result.generations]
    assert all(s == list(range(s[0], s[-1] + 1)) for s in spans)
    assert max(s[-1] for s in spans) + 1 == result.forwards
    for f in range(result.forwards):
        finished = sum(s[-1] < f for s in spans)
        assert sum(s[0] <= f <= s[-1] for s in spans) == min(rows, len(prompts) - finished)


def test_a_rejected_draft_is_overwritten_in_place(tiny_llama_target, row_pool):
    """The cache is written in place: over a batch whose rows reject drafts and finish at different times, its
    buffers are never reallocated after the first round, and each row's length is its committed tokens but the last
    (what it keeps, never what it was fed)."""
    target = tiny_llama_target
    prompts = _prompts(target, 4)
    drafters = [
        row_pool["prompt_lookup"],
        row_pool["suffix"],
        row_pool["autoregressive"],
        row_pool["scripted_2"],
    ]
    spec = _spec(target, max_new_tokens=24, draft_length=6, eos=False)
    rows = Rows(target)
    seen = []
    original = BatchedLM.keep_slots

    def watching(self, kept):
        original(self, kept)
        if self is rows.lm:
            buffers = [layer.buffers[0] for layer in self.cache.layers]
            seen.append(([b.data_ptr() for b in buffers], self.lengths))

    mp = pytest.MonkeyPatch()
    mp.setattr(BatchedLM, "keep_slots", watching)
    try:
        result = decode_batch(target, drafters, prompts, spec, torch.Generator(), verifier=rows)
    finally:
        mp.undo()
    assert (
        sum(r.drafted - r.accepted for g in result.generations for r in g.rounds) > 0
    )  # drafts were rejected
    pointers = [p for p, _ in seen]
    assert len(seen) > 10 and all(
        p == pointers[1] for p in pointers[1:]
    )  # one allocation after the first round
    first = seen[0][
        1
    ]  # after the first round every row holds its prompt and that round's output, but the last
    assert first == [len(p) - 1 + g.rounds[0].emitted for p, g in zip(prompts, result.generations)]


def test_what_cannot_batch_yet_is_refused_before_any_forward(
    tiny_llama_target, tiny_t5_target, tiny_llama_pool
):
    target = tiny_llama_target
    prompts = _prompts(target, 2)
    rng = torch.Generator().manual_seed(0)
    rows = Rows(target)
    with pytest.raises(SpecbenchError, match="cannot draft in a batch yet") as err:
        decode_batch(
            target, [OwnKind(), tiny_llama_pool["prompt_lookup"]], prompts, _spec(target), rng, verifier=rows
        )
    assert "decoding.batch_size=1" in err.value.fix
    tree = with_tree(copy.copy(tiny_llama_pool["hf"]), {"width": 2, "nodes": 4}, "hf")
    with pytest.raises(SpecbenchError, match="dynamic tree") as err:
        decode_batch(
            target, [tree, tiny_llama_pool["prompt_lookup"]], prompts, _spec(target), rng, verifier=rows
        )
    assert "tree=null" in err.value.fix
    assert rows.lm.rows == 0  # nothing was prefilled
    with pytest.raises(SpecbenchError, match="decoder-only"):
        BatchedLM(tiny_t5_target.model)


class OwnKind(Drafter):
    """A drafter kind of its own that does not say how to draft per row: the protocol's default ``for_row`` refuses it."""

    name = "own"

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset(), stop_below=0.0) -> Draft:
        return Draft([], None)


def _shared_rounds(drafter, target, query, forwards=None) -> None:
    """Three rows of ``drafter`` drafting through its shared rows (``cohort``, a view a row) over rounds in which some rows draft
    and others do not, whose drafts are partly accepted (the cache cut back) or whose rows commit another drafter's
    tokens (caught up several at once), and after a row finishes: every draft equals the drafter's own draft of the
    same committed tokens alone (synced with ``query(tokens)``), tokens and distributions; ``forwards``, when given,
    counts the forwards of one round (what it holds is cleared before each round and checked after it: 4 for 4
    draft tokens, whatever the rows)."""
    greedy, rng = SamplingParams(), torch.Generator().manual_seed(0)
    seqs = [list(p) for p in _prompts(target, 3)]
    cohort = drafter.cohort()
    views = [cohort.view(s) for s in seqs]
    shared = views[0].shared_rows
    assert all(v.shared_rows is shared for v in views) and len(views) == 3
    for rnd, drafting in enumerate([[0, 2], [0, 1, 2], [1], [0, 2], [0, 2]]):
        if rnd == 3:
            views[1].finish()  # row 1 leaves: the cache drops it at the next draft
        for i in drafting:
            views[i].sync(query(seqs[i]), seqs[i])
        if forwards is not None:
            forwards.clear()
        drafts = shared.propose(
            [views[i] for i in drafting], [seqs[i] for i in drafting], [4] * len(drafting), greedy, rng
        )
        assert forwards is None or len(forwards) == 4, rnd  # a catch-up and 3 feeds
        for i, made in zip(drafting, drafts):
            drafter.sync(query(seqs[i]), seqs[i])
            alone = drafter.propose(seqs[i], 4, greedy, rng)
            assert made.tokens == alone.tokens and len(made.tokens) == 4, (rnd, i)
            assert torch.allclose(made.probs, alone.probs, atol=1e-5)
            seqs[i] += made.tokens[: 1 + rnd % 3] + [
                (made.tokens[-1] + 1) % target.vocab_size
            ]  # partly accepted
        for i in {0, 1, 2} - set(drafting) - ({1} if rnd >= 3 else set()):
            seqs[i] += [5, 6, 7]  # committed by another drafter: caught up at its next draft
    assert shared.lm.rows == 2


def test_model_rows_draft_what_the_drafter_drafts_alone(tiny_llama_target, tiny_llama_pool):
    """One batched cache for three rows of the tiny HF drafter (``drafters/batched.py``): every draft equals the
    drafter's own alone, over the rounds of ``_shared_rounds``."""
    from specbench.decoding.drafter import DecodeContext

    _shared_rounds(tiny_llama_pool["hf"], tiny_llama_target, lambda seq: DecodeContext())


def test_head_rows_draft_what_the_head_drafts_alone_in_one_forward_a_position(tiny_llama_target, tmp_path):
    """One batched cache of an EAGLE head's pairs for three rows (``HeadRows``), each row fed its own target states:
    every draft equals the head's own alone, over the rounds of ``_shared_rounds``, and each round runs the head's
    stack once a draft position for all the rows that draft (a catch-up, then one forward a draft token after the
    first), not once a row."""
    from specbench.decoding.drafter import DecodeContext
    from specbench.drafters import build_pool
    from tests.integration.test_eagle import write_head

    target = tiny_llama_target
    spec = {"_target_": "specbench.drafters.eagle.build", "checkpoint": str(write_head(tmp_path, target))}
    head = build_pool(target, {"eagle": spec})["eagle"]
    layers = head.state_layers(False)

    def query(seq):  # the row's committed target states, as the batch records them
        q = DecodeContext()
        q.record_states(target.prefill(seq, layers=layers).states, rows=len(seq) - 1, start=0)
        return q

    calls: list[int] = []
    hook = head.head.stack.register_forward_hook(lambda *_: calls.append(1))
    try:
        _shared_rounds(head, target, query, calls)
    finally:
        hook.remove()


def test_a_model_drafters_rows_accept_what_they_accept_alone(tiny_llama_target, row_pool, tiny_decode):
    """Two rows drafting with the same HF drafter in one forward a position, beside rows of other drafters: each row's
    output, and each round's drafted and accepted tokens, equal its prompt decoded alone."""
    target = tiny_llama_target
    spec = _spec(target, draft_length=3)
    arms = ("hf", "prompt_lookup", "hf", "early_exit")
    prompts = _prompts(target, 4)
    result = decode_batch(target, [row_pool[a] for a in arms], prompts, spec, torch.Generator())
    _rounds_as_alone(target, row_pool, arms, prompts, result, tiny_decode, spec)


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_a_batch_prefill_embeds_each_prompt_as_the_target_prefill_does(tiny_llama_target, pooling):
    """``BatchedLM.start`` with a pooling: each row's embedding is ``Target.prefill``'s for its prompt alone, and the
    batch then scores as a batch started without one (the last prompt token's slot is given back, as it is fed
    again)."""
    target = tiny_llama_target
    prompts = _prompts(target, 3)
    plain, embedded = BatchedLM(target.model, target.vocab_size), BatchedLM(target.model, target.vocab_size)
    assert plain.start(prompts).embeddings is None
    got = embedded.start(prompts, pooling).embeddings
    for prompt, emb in zip(prompts, got):
        alone = target.prefill(prompt, embedding=pooling).embedding
        assert torch.allclose(emb, alone, atol=1e-5)
    inputs = [p[-1:] + [5, 6] for p in prompts]
    assert torch.allclose(embedded.score(inputs), plain.score(inputs), rtol=1e-4, atol=1e-4)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to fp32 rounding at the tensors' own scale (the residual stream of the tiny models runs to hundreds)."""
    return a.shape == b.shape and float((a - b).abs().max()) <= 1e-5 * float(b.abs().max()) + 1e-5


def test_a_batch_records_each_rows_target_states_as_the_target_does(tiny_llama_target):
    """``BatchedLM.start`` and ``score`` with layers: each row's states at its cached prompt positions, and at the
    positions a round scores, are ``Target.prefill``'s and ``Target.score``'s for that row alone."""
    target = tiny_llama_target
    layers = (1, int(target.config.num_hidden_layers))
    prompts = _prompts(target, 3)
    lm = BatchedLM(target.model, target.vocab_size)
    started = lm.start(prompts, layers=layers)
    inputs = [p[-1:] + [5, 6] for p in prompts]
    lm.score(inputs, layers)
    for r, prompt in enumerate(prompts):
        pre = target.prefill(prompt, layers=layers).states
        scored = target.score([5, 6], layers=layers).states
        for layer in layers:
            assert started.states[r][layer].shape[0] == len(prompt) - 1
            assert _close(started.states[r][layer], pre[layer])
            assert _close(lm.last_states[layer][r], scored[layer])


@pytest.mark.parametrize("rows", [None, 2])
def test_draft_heads_draft_each_row_as_they_draft_alone(
    tiny_llama_target, row_pool, tiny_decode, tmp_path, rows
):
    """Two rows of an EAGLE head (one batched cache of the head's pairs, each row fed its own target states) beside
    prompt lookup and the autoregressive arm, all at once or two at a time (a head row that joins later is fed the
    target states of its own prefill): every row's output, and each round's drafted and accepted tokens, equal its
    prompt alone."""
    from specbench.drafters import build_pool
    from tests.integration.test_eagle import PROMPTS, write_head

    target = tiny_llama_target
    head = write_head(tmp_path, target, "head")
    pool = {
        **build_pool(
            target, {"eagle": {"_target_": "specbench.drafters.eagle.build", "checkpoint": str(head)}}
        ),
        "prompt_lookup": row_pool["prompt_lookup"],
    }
    spec = _spec(target, draft_length=3)
    arms = ("eagle", "prompt_lookup", "eagle", "autoregressive")
    prompts = [target.tokenizer(t)["input_ids"] for t in (PROMPTS[0], TEXTS[1], PROMPTS[1], TEXTS[3])]
    result = decode_batch(target, [pool[a] for a in arms], prompts, spec, torch.Generator(), rows=rows)
    _rounds_as_alone(target, pool, arms, prompts, result, tiny_decode, spec)
    assert (
        sum(r.accepted for g in result.generations[::2] for r in g.rounds) > 0
    )  # the heads' drafts were kept


def _policy(tmp_path, target, arms: list[str], seed: int) -> str:
    """A random policy checkpoint over ``arms`` for the tiny target (mean-pooled prompt embeddings)."""
    from specbench.policy.checkpoint import save_checkpoint
    from specbench.policy.model import Policy
    from specbench.policy.net import PolicyNet

    dim = int(target.model.config.hidden_size)
    net = PolicyNet(dim, len(arms), generator=torch.Generator().manual_seed(seed))
    policy = Policy(model=net, mean=torch.zeros(dim), std=torch.ones(dim), arms=arms)
    embedding = {
        "pooling": "mean",
        "source": "decoder_last_hidden",
        "dim": dim,
        "target": "embedded:tiny_llama",
    }
    return str(
        save_checkpoint(tmp_path / "policy.pt", policy, arms=arms, alpha=0.5, config={}, embedding=embedding)
    )


@pytest.mark.parametrize("rows", [None, 2])
def test_the_policy_chooses_each_rows_drafter_as_it_does_alone(
    tiny_llama_target, row_pool, tiny_decode, tmp_path, rows
):
    """The policy per row (a ``PolicySelector`` a row): each row's prompt embedding comes off its own prefill, so each
    row plays the arm the policy picks for its prompt alone, and gives its output."""
    from specbench.selection import PolicySelector

    target = tiny_llama_target
    spec = _spec(target)
    pool = {a: row_pool[a] for a in ("autoregressive", "prompt_lookup", "scripted_2", "hf")}
    path = _policy(
        tmp_path, target, list(pool), seed=18
    )  # a seed whose policy sends the 4 prompts to 4 drafters
    prompts = _prompts(target, 4)
    players = [Player(PolicySelector(list(pool), checkpoint=path), pool) for _ in prompts]
    result = decode_batch(target, players, prompts, spec, torch.Generator(), rows=rows)
    chosen = []
    for prompt, gen in zip(prompts, result.generations):
        alone = _alone_gen(
            target, pool, PolicySelector(list(pool), checkpoint=path), prompt, tiny_decode, spec
        )
        assert gen.tokens == alone.tokens
        assert [r.arm for r in gen.rounds] == [r.arm for r in alone.rounds]
        chosen.append(gen.rounds[0].arm)
    assert len(set(chosen)) > 1  # the rows' prompts led the policy to different drafters


def test_a_tree_draft_is_cut_to_its_first_path():
    tree = Draft(tokens=[5, 6, 7, 8, 9], probs=None, parents=[-1, 0, 0, 1, 3])
    assert first_path(tree).tokens == [5, 6, 8, 9] and first_path(tree).parents is None
    chain = Draft(tokens=[1, 2], probs=None)
    assert first_path(chain) is chain


FLAT = ForwardCosts(
    (1, 8), (1, 16), ((1.0, 1.0), (1.0, 1.0))
)  # every token free: the budget verifies whole drafts
STEEP = ForwardCosts((1, 8), (1, 16), ((1.0, 16.0), (8.0, 128.0)))  # every token a step: it drafts nothing


def test_the_batch_budget_keeps_every_row_lossless_and_cuts_as_its_costs_say(
    tiny_llama_target, row_pool, tiny_decode
):
    target = tiny_llama_target
    spec = _spec(target, draft_length=5)
    arms = ("scripted_2", "prompt_lookup", "scripted_5", "suffix")
    prompts = _prompts(target, 4)
    drafters = [row_pool[a] for a in arms]

    def run(costs):
        return decode_batch(
            target, drafters, prompts, spec, torch.Generator().manual_seed(0), BatchBudget(costs)
        )

    whole = decode_batch(target, drafters, prompts, spec, torch.Generator().manual_seed(0))
    flat, steep = run(FLAT), run(STEEP)
    for arm, prompt, a, b, c in zip(arms, prompts, whole.generations, flat.generations, steep.generations):
        alone = _alone(target, row_pool, arm, prompt, tiny_decode, spec)
        assert a.tokens == b.tokens == c.tokens == alone, arm
        if (
            arm != "suffix"
        ):  # free tokens: no chain cut (the retrieval drafter's trees are planned as first paths)
            assert [r.drafted for r in b.rounds] == [r.drafted for r in a.rounds]
        assert all(r.drafted == 0 for r in c.rounds)  # a step a token: no draft ever pays
        assert all(r.expected is not None and r.predicted_s > 0 for r in b.rounds + c.rounds)
    assert steep.forwards == max(len(g.tokens) for g in steep.generations)  # plain batched greedy decoding

    def calls(result):
        return sum(g.target_calls for g in result.generations)

    assert calls(flat) == calls(whole) < calls(steep)


class Counted(PromptLookup):
    """Prompt lookup that counts its drafts (one count shared by its rows), or that gives scores it does not
    declare (``scores``)."""

    def __init__(self, calls: list[int], scores: bool = False):
        super().__init__("counted", max_ngram=3)
        self.calls, self.scores = calls, scores

    def for_row(self) -> Counted:
        return Counted(self.calls, self.scores)

    def propose(self, tokens, k, sampling, rng, eos_ids=frozenset(), stop_below=0.0) -> Draft:
        self.calls[0] += 1
        made = super().propose(tokens, k, sampling, rng, eos_ids, stop_below)
        return Draft(made.tokens, made.probs, scores=[0.5] * len(made.tokens)) if self.scores else made


def test_no_row_drafts_in_a_round_where_no_cap_could_pay(tiny_llama_target, row_pool, tiny_decode):
    """Where the budget knows before drafting that no cap could pay (``BatchBudget.may_draft``), no row drafts:
    the drafting's time is saved and the outputs stay every row's own; where tokens are free, every row drafts."""
    target = tiny_llama_target
    spec = _spec(target, draft_length=5)
    prompts = _prompts(target, 4)

    def run(costs):
        calls = [0]
        out = decode_batch(
            target, [Counted(calls)] * 4, prompts, spec, torch.Generator().manual_seed(0), BatchBudget(costs)
        )
        return out, calls[0]

    (steep, steep_calls), (flat, flat_calls) = run(STEEP), run(FLAT)
    for prompt, a, b in zip(prompts, steep.generations, flat.generations):
        assert a.tokens == b.tokens == _alone(target, row_pool, "prompt_lookup", prompt, tiny_decode, spec)
        assert all(r.t_draft == 0.0 and r.n_max > 0 for r in a.rounds[:-1])
    assert steep_calls == 0
    assert flat_calls == sum(1 for g in flat.generations for r in g.rounds if r.n_max > 0) > 0


def test_a_drafter_that_scores_without_declaring_it_is_refused_under_a_budget(tiny_llama_target):
    target = tiny_llama_target
    with pytest.raises(SpecbenchError, match="scored = True"):
        decode_batch(
            target,
            [Counted([0], scores=True)] * 2,
            _prompts(target, 2),
            _spec(target),
            torch.Generator(),
            BatchBudget(FLAT),
        )


def test_each_row_chooses_its_drafter_with_its_own_selector(tiny_llama_target, row_pool, tiny_decode):
    """Per-row selection (a ``Player`` a row): four rows, each with its own UCB over the same pool, switch drafters
    from round to round; every row still equals its prompt decoded alone, and each row's selector learned from
    that row's rounds alone."""
    from specbench.selection import UCB

    target = tiny_llama_target
    spec = _spec(target, draft_length=4)
    pool = {a: row_pool[a] for a in ("autoregressive", "prompt_lookup", "scripted_2", "scripted_5")}
    prompts = _prompts(target, 4)
    players = [Player(UCB(list(pool)), pool) for _ in prompts]
    result = decode_batch(target, players, prompts, spec, torch.Generator().manual_seed(0))
    for prompt, gen, player in zip(prompts, result.generations, players):
        assert gen.tokens == _alone(target, row_pool, "autoregressive", prompt, tiny_decode, spec)
        arms = [r.arm for r in gen.rounds]
        assert len(set(arms)) > 1 and sum(r.switched for r in gen.rounds) > 0
        assert sum(player.selector.counts) == len(gen.rounds)  # one update a round of this row
        assert [r.switched for r in gen.rounds] == [i > 0 and a != arms[i - 1] for i, a in enumerate(arms)]


def test_each_row_routes_as_its_router_routes_alone(tiny_llama_target, row_pool, tiny_decode):
    """Per-row routing: four rows, each with its own router (prompt lookup's draft when it matched two tokens, else a
    UCB's fallback among the scripted drafters and the autoregressive arm); every row's output, and each round's arm,
    drafted and accepted tokens, equal its prompt decoded alone by a router of its own; both the lookup's and the
    fallbacks' drafts played."""
    from specbench.selection import Router

    target = tiny_llama_target
    spec = _spec(target, draft_length=4)
    pool = {a: row_pool[a] for a in ("autoregressive", "prompt_lookup", "scripted_2", "scripted_5")}
    prompts = _prompts(target, 4)

    def router():
        return Router(list(pool), lookup="prompt_lookup", min_match=2)

    players = [Player(router(), pool) for _ in prompts]
    result = decode_batch(target, players, prompts, spec, torch.Generator().manual_seed(0))
    played = set()
    for prompt, gen in zip(prompts, result.generations):
        alone = _alone_gen(target, pool, router(), prompt, tiny_decode, spec)
        assert gen.tokens == alone.tokens
        assert [(r.arm, r.drafted, r.accepted) for r in gen.rounds] == [
            (r.arm, r.drafted, r.accepted) for r in alone.rounds
        ]
        played |= {r.arm for r in gen.rounds}
    assert "prompt_lookup" in played and played & {"scripted_2", "scripted_5", "autoregressive"}


@pytest.mark.parametrize(
    "members, rows", [(("scripted_2", "scripted_5"), None), (("prompt_lookup", "scripted_5", "suffix"), 2)]
)
def test_each_rows_token_tree_verifies_as_it_does_alone(
    tiny_llama_target, row_pool, tiny_decode, members, rows
):
    """Per-row token trees (``tree:<a>+<b>``: a ``FixedTree`` a row, each round its members' drafts merged into one
    trie that the batch's forward verifies with the row's own tree mask and depths): every row's output, and each
    round's label, tree size and accepted tokens, equal its prompt decoded alone by the loop's tree rounds; the
    members' own accepted lengths too; all at once, or two in flight (tree rows joining as others finish, each tree's
    accepted path moved into place in its row of the cache)."""
    from specbench.selection import FixedTree

    target = tiny_llama_target
    spec = _spec(target, draft_length=4)
    pool = {a: row_pool[a] for a in ("autoregressive", *members)}
    prompts = _prompts(target, 4)
    players = [Player(FixedTree(list(pool), list(members)), pool) for _ in prompts]
    result = decode_batch(target, players, prompts, spec, torch.Generator().manual_seed(0), rows=rows)
    sizes = []
    for prompt, gen in zip(prompts, result.generations):
        alone = _alone_gen(target, pool, FixedTree(list(pool), list(members)), prompt, tiny_decode, spec)
        assert gen.tokens == alone.tokens
        assert [(r.arm, r.drafted, r.accepted, r.tree_size, r.member_accepted) for r in gen.rounds] == [
            (r.arm, r.drafted, r.accepted, r.tree_size, r.member_accepted) for r in alone.rounds
        ]
        sizes += [r.tree_size for r in gen.rounds]
    assert max(sizes) > 4  # trees of more than one chain's tokens were verified


def test_a_rows_cost_model_plan_builds_its_round_as_it_does_alone(tiny_llama_target, row_pool, tiny_decode):
    """A cost-model plan per row (one engine: a row's round is built as alone; that a batch does not run the budget
    selector is said by the run's settings, ``pipelines/batch_settings.py``): each row drafts the plan's drafters,
    keeps what it prunes, and gives its prompt's output alone."""
    from specbench.selection.base import Plan, Selector

    class Planner(Selector):
        def select(self):
            return Plan(
                ("prompt_lookup",),
                lambda drafts: ("suffix",),
                lambda drafts, greedy: {m: range(min(2, len(d.tokens))) for m, d in drafts.items()},
                lambda: (1.0, 0.5),
            )

    target = tiny_llama_target
    spec = _spec(target)
    pool = {a: row_pool[a] for a in ("autoregressive", "prompt_lookup", "suffix")}
    prompts = _prompts(target, 3)
    result = decode_batch(
        target, [Player(Planner(list(pool)), pool) for _ in prompts], prompts, spec, torch.Generator()
    )
    for prompt, gen in zip(prompts, result.generations):
        alone = _alone_gen(target, pool, Planner(list(pool)), prompt, tiny_decode, spec)
        assert gen.tokens == alone.tokens
        assert [(r.arm, r.drafted, r.accepted) for r in gen.rounds] == [
            (r.arm, r.drafted, r.accepted) for r in alone.rounds
        ]
        assert all(r.drafted <= 4 and r.expected == 1.0 for r in gen.rounds)
