"""KV-cache bookkeeping: after scoring, committing, rolling back and catching up, cached logits must
equal those of a fresh forward over the whole sequence (no cache)."""

from __future__ import annotations

import pytest
import torch

from specbench.decoding.drafter import DecodeContext
from specbench.decoding.sampling import SamplingParams
from specbench.drafters import ModelDrafter, build_pool
from specbench.drafters.early_exit import truncated_model
from specbench.models import Target

ATOL = 1e-4
RTOL = 1e-4  # logits of ~10 differ by ~1e-4 between cached and uncached fp32 matmuls
PROMPT = "Speculative decoding keeps the target's output."


def fresh_logits(model, encoder_ids, decoder_ids) -> torch.Tensor:
    """Logits ``[len(decoder_ids), V]`` of one uncached forward."""
    with torch.inference_mode():
        if getattr(model.config, "is_encoder_decoder", False):
            out = model(
                input_ids=torch.tensor([encoder_ids]),
                decoder_input_ids=torch.tensor([decoder_ids]),
                use_cache=False,
            )
        else:
            out = model(input_ids=torch.tensor([decoder_ids]), use_cache=False)
    return out.logits[0].float()


def expected_score(target: Target, draft: list[int]) -> torch.Tensor:
    """What ``target.score(draft)`` must return: the rows for [last committed token, *draft]."""
    rows = fresh_logits(target.model, target.encoder_ids, target.tokens + list(draft))
    return rows[-(len(draft) + 1) :]


def assert_close(actual, expected):
    assert actual.shape == expected.shape
    assert torch.allclose(actual, expected, atol=ATOL, rtol=RTOL), float((actual - expected).abs().max())


def argmax_tokens(logits: torch.Tensor) -> list[int]:
    return logits.argmax(-1).tolist()


def test_score_commit_cycles_match_fresh_forward(tiny_setup):
    target = tiny_setup.target
    prompt = tiny_setup.tokenizer(PROMPT)["input_ids"]
    target.prefill(prompt)
    assert target.calls == 0
    # rounds of (draft, how many draft tokens the verifier accepts); rejected tokens are replaced
    rounds = [([5, 6, 7], 0), ([40, 41], 2), ([8, 9, 10, 11], 3), ([], 0), ([70], 1), ([90, 91, 92], 1)]
    for i, (draft, n_accept) in enumerate(rounds):
        logits = target.score(draft).logits
        assert target.calls == i + 1
        assert_close(logits, expected_score(target, draft))
        bonus = (draft[n_accept] + 1) % 200 + 3 if n_accept < len(draft) else 33
        target.commit(draft[:n_accept] + [bonus])
        assert len(target.lm.cached) <= len(target.tokens) - 1
        assert target.lm.cached == target.tokens[: len(target.lm.cached)]
    # the cache still holds the accepted prefix: the next score feeds only the new tokens
    for draft in ([], [12, 13, 14]):
        assert_close(target.score(draft).logits, expected_score(target, draft))
        target.commit([50])


def test_target_scores_like_a_fresh_target(tiny_setup):
    """A Target grown round by round and a fresh Target prefilled with the whole sequence agree."""
    target = tiny_setup.target
    prompt = tiny_setup.tokenizer(PROMPT)["input_ids"]
    target.prefill(prompt)
    for draft, keep in (([20, 21, 22], 2), ([23], 0), ([24, 25], 2)):
        target.score(draft)
        target.commit(draft[:keep] + [60 + keep])
    grown_tokens = list(target.tokens)
    probe = [30, 31, 32]
    grown = target.score(probe).logits

    fresh = Target(target.loaded)
    if fresh.is_encoder_decoder:
        # the decoder sequence is not a prompt: grow it with one uncommitted score of the tail
        fresh.prefill(prompt)
        fresh.score(grown_tokens[1:])
        fresh.commit(grown_tokens[1:])
    else:
        fresh.prefill(grown_tokens)
    assert fresh.tokens == grown_tokens
    assert_close(fresh.score(probe).logits, grown)


def test_rollback_matches_fresh_forward(tiny_setup):
    target = tiny_setup.target
    prompt = tiny_setup.tokenizer(PROMPT)["input_ids"]
    target.prefill(prompt)
    start = len(target.tokens)
    for draft in ([5, 6, 7], [8, 9], [10, 11, 12]):
        target.score(draft)
        target.commit(draft + [99])  # everything accepted plus a bonus token
    assert len(target.tokens) == start + 11
    committed = list(target.tokens)
    for n in (0, 1, 5):
        target.rollback(n)
        assert target.tokens == committed[: len(committed) - n]
        committed = list(target.tokens)
        assert len(target.lm.cached) <= len(target.tokens) - 1
        draft = [44, 45]
        assert_close(target.score(draft).logits, expected_score(target, draft))
        target.commit([46])  # drop the scored draft again, keep one new token
        committed = list(target.tokens)
    # roll back into the prompt region (decoder-only) / back to the start token (encoder-decoder)
    target.rollback(len(target.tokens) - 1)
    assert len(target.tokens) == 1
    assert_close(target.score([3, 4]).logits, expected_score(target, [3, 4]))


@pytest.fixture(scope="module")
def drafter_pool(tiny_setup):
    return {name: d for name, d in tiny_setup.pool.items() if isinstance(d, ModelDrafter)}


def test_pool_has_every_model_drafter(drafter_pool):
    assert set(drafter_pool) == {"quantized_dynamic", "quantized_weight", "early_exit", "hf"}


@pytest.mark.parametrize("name", ["quantized_dynamic", "quantized_weight", "early_exit", "hf"])
def test_drafter_sync_catches_up_after_idle_rounds(tiny_setup, drafter_pool, name):
    """After a draft, a partial acceptance and rounds committed while the drafter was idle, ``sync``
    gives the next-token logits of one uncached forward over the full committed sequence.

    ``dynamic_int8`` quantizes activations per tensor, over every position of one forward, so its
    logits depend on how the sequence was split into forwards (by up to ~2 logits on tiny_llama):
    for it only the cache bookkeeping is checked here (its values are covered by losslessness:
    verification uses the distributions it actually drew from).
    """
    drafter = drafter_pool[name]
    target = tiny_setup.target
    prompt = tiny_setup.tokenizer(PROMPT)["input_ids"]
    encoder_ids, tokens = target.decoder_start(prompt)
    model = drafter.lm.model
    vocab = target.vocab_size
    exact = name != "quantized_dynamic"

    def check(actual, seq, rows=1):
        if exact:
            assert_close(actual, fresh_logits(model, encoder_ids, seq)[-rows:, :vocab].squeeze(0))
        else:
            assert actual.shape[-1] == vocab and torch.isfinite(actual).all()

    drafter.begin(DecodeContext(encoder_ids=encoder_ids))
    # first round: the drafter drafts 4 tokens after the prompt (greedy)
    rng = torch.Generator().manual_seed(0)
    drafter.catch_up(tokens)
    draft = drafter.propose(tokens, 4, SamplingParams(), rng)
    d = draft.tokens
    assert len(d) == 4
    assert draft.probs.shape == (4, vocab)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(4))
    assert drafter.lm.cached == tokens + d[:3]
    assert argmax_tokens(draft.probs) == d
    if exact:
        fresh = fresh_logits(model, encoder_ids, tokens + d[:3])[-4:, :vocab]
        assert argmax_tokens(fresh) == d
        assert torch.allclose(draft.probs, torch.softmax(fresh, -1), atol=1e-5)

    # only 1 draft token accepted, then several rounds committed while this drafter was idle
    committed = tokens + d[:1] + [77, 78, 79, 80, 81]
    check(drafter.lm.sync(committed), committed)
    assert drafter.lm.cached == committed

    # a rollback (shorter sequence) is caught up too, and syncing again changes nothing
    shorter = committed[:-3] + [90]
    check(drafter.lm.sync(shorter), shorter)
    assert drafter.lm.cached == shorter
    check(drafter.lm.sync(shorter), shorter)
    assert drafter.lm.cached == shorter

    # propose on a sequence the drafter has not seen syncs by itself
    longer = shorter + [91, 92]
    draft2 = drafter.propose(longer, 2, SamplingParams(), rng)
    assert drafter.lm.cached == longer + draft2.tokens[:1]
    if exact:
        fresh2 = fresh_logits(model, encoder_ids, longer + draft2.tokens[:1])[-2:, :vocab]
        assert argmax_tokens(fresh2) == draft2.tokens


def test_early_exit_drafter_equals_a_truncated_copy(tiny_setup):
    """The meta-device early-exit model (weights bound to the target's) computes the same function
    as the target's class built normally with its first L layers, final norm and head."""
    target = tiny_setup.target
    key = "num_decoder_layers" if target.is_encoder_decoder else "num_hidden_layers"
    small = truncated_model(target.model, 1, key)
    config = type(target.config).from_dict(target.config.to_dict())
    setattr(config, key, 1)
    reference = type(target.model)(config).eval()
    missing, unexpected = reference.load_state_dict(target.model.state_dict(), strict=False)
    assert not missing
    assert unexpected  # the layers past the first
    # no copy: parameters are the target's tensors
    target_params = {id(p) for p in target.model.parameters()}
    assert all(id(p) in target_params for p in small.parameters())
    assert not any(t.is_meta for t in list(small.parameters()) + list(small.buffers()))
    prompt = tiny_setup.tokenizer(PROMPT)["input_ids"]
    encoder_ids, tokens = target.decoder_start(prompt)
    seq = tokens + [5, 6, 7]
    assert_close(fresh_logits(small, encoder_ids, seq), fresh_logits(reference, encoder_ids, seq))


def test_early_exit_keeps_the_target_intact(tiny_setup, tiny_decode):
    """Building an early-exit drafter must not change the target (shared tensors)."""
    target = tiny_setup.target
    prompt = tiny_setup.tokenizer(PROMPT)["input_ids"]
    encoder_ids, tokens = target.decoder_start(prompt)
    before = fresh_logits(target.model, encoder_ids, tokens + [5, 6])
    head = (
        {"layers_key": "num_decoder_layers", "final_norm": "decoder.final_layer_norm", "head_scale": 0.125}
        if target.is_encoder_decoder
        else {"layers_key": "num_hidden_layers"}
    )
    pool = build_pool(
        target, {"ee": {"_target_": "specbench.drafters.early_exit.build", "layers": 1, **head}}
    )
    tiny_decode(target, pool, "ee", prompt, max_new_tokens=5, draft_length=2)
    assert torch.equal(fresh_logits(target.model, encoder_ids, tokens + [5, 6]), before)
