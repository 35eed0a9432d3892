"""The target model: the distribution speculative decoding must reproduce.

State between rounds: ``tokens`` is the committed decoder sequence (prompt + output for
decoder-only models, start token + output for encoder-decoder ones). The cache holds every
committed token except the last, which is fed at the head of the next ``score`` call together with
the draft, so one forward yields the k+1 distributions verification needs (the last one is the
bonus position). An autoregressive step is ``score([])``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Protocol

import torch

from specbench.errors import SpecbenchError
from specbench.models.cache import CachedLM
from specbench.models.loading import LoadedModel
from specbench.validate import MAX_TIE_TOLERANCE, each, integer, list_of, nested, number, text


@dataclass(frozen=True, kw_only=True)
class PromptSettings:
    """target.prompt.*: how a query becomes the model's input (tasks.Prompter)."""

    style: Annotated[str, text()]
    templates: Annotated[str, text()]  # a template set of conf/templates/ (TemplateSets)
    system: Annotated[str | None, text(null=True)]
    chat_template: Annotated[str | None, text(null=True)]


@dataclass(frozen=True, kw_only=True)
class TargetSettings:
    """target.* (conf/target/, which holds the defaults): what the session opens the target with (pipelines/session:
    load_inputs, Context, the tie tolerance)."""

    model: Annotated[str, text()]
    dtype: Annotated[str | None, text(null=True)]
    device: Annotated[str | None, text(null=True)]
    layers_key: Annotated[str, text()]  # the model-config field holding the layer count (early exits)
    final_norm: Annotated[
        str, text()
    ]  # the final norm's module path (early exits read layer states through it)
    head_scale: Annotated[float, number(low=0, low_open=True)]
    context_keys: Annotated[
        list[str], list_of(text())
    ]  # model-config fields holding the context length ([]: T5)
    context_limit: Annotated[
        int | None, integer(1, null=True, note=" (positions, for models whose config sets no hard limit)")
    ]
    # the largest logit gap a bf16/fp32 rounding can make, per dtype: forks within it are ties, beyond it defects
    tie_tolerance: Annotated[
        dict[str, float] | None,
        each(
            number(
                0,
                MAX_TIE_TOLERANCE,
                low_open=True,
                null=True,
                note=" (logit units; `specbench profile` measures it: about 1 in bf16, 1e-4 in "
                "fp32; a larger one would call real defects ties)",
            ),
            null=True,
            note=" (e.g. {float32: 1.0e-4, bfloat16: 1.0})",
            expect="a mapping of dtype to tolerance",
        ),
    ]
    prompt: Annotated[PromptSettings, nested(PromptSettings)]


@dataclass(frozen=True, kw_only=True)
class TemplateSets:
    """templates.*.* (conf/templates/): the template sets target.prompt.templates picks from, a template per task
    kind."""

    templates: Annotated[dict[str, dict[str, str]], each(each(text()))]


class TreeShape(Protocol):
    """What a tree forward needs of a trie of drafts (``decoding.tree.TokenTree`` is one): its node tokens, whether
    it is one path, and its attention mask and row depths (models stays below decoding: no import of it)."""

    tokens: tuple[int, ...]

    @property
    def is_chain(self) -> bool: ...

    def attention(self) -> torch.Tensor: ...

    def positions(self) -> list[int]: ...


POOLINGS = ("mean", "last")


def check_pooling(pooling: str | None) -> None:
    if pooling is not None and pooling not in POOLINGS:
        raise SpecbenchError(f"unknown embedding pooling '{pooling}'", f"use one of: {', '.join(POOLINGS)}")


@dataclass(frozen=True)
class Forward:
    """What a target forward returns (``Target.prefill``, ``Target.score``): one type, whatever was asked for.

    ``logits``: ``[positions, V]`` (None for a prefill, which scores nothing); ``states``: ``{layer: [positions,
    H]}``, the residual stream after that many layers, for the layers asked for (empty otherwise);
    ``embedding``: the query's pooled embedding, for a prefill asked for one (else None)."""

    logits: torch.Tensor | None
    states: dict[int, torch.Tensor] = field(default_factory=dict)
    embedding: torch.Tensor | None = None


def pool_states(states: torch.Tensor, pooling: str) -> torch.Tensor:
    """``[n, H]`` -> ``[H]`` float32: the mean over positions, or the last position."""
    return (states.mean(dim=0) if pooling == "mean" else states[-1]).float()


class Target:
    def __init__(self, loaded: LoadedModel):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.config = loaded.model.config
        head = self.model.get_output_embeddings().weight
        self.vocab_size = int((head() if callable(head) else head).shape[0])  # callable: a dynamic-int8 head
        self.lm = CachedLM(self.model, vocab_size=self.vocab_size)
        self.device = self.lm.device
        self.is_encoder_decoder = self.lm.is_encoder_decoder
        self.tokens: list[int] = []
        self.encoder_ids: list[int] | None = None
        self.calls = 0

    def decoder_start(self, prompt_ids: list[int]) -> tuple[list[int] | None, list[int]]:
        """Split a tokenized prompt into (encoder ids, initial decoder tokens)."""
        if self.is_encoder_decoder:
            start = self.config.decoder_start_token_id
            if start is None:
                start = self.config.pad_token_id
            return list(prompt_ids), [int(start)]
        return None, list(prompt_ids)

    def prefill(self, prompt_ids: list[int], embedding: str | None = None, layers: tuple[int, ...] = ()):
        """Start a query: encode (encoder-decoder) and cache every prompt token but the last.

        Returns a ``Forward`` without logits. With ``embedding`` (a pooling), its ``embedding`` is the
        query's, equal to ``embed(prompt_ids, embedding)`` but read off the prefill itself: the encoder
        output, or the final hidden states of a forward over every prompt token (the last one is then
        cropped from the cache, since ``score`` feeds it again), so a context-aware selector costs one
        extra token position rather than a second pass over the prompt. With ``layers``, its ``states``
        are ``{layer: [len(tokens) - 1, H] states at the cached positions}``.
        """
        check_pooling(embedding)
        encoder_ids, tokens = self.decoder_start(prompt_ids)
        if not tokens:
            raise ValueError("empty prompt")
        self.lm.reset(encoder_ids)
        self.encoder_ids = encoder_ids
        self.tokens = tokens
        self.calls = 0
        states = None
        if embedding is not None and not self.is_encoder_decoder:
            _, states = self.lm.forward(tokens, last_only=True, hidden=True)
            self.lm.crop(len(tokens) - 1)
            pooled = pool_states(states[-1], embedding)  # the final (normed) states, as last_hidden_state
        else:
            if len(tokens) > 1:
                fed = self.lm.forward(tokens[:-1], last_only=True, hidden=bool(layers))
                states = fed[1] if layers else None
            pooled = (
                None
                if embedding is None
                else pool_states(self.lm.encoder_outputs.last_hidden_state[0], embedding)
            )
        n = len(tokens) - 1
        return Forward(
            None,
            {
                int(layer): (states[layer][:n] if states is not None else self._no_states(layer))
                for layer in layers
            },
            pooled,
        )

    def _no_states(self, layer: int) -> torch.Tensor:
        width = getattr(self.config, "d_model", None) or self.config.hidden_size
        return torch.zeros(0, width, device=self.device)

    @property
    def encoder_outputs(self):
        """The encoder's output for the current query (encoder-decoder targets; None otherwise)."""
        return self.lm.encoder_outputs

    def score(self, draft: list[int], hidden: bool = False, layers: tuple[int, ...] = ()):
        """One forward over [last committed token, *draft]: a ``Forward`` whose logits are ``[len(draft) + 1, V]``.

        With ``layers``, its ``states`` are ``{l: the residual stream after l layers at the same positions}``
        for those layers; with ``hidden``, for every layer. Without either the forward computes no hidden
        states at all.
        """
        self.calls += 1
        ids = self.tokens[-1:] + list(draft)
        if not (layers or hidden):
            return Forward(self.lm.forward(ids))
        logits, states = self.lm.forward(ids, hidden=True)
        keep = range(len(states)) if hidden else layers
        return Forward(logits, {int(layer): states[layer] for layer in keep})

    def score_tree(self, tree: TreeShape, layers: tuple[int, ...] = ()):
        """One forward over [last committed token, *tree nodes] with the tree's attention mask and depths:
        a ``Forward`` whose logits (and ``states`` for ``layers``) are ``[tree.size + 1, ...]``, row ``1 + i``
        for node ``i``. A trie that is one path is scored as an ordinary chain (the same rows). Decoder-only
        targets only: an encoder-decoder decoder places its tokens by cache position, not ``position_ids``."""
        if tree.is_chain:
            return self.score(list(tree.tokens), layers=layers)
        if self.is_encoder_decoder:
            raise SpecbenchError(
                "tree verification needs a decoder-only target; this one is encoder-decoder "
                f"({type(self.model).__name__} places decoder tokens by cache position, not by "
                "position_ids, so a branch cannot sit at its depth)",
                "verify one draft per round with this target: fixed:<drafter> or a bandit "
                "selector instead of tree:... / tree selectors",
            )
        self.calls += 1
        ids = self.tokens[-1:] + list(tree.tokens)
        mask, depths = tree.attention(), tree.positions()
        if not layers:
            return Forward(self.lm.forward(ids, tree=mask, depths=depths))
        logits, states = self.lm.forward(ids, hidden=True, tree=mask, depths=depths)
        return Forward(logits, {int(layer): states[layer] for layer in layers})

    def commit_tree(self, path: tuple[int, ...], new_tokens: list[int]) -> None:
        """Append a tree round's output (the accepted ``path``'s tokens and the bonus token): the cache keeps
        the committed positions and the path's nodes, moved into place; the other branches are dropped."""
        root = len(self.tokens) - 1  # cache position of the last committed token, the tree's root
        self.lm.keep_positions(root + 1, [root + 1 + n for n in path])
        self.commit(new_tokens)

    @torch.inference_mode()
    def embed(self, prompt_ids: list[int], pooling: str = "mean") -> torch.Tensor:
        """The query's embedding ``[H]`` (float32): the encoder output (encoder-decoder) or the final
        (normed) hidden states (decoder-only) over the prompt tokens, pooled by ``mean`` or ``last``.
        One forward of its own: it leaves the decoding state (cache, tokens) untouched."""
        check_pooling(pooling)
        x = torch.tensor([list(prompt_ids)], device=self.device)
        if self.is_encoder_decoder:
            states = self.model.get_encoder()(input_ids=x).last_hidden_state[0]
        else:
            states = self.model.base_model(input_ids=x, use_cache=False).last_hidden_state[0]
        return pool_states(states, pooling)

    def commit(self, new_tokens: list[int]) -> None:
        """Append the round's output; roll the cache back to the accepted prefix."""
        self.tokens.extend(new_tokens)
        self.lm.keep_common(self.tokens, len(self.tokens) - 1)

    def rollback(self, n_tokens: int) -> None:
        """Forget the last ``n_tokens`` committed tokens (cache cropped to match)."""
        del self.tokens[len(self.tokens) - n_tokens :]
        self.lm.crop(min(len(self.lm.cached), len(self.tokens) - 1))
