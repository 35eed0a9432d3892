"""One copy of the cache per forward (issue 68): the attention that packs grouped K/V heads equals transformers'
``repeat_kv`` attention within 1e-5 in fp32 and never expands K and V; the cache written in place scores as
transformers' ``DynamicCache`` through appends, crops and a tree path moved into place; a batch's buffers are
allocated once and reused; logits are computed at real positions only; and a model that does not honour per-row
positions and the 4D mask is refused by name."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM
from transformers.integrations import sdpa_attention

from specbench.errors import SpecbenchError
from specbench.models.attention import PACKED, pack, packed_sdpa
from specbench.models.batched import BatchedLM
from specbench.models.cache import CachedLM
from specbench.models.frontier import FrontierCache
from specbench.models.tiny import build_tiny


class Grouped(torch.nn.Module):
    num_key_value_groups = 3
    is_causal = True


def _mask(allowed: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    mask = torch.zeros(allowed.shape, dtype=dtype)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)


@pytest.mark.parametrize("b, q, kv", [(1, 5, 40), (3, 4, 17), (2, 1, 9), (4, 8, 64)])
@pytest.mark.parametrize("kind", ["additive", "bool"])
def test_packed_attention_equals_repeat_kv_within_1e_5(b, q, kv, kind, monkeypatch):
    gen = torch.Generator().manual_seed(b * 100 + q)
    query = torch.randn(b, 9, q, 16, generator=gen)
    key, value = torch.randn(b, 3, kv, 16, generator=gen), torch.randn(b, 3, kv, 16, generator=gen)
    allowed = torch.rand(b, 1, q, kv, generator=gen) > 0.3
    allowed[..., 0] = True  # every query sees something
    mask = _mask(allowed) if kind == "additive" else allowed
    stock, _ = sdpa_attention.sdpa_attention_forward(Grouped(), query, key, value, mask, scaling=0.25)

    def expanded(*args, **kwargs):
        raise AssertionError("packed attention expanded K and V (repeat_kv)")

    monkeypatch.setattr(sdpa_attention, "repeat_kv", expanded)
    ours, _ = packed_sdpa(Grouped(), query, key, value, mask, scaling=0.25)
    assert ours.shape == stock.shape == (b, q, 9, 16)
    assert float((ours - stock).abs().max()) <= 1e-5


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny("tiny_llama")
    assert pack(model) and model.config._attn_implementation == PACKED
    return model


def test_the_cache_written_in_place_scores_as_a_dynamic_cache(tiny):
    """Appends, a crop (a rejected draft), a tree path moved into place, then more appends: the same logits as
    transformers' ``DynamicCache`` (the fallback path) within 1e-5 in fp32."""
    ours, theirs = CachedLM(tiny), CachedLM(tiny)
    assert ours._in_place
    theirs._in_place = False
    ids = list(range(10, 40))
    for lm in (ours, theirs):
        lm.reset()
    steps = [
        lambda lm: lm.forward(ids[:12]),
        lambda lm: lm.forward(ids[12:17]),
        lambda lm: (lm.crop(14), lm.forward(ids[14:16]))[1],
        lambda lm: lm.forward(ids[16:21]),
        lambda lm: (lm.keep_positions(16, [17, 19]), lm.forward(ids[21:24]))[1],
    ]
    for step in steps:
        a, b = step(ours), step(theirs)
        assert float((a - b).abs().max()) <= 1e-5
    assert isinstance(ours.cache, FrontierCache) and ours.cache.lengths == [len(ours.cached)] == [21]


def test_a_batch_allocates_its_buffers_once_and_keeps_lengths(tiny):
    lm = BatchedLM(tiny)
    lm.start([list(range(5, 5 + n)) for n in (9, 4, 13)])
    assert lm.lengths == [8, 3, 12]
    pointers = None
    for r in range(6):
        logits = lm.score([[7, 8, 9], [7], [7, 8, 9, 10, 11]])
        assert logits.shape[:2] == (3, 5)
        assert float(logits[1, 1:].abs().max()) == 0.0  # a padded position gets no logits
        lm.keep_slots([[0, 2], [0], [0, 1, 3]])  # a tree row's path moved into place
        now = [layer.buffers[0].data_ptr() for layer in lm.cache.layers]
        pointers = pointers or now
        assert now == pointers, r
    assert lm.lengths == [8 + 12, 3 + 6, 12 + 18]


def test_logits_at_real_positions_equal_the_models_own(tiny):
    prompts = [list(range(5, 14)), list(range(20, 24))]
    inputs = [[14, 15, 16], [24]]
    got = []
    for split in (True, False):
        lm = BatchedLM(tiny)
        lm._split = None if not split else False  # None: the model's own forward, logits everywhere
        lm.start(prompts)
        got.append(lm.score(inputs))
    assert torch.allclose(got[0][0], got[1][0], atol=1e-5) and torch.allclose(
        got[0][1, :1], got[1][1, :1], atol=1e-5
    )


class Unmasked(LlamaForCausalLM):
    """A model family that ignores the attention mask and positions it is given."""

    def forward(self, *args, **kwargs):
        kwargs.pop("attention_mask", None)
        kwargs.pop("position_ids", None)
        return super().forward(*args, **kwargs)


def test_a_model_that_ignores_the_mask_is_refused_by_name(tiny):
    model = Unmasked(tiny.config).eval()
    model.load_state_dict(tiny.state_dict())
    BatchedLM(tiny).check_rows()  # the real family passes
    with pytest.raises(SpecbenchError, match="Unmasked does not honour per-row positions") as err:
        BatchedLM(model).check_rows()
    assert "decoding.batch_size=1" in err.value.fix
