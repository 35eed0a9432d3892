"""``specbench train-drafter``: a drafter for a given target, trained by distillation from that target.

Data: ``dataset`` (a training split), teacher-forced: prompt (built as ``eval`` builds it) plus the
reference response (``train.responses=reference``, the default) or the target's own greedy
response (``train.responses=target``: batched greedy ``generate``, appended to ``responses.jsonl``
as it goes and reused on a rerun). One target forward per sequence gives the teacher. Two kinds:

- ``drafter.kind=eagle``: a feature-level head from scratch (EAGLE-1 layout, ``drafter.layers``
  decoder layers, ``drafter.vocab`` draft sub-vocabulary), trained on the response positions with
  smooth-L1 on the next feature plus cross-entropy to the target's top-k distribution
  (``drafters/distill.py``); ``train.unroll`` > 1 also trains it on its own predicted features
  (EAGLE-3's training-time test, a loss per step weighted by ``train.unroll_weights``), and
  ``train.feature_noise`` adds uniform noise to its input features while training (EAGLE-1);
- ``drafter.kind=hf``: an existing small causal or seq2seq model (``drafter.model``) sharing the
  target's tokenizer, fine-tuned on the response tokens with ``train.loss`` = ``kl`` (to the
  target's top-k distribution) or ``ce`` (to the text) (``drafters/finetune.py``). The black-box case:
  a 68M Llama per task for Vicuna (MetaSD), T5-small on XSum for T5 (Huang et al.).

Writes into ``out`` (default ``$SPECBENCH_CACHE/drafters/<name>``): the weights (eagle:
``model.safetensors`` + ``config.json`` whose ``specbench`` entry holds the metadata; hf: a
``save_pretrained`` directory + ``specbench.json``), the metadata naming the kind, the target and its
vocabulary fingerprint, the data, the steps (and the sub-vocabulary); ``history.csv``, ``loss.png``,
``metrics.json`` (held-out agreement with the target and expected accepted tokens at draft length 4
on every task of ``eval_sets``; for eagle heads also ``top1_by_depth`` / ``accept_by_depth`` for draft
depths 1-5, on those tasks and on the training split's held-out rows, ``validation``, with their
``definitions``), and ``state.pt`` after every epoch, so an interrupted run resumes to
the same weights as an uninterrupted one.

Any target dtype: the teacher (the target) runs in its own dtype (``target.dtype``, e.g. bfloat16);
the drafter trains in float32 on the teacher's outputs cast to float32 (features, top-k
probabilities; an eagle head scores through a float32 copy of the LM-head rows it uses). The
checkpoint is saved in float32 and its metadata records the teacher's dtype (``dtype``); at decode
time a drafter follows the target's dtype unless its config sets one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from specbench.drafters import distill, finetune
from specbench.drafters.distill import Example, pairs, shared_prefix, sub_vocabulary, teach
from specbench.drafters.eagle import EagleHead, HeadLogits, save_head, vocab_fingerprint
from specbench.drafters.hf import MODEL_META, check_compatible
from specbench.errors import SpecbenchError
from specbench.models import Target, load_model
from specbench.models.loading import cache_dir, make_cache_dir, resolve_dtype
from specbench.pipelines import tables
from specbench.pipelines.prompting import Prompter, eos_ids_of
from specbench.pipelines.run_dir import lock_run_dir, start_run
from specbench.records import JsonlWriter, atomic_path, atomic_write_text, read_jsonl
from specbench.tasks import load_dataset_config, truncate_fields
from specbench.tasks.datasets import load_source

log = logging.getLogger(__name__)


def checkpoint_dir(cfg: DictConfig) -> Path:
    if cfg.get("out"):
        return Path(str(cfg.out))
    name = cfg.get("name") or cfg.dataset.get("name") or "head"
    return cache_dir() / "drafters" / str(name)


# train keys that do not change the weights (how long to run, what to measure afterwards)
UNSIGNED_TRAIN_KEYS = ("epochs", "time_budget_s", "eval_datasets", "generate_batch", "generate_only")
# train keys added after checkpoints were first written, with the value that reproduces the older training:
# a stored signature without one matches a config that leaves it at this value
LATER_TRAIN_KEYS = {"unroll": 1, "unroll_weights": None, "feature_noise": 0.0, "precision": "float32",
                    "prompt_positions": False}


def signature(cfg: DictConfig) -> dict:
    """What must match for a rerun to resume a checkpoint directory (the teacher's dtype included;
    ``train.precision: auto`` resolved, so a resume on another machine sees what it would train in)."""
    plain = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731
    train = {k: v for k, v in plain(cfg.train).items() if k not in UNSIGNED_TRAIN_KEYS}
    if "precision" in train:
        train["precision"] = training_precision(cfg)
    return {"target": str(cfg.target.model), "dtype": target_dtype_name(cfg), "dataset": plain(cfg.dataset),
            "drafter": plain(cfg.drafter), "train": train}


PRECISIONS = ("auto", "float32", "bfloat16")


def training_precision(cfg: DictConfig) -> str:
    """``train.precision``: float32, or bfloat16 (autocast: bf16 matrix products, float32 weights, optimiser
    and losses); auto: bfloat16 when the teacher (the target) runs in bfloat16 (``target.dtype: auto`` picks
    it where the hardware computes it natively), else float32 (an fp32 target trains its drafters in fp32)."""
    value = str(cfg.train.get("precision") or "float32")
    if value not in PRECISIONS:
        raise SpecbenchError(f"train.precision must be one of {', '.join(PRECISIONS)}, got '{value}'",
                             "auto: bf16 autocast where the hardware has native bf16; float32: full precision")
    if value == "auto":
        return "bfloat16" if target_dtype_name(cfg) == "bfloat16" else "float32"
    return value


def target_dtype_name(cfg: DictConfig) -> str:
    """The teacher's dtype as a canonical name (``float32``, ``bfloat16``, ...; ``auto`` resolved)."""
    return str(resolve_dtype(cfg.target.get("dtype"), cfg.target.get("device"))).removeprefix("torch.")


def same_signature(stored: dict, sig: dict) -> bool:
    """``stored`` (a checkpoint's signature.json) matches ``sig``; a signature written before the teacher's
    dtype was part of it (no ``dtype`` key) matches on the rest."""
    if "dtype" not in stored:
        sig = {k: v for k, v in sig.items() if k != "dtype"}
    train = dict(sig.get("train") or {})
    for key, default in LATER_TRAIN_KEYS.items():  # older checkpoints: trained as these defaults train
        if key not in (stored.get("train") or {}) and key in train and train[key] == default:
            del train[key]
    return stored == {**sig, "train": train} if "train" in sig else stored == sig


def examples_of(queries, prompter: Prompter, tokenizer, responses: dict[str, list[int]] | None,
                max_tokens: int, prompt_positions: bool = False) -> list[Example]:
    """Prompt + response sequences; queries without a reference are skipped (logged) with reference responses.
    ``prompt_positions``: the head also learns the prompt tokens after the prompts' shared opening (the chat
    template's fixed system text is learned once per sequence at most, never counted as data)."""
    out = []
    if responses is None:
        missing = [q.id for q in queries if not q.reference]
        if missing and len(missing) == len(queries):
            raise SpecbenchError(f"no query of the dataset has a reference response to train on (e.g. {missing[0]})",
                                 "use a dataset with references, or train.responses=target")
        if missing:
            log.warning("%d of %d queries have no reference response and are skipped", len(missing), len(queries))
        queries = [q for q in queries if q.reference]
    for q in queries:
        prompt = prompter(q)
        if responses is not None:
            response = responses[q.id]
        else:
            response = tokenizer(q.reference, add_special_tokens=False)["input_ids"]
        ids = (prompt + response)[:max_tokens]
        if len(ids) - len(prompt) >= 2:
            out.append(Example(ids=ids, start=len(prompt)))
    if prompt_positions and out:
        fixed = shared_prefix([ex.ids[:ex.start] for ex in out]) if len(out) > 1 else 0
        for ex in out:
            ex.learn = min(fixed + 1, ex.start)
    return out


def learned_tokens(examples: list[Example]) -> int:
    """Tokens the head learns to predict (response tokens, plus prompt tokens with train.prompt_positions)."""
    return int(sum(len(e.ids) - (e.start if e.learn is None else e.learn) for e in examples))


def response_cache(target: Target) -> Path:
    """The target's greedy training answers, shared by every train-drafter run on this target and dtype
    (``$SPECBENCH_CACHE/responses/``): a generalist trained on the specialists' rows generates nothing new."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(target.loaded.name))
    dtype = str(target.model.dtype).removeprefix("torch.")
    return cache_dir() / "responses" / f"{name}-{dtype}-{vocab_fingerprint(target.tokenizer)}.jsonl"


def response_key(prompt: list[int]) -> str:
    return hashlib.sha256(json.dumps(prompt).encode()).hexdigest()[:20]


def cached_answer(record: dict, max_new: int) -> list[int] | None:
    """A cached greedy answer cut to ``max_new`` tokens, when it answers that request: generated with at
    least ``max_new`` new tokens, or finished (EOS) before its own limit; else None."""
    ids, made = record["ids"], int(record["max_new"])
    return ids[:max_new] if made >= max_new or len(ids) < made else None


def target_responses(target: Target, prompter: Prompter, queries, path: Path, max_new: int, eos,
                     batch_size: int = 32) -> dict:
    """The target's greedy answer per query (``max_new`` tokens at most, cut after EOS), keyed by the
    prompt's token ids in the shared cache ``path`` (:func:`response_cache`; a longer cached answer serves a
    shorter request, its greedy prefix: :func:`cached_answer`), appended
    as each batch finishes (resumable; rows another run generated are reused). Batched Hugging Face
    ``generate`` with left padding, the prompts sorted by length (little padding): these are training
    texts, not timed outputs (in bf16 a row's rounding may depend on its batch)."""
    known: dict[str, dict] = {}
    for r in read_jsonl(path):  # the longest answer per prompt
        if "key" in r and int(r["max_new"]) >= int(known.get(r["key"], {}).get("max_new", -1)):
            known[r["key"]] = r
    prompts = {q.id: prompter(q) for q in queries}
    keys = {q.id: response_key(prompts[q.id]) for q in queries}
    done = {}
    for q in queries:
        hit = cached_answer(known[keys[q.id]], max_new) if keys[q.id] in known else None
        if hit is not None:
            done[q.id] = hit
    todo = sorted((q for q in queries if q.id not in done), key=lambda q: len(prompts[q.id]))
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    with JsonlWriter(path) as writer, tqdm(total=len(todo), desc="target responses", unit="query") as bar:
        for s in range(0, len(todo), batch_size):
            chunk = todo[s:s + batch_size]
            batch = [prompts[q.id] for q in chunk]
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=target.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=target.device)
            with torch.inference_mode():
                seq = target.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                            eos_token_id=sorted(eos), pad_token_id=pad)
            skip = 1 if target.is_encoder_decoder else width  # decoder start token / the prompt
            for q, row in zip(chunk, seq[:, skip:].tolist()):
                cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
                writer.write({"key": keys[q.id], "max_new": int(max_new), "query_id": q.id, "ids": row[:cut]})
                done[q.id] = row[:cut]
            bar.update(len(chunk))
    return done


def autocast(precision: str, device: torch.device):
    """bf16 autocast for ``precision`` bfloat16 (weights, optimiser state and losses stay float32)."""
    if precision == "bfloat16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class HeadTrainee:
    """``drafter.kind=eagle``: a feature-level head from scratch (``drafters/distill.py``)."""

    kind = "eagle"
    default_lr = 1e-3

    def __init__(self, cfg: DictConfig, target: Target, train_ex: list[Example], eos: frozenset[int]):
        if target.is_encoder_decoder:
            raise SpecbenchError("eagle heads need a decoder-only target",
                                 "pick a decoder-only target, or drafter.kind=hf for an encoder-decoder one")
        if str(cfg.train.loss) != "kl":
            raise SpecbenchError(f"train.loss={cfg.train.loss} is for whole-model drafters (drafter.kind=hf)",
                                 "use train.loss=kl with eagle heads (ce_weight / feature_weight weigh their terms)")
        tr = cfg.train
        self.tr = tr
        self.target = target
        self.d2t = sub_vocabulary(train_ex, cfg.drafter.get("vocab"), target.vocab_size, always=sorted(eos))
        self.t2d = None
        if self.d2t is not None:
            self.t2d = torch.full((target.vocab_size,), -1, dtype=torch.long)
            self.t2d[self.d2t] = torch.arange(len(self.d2t))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(tr.seed))
            self.module = EagleHead(target.model, layers=int(cfg.drafter.layers), dtype=torch.float32)
        # Trained in float32 whatever the target's dtype: the LM-head rows as a float32 copy (the
        # teacher's features and probabilities are float32 already, its embeddings are cast).
        self.logits = HeadLogits(target, self.d2t, dtype=torch.float32)
        self.embed = target.model.get_input_embeddings()
        self.unroll = int(tr.get("unroll") or 1)
        weights = tr.get("unroll_weights")
        self.unroll_weights = None if weights is None else [float(w) for w in weights]
        if self.unroll_weights is not None and len(self.unroll_weights) != self.unroll:
            raise SpecbenchError(f"train.unroll_weights has {len(self.unroll_weights)} entries, train.unroll is "
                                 f"{self.unroll}", "give one weight per unroll step, or train.unroll_weights=null "
                                                   "(equal weights)")
        self.feature_noise = float(tr.get("feature_noise") or 0.0)
        self.noise_gen: torch.Generator | None = None
        self.precision = training_precision(cfg)
        self.meta = {"layers": int(cfg.drafter.layers),
                     "sub_vocabulary": None if self.d2t is None else int(len(self.d2t)),
                     "unroll": self.unroll, "unroll_weights": self.unroll_weights,
                     "feature_noise": self.feature_noise, "precision": self.precision}

    def items(self, examples: list[Example], desc: str, response_only: bool = False) -> list[dict]:
        return [pairs(ex, teach(self.target.model, ex, int(self.tr.top_k)), response_only)
                for ex in tqdm(examples, desc=desc, unit="seq")]

    def batches(self, items: list[dict], gen: torch.Generator):
        return distill.batches(items, int(self.tr.batch_size), int(self.tr.seq_len), gen)

    def whole(self, items: list[dict]):
        return next(distill.batches(items, len(items), int(self.tr.seq_len), torch.Generator().manual_seed(0)))

    def start_epoch(self, seed: int, epoch: int) -> None:
        """The feature noise of an epoch is a function of (seed, epoch): a resumed run draws the same."""
        self.noise_gen = torch.Generator().manual_seed(seed * 1_000 + epoch + 7_919) if self.feature_noise else None

    def loss(self, batch, training: bool = True):
        with autocast(self.precision, self.target.device):
            return distill.loss_of(self.module, self.embed, self.logits, batch, float(self.tr.feature_weight),
                                   float(self.tr.ce_weight), self.t2d, unroll=self.unroll,
                                   unroll_weights=self.unroll_weights,
                                   feature_noise=self.feature_noise if training else 0.0, noise_gen=self.noise_gen)

    def agreement(self, items: list[dict]) -> dict:
        return distill.agreement(self.module, self.embed, self.logits, items, depth=4, max_depth=5)

    def save(self, path: Path, meta: dict) -> None:
        save_head(self.module, self.d2t, path, meta)


class ModelTrainee:
    """``drafter.kind=hf``: an existing small causal or seq2seq model, fine-tuned (``drafters/finetune.py``)."""

    kind = "hf"
    default_lr = 5e-5

    def __init__(self, cfg: DictConfig, target: Target, train_ex: list[Example], eos: frozenset[int]):
        if not cfg.drafter.get("model"):
            raise SpecbenchError("train-drafter drafter.kind=hf needs the model to fine-tune",
                                 "set drafter.model=<hub id, local directory or embedded:...> "
                                 "(e.g. double7/vicuna-68m for Vicuna, t5-small for T5)")
        if str(cfg.train.loss) not in finetune.LOSSES:
            raise SpecbenchError(f"train.loss must be one of {', '.join(finetune.LOSSES)}, got '{cfg.train.loss}'",
                                 "kl: to the target's top-k distribution; ce: to the text's next tokens")
        self.tr = cfg.train
        self.target = target
        # Trained in float32 whatever the target's dtype (the teacher's probabilities are float32).
        loaded = load_model(str(cfg.drafter.model), dtype="float32", device=str(target.device))
        check_compatible(target, loaded, str(cfg.drafter.model))
        self.loaded = loaded
        self.module = loaded.model.eval()  # eval mode: no dropout, so training is a function of the data order
        self.module.requires_grad_(True)
        tok = target.tokenizer
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
        self.meta = {"base_model": str(cfg.drafter.model), "loss": str(cfg.train.loss),
                     "encoder_decoder": target.is_encoder_decoder}
        if (int(self.tr.get("unroll") or 1) != 1 or float(self.tr.get("feature_noise") or 0.0)
                or self.tr.get("prompt_positions")):
            raise SpecbenchError("train.unroll, train.feature_noise and train.prompt_positions are for eagle heads "
                                 "(drafter.kind=eagle)", "leave train.unroll=1, train.feature_noise=0 and "
                                                         "train.prompt_positions=false with drafter.kind=hf")
        self.precision = training_precision(cfg)

    def start_epoch(self, seed: int, epoch: int) -> None:
        pass

    def items(self, examples: list[Example], desc: str, response_only: bool = False) -> list[finetune.Rows]:
        return [finetune.teach_rows(self.target.model, ex, int(self.tr.top_k), self.pad, self.target.vocab_size)
                for ex in tqdm(examples, desc=desc, unit="seq")]

    def batches(self, items, gen: torch.Generator):
        return finetune.batches(items, int(self.tr.batch_size), gen)

    def whole(self, items):
        return items

    def loss(self, batch, training: bool = True):
        with autocast(self.precision, self.target.device):
            return finetune.loss_of(self.module, batch, str(self.tr.loss), self.pad, self.target.vocab_size)

    def agreement(self, items) -> dict:
        return finetune.agreement(self.module, items, self.pad, self.target.vocab_size, depth=4)

    def save(self, path: Path, meta: dict) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.module.save_pretrained(path)
        self.loaded.tokenizer.save_pretrained(path)
        atomic_write_text(path / MODEL_META, json.dumps(meta, indent=1, default=str))


TRAINEES = {t.kind: t for t in (HeadTrainee, ModelTrainee)}


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    out = start_run(cfg, output_dir, command="train-drafter")
    kind = str(cfg.drafter.kind)
    if kind not in TRAINEES:
        raise SpecbenchError(f"train-drafter: drafter.kind '{kind}' is not supported",
                             f"use one of: {', '.join(TRAINEES)}")
    tr = cfg.train
    if str(tr.responses) not in ("reference", "target"):
        raise SpecbenchError(f"train.responses must be reference or target, got '{tr.responses}'",
                             "set train.responses=reference (teacher-forced references) or target")
    ckpt = checkpoint_dir(cfg)
    if not cfg.get("out"):
        make_cache_dir(ckpt)  # an unwritable cache is named as such (SPECBENCH_CACHE), not as the run directory
    lock_run_dir(ckpt, "train-drafter", fix=f"wait for that run to finish (or stop it), or train into another "
                                             f"checkpoint directory: out=<dir> or name=<name> (now {ckpt})")
    sig = signature(cfg)
    state_path = ckpt / "state.pt"
    stored = json.loads((ckpt / "signature.json").read_text()) if (ckpt / "signature.json").exists() else None
    if stored is not None and not same_signature(stored, sig):
        if not cfg.get("overwrite"):
            raise SpecbenchError(f"{ckpt} holds a drafter trained with another config",
                                 "pass out=<another directory> or name=<another name>, or overwrite=true")
        state_path.unlink(missing_ok=True)
    atomic_write_text(ckpt / "signature.json", json.dumps(sig, indent=1))

    loaded = load_model(cfg.target.model, dtype=cfg.target.dtype, device=cfg.target.device)
    target = Target(loaded)
    tok = loaded.tokenizer
    prompter = Prompter(tok, cfg.target.prompt.style, cfg.templates[cfg.target.prompt.templates],
                        cfg.target.prompt.get("system"), [], cfg.target.prompt.get("chat_template"))
    max_input = tr.get("max_input_tokens") or cfg.dataset.get("max_input_tokens")
    queries = [truncate_fields(q, tok, max_input) for q in load_dataset_config(cfg.dataset)]
    eos = eos_ids_of(loaded)
    responses = (target_responses(target, prompter, queries, response_cache(target), int(tr.max_new_tokens), eos,
                                  int(tr.get("generate_batch") or 32))
                 if str(tr.responses) == "target" else None)
    if tr.get("generate_only"):
        n = sum(len(r) for r in (responses or {}).values())
        log.info("train.generate_only: %d answers (%d tokens) in %s; no training", len(responses or {}), n,
                 response_cache(target))
        atomic_write_text(out / "responses.txt", f"{response_cache(target)}\n{len(responses or {})} answers, {n} tokens\n")
        return out
    examples = examples_of(queries, prompter, tok, responses, int(tr.max_tokens), bool(tr.get("prompt_positions")))
    n_val = min(int(tr.val_examples), len(examples) // 5)
    train_ex, val_ex = examples[n_val:], examples[:n_val]
    if not train_ex:
        raise SpecbenchError("no training sequences (every response was empty or the dataset is too small)",
                             "use more rows (dataset.limit) or longer train.max_tokens")
    for p in target.model.parameters():
        p.requires_grad_(False)
    trainee = TRAINEES[kind](cfg, target, train_ex, eos)
    seed = int(tr.seed)
    lr = float(tr.lr) if tr.get("lr") is not None else trainee.default_lr
    params = [p for p in trainee.module.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    history: list[dict] = []
    epoch0 = 0
    if state_path.exists():
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        trainee.module.load_state_dict(state["weights"] if "weights" in state else state["head"])  # "head": older runs
        opt.load_state_dict(state["opt"])
        history, epoch0 = state["history"], state["epoch"]
        log.info("resuming %s after epoch %d", ckpt, epoch0)
    epochs = int(tr.epochs)
    train_items = val_items = []
    teacher_started = time.perf_counter()
    if epoch0 < epochs:  # a finished run (rerun for its files) needs no teacher pass over the training data
        train_items = trainee.items(train_ex, "teacher (train)")
        val_items = trainee.items(val_ex, "teacher (held out)", response_only=True)
    teacher_s = time.perf_counter() - teacher_started
    budget = float(tr.time_budget_s) if tr.get("time_budget_s") else None
    started = time.perf_counter()
    bar = tqdm(range(epoch0, epochs), desc=f"train-drafter {ckpt.name}", unit="epoch", initial=epoch0, total=epochs)
    for epoch in bar:
        epoch_started = time.perf_counter()
        gen = torch.Generator().manual_seed(seed * 1_000 + epoch)
        trainee.start_epoch(seed, epoch)
        stats = []
        for batch in trainee.batches(train_items, gen):
            loss, s = trainee.loss(batch)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            stats.append(s)
        row = {"epoch": epoch + 1, **{k: sum(s[k] for s in stats) / len(stats) for k in stats[0]}}
        if val_items:
            with torch.no_grad():
                _, vs = trainee.loss(trainee.whole(val_items), training=False)
            row.update({f"val_{k}": v for k, v in vs.items()})
        row["seconds"] = round(time.perf_counter() - epoch_started, 2)
        history.append(row)
        bar.set_postfix(loss=f"{row['loss']:.3f}", top1=f"{row.get('val_top1', row['top1']):.3f}")
        with atomic_path(state_path) as tmp:  # never a torn state.pt: the last finished epoch survives Ctrl-C
            torch.save({"weights": trainee.module.state_dict(), "opt": opt.state_dict(), "history": history,
                        "epoch": epoch + 1}, tmp)
        if budget is not None and time.perf_counter() - started > budget and epoch + 1 < epochs:
            log.warning("train.time_budget_s=%s reached after epoch %d of %d: stopping", budget, epoch + 1, epochs)
            break
    trainee.module.eval()
    meta = {"kind": kind, "target": str(cfg.target.model), "dtype": str(target.model.dtype).removeprefix("torch."),
            "vocab": vocab_fingerprint(tok), **trainee.meta,
            "data": OmegaConf.to_container(cfg.dataset, resolve=True), "responses": str(tr.responses),
            "train_sequences": len(train_ex), "train_tokens": learned_tokens(train_ex),
            "train_response_tokens": int(sum(len(e.ids) - e.start for e in train_ex)),
            "prompt_positions": bool(tr.get("prompt_positions")),
            "epochs": len(history), "lr": lr, "seed": seed}
    trainee.save(ckpt, meta)
    hist = pd.DataFrame(history)
    tables.write_csv(hist, ckpt / "history.csv")
    try:
        if len(hist):
            plot_history(hist, ckpt / "loss.png", title=f"{ckpt.name}: {cfg.target.model}")
    except ImportError:
        log.warning("matplotlib is not installed: loss.png skipped")
    if val_ex and not val_items:  # a finished run rerun for its files: the held-out rows still get scored
        val_items = trainee.items(val_ex, "teacher (held out)", response_only=True)
    metrics = held_out_metrics(cfg, trainee, target, prompter, tok, ckpt, eos, val_items)
    metrics["data"] = {k: meta[k] for k in ("train_sequences", "train_tokens", "train_response_tokens",
                                            "prompt_positions")}
    metrics["seconds"] = {"teacher_pass (this session)": round(teacher_s, 1),
                          "training": round(sum(float(r.get("seconds") or 0) for r in history), 1)}
    atomic_write_text(ckpt / "metrics.json", json.dumps(metrics, indent=1))
    rows = [*([("validation", metrics["validation"])] if metrics.get("validation") else []),
            *metrics["tasks"].items()]
    table = pd.DataFrame([{"task": t, **{k: v for k, v in m.items() if not isinstance(v, list)},
                           **{f"accept_d{d + 1}": v for d, v in enumerate(m.get("accept_by_depth") or [])}}
                          for t, m in rows])
    tables.write_tables(table, out, stem="metrics", title=f"train-drafter {ckpt.name}",
                        notes="top1: held-out agreement of the drafter's argmax with the target's (teacher-forced); "
                              "expected_accepted: accepted draft tokens per round at draft length 4 drafting on "
                              "its own (exact for the target's own text, an estimate on reference text).")
    tables.print_table(tables.to_markdown(table), title=f"drafter {ckpt} (held-out)")
    atomic_write_text(out / "checkpoint.txt", str(ckpt) + "\n")
    return out


def held_out_metrics(cfg, trainee, target, prompter, tok, ckpt: Path, eos, val_items=None) -> dict:
    """Agreement on each held-out set, on the same kind of text the head trained on (references, or
    the target's own answers, generated once and kept in ``heldout_<task>.jsonl``); ``validation``:
    on the training split's held-out rows (``train.val_examples``, the head's own task), by draft depth."""
    tasks = {}
    for task, src in (cfg.get("eval_sets") or {}).items():
        if src is None:
            continue
        src = OmegaConf.to_container(src, resolve=True)
        limit, offset = src.pop("limit", 8), src.pop("offset", 0)
        try:
            queries = load_source(task, src, limit=limit, offset=offset, shuffle=bool(src.pop("shuffle", False)))
        except SpecbenchError as exc:
            log.warning("held-out set %s skipped: %s", task, exc.problem)
            continue
        queries = [truncate_fields(q, tok, cfg.train.get("max_input_tokens") or cfg.dataset.get("max_input_tokens"))
                   for q in queries]
        if str(cfg.train.responses) == "target":
            responses = target_responses(target, prompter, queries, response_cache(target),
                                         int(cfg.train.max_new_tokens), eos, int(cfg.train.get("generate_batch") or 32))
        else:
            responses, queries = None, [q for q in queries if q.reference]
        ex = examples_of(queries, prompter, tok, responses, int(cfg.train.max_tokens))
        tasks[task] = trainee.agreement(trainee.items(ex, f"held out ({task})"))
    out = {"head": ckpt.name, "responses": str(cfg.train.responses), "tasks": tasks}
    if val_items:
        out["validation"] = trainee.agreement(val_items)
    if trainee.kind == "eagle":
        out["definitions"] = {**distill.DEPTH_DEFINITIONS,
                              "validation": "the training split's held-out rows (train.val_examples, never trained "
                                            "on): the head's own task",
                              "tasks": "the eval_sets rows, per task",
                              "target token": "the teacher's greedy (argmax) token at each position of the text "
                                              f"(train.responses={cfg.train.responses})"}
    return out


def plot_history(hist: pd.DataFrame, path: Path, title: str = "") -> None:
    plt = tables.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for col in ("loss", "val_loss"):
        if col in hist:
            ax.plot(hist.epoch, hist[col], label=col)
    ax.set_xlabel("epoch")
    ax.set_ylabel("loss")
    if "val_top1" in hist:
        ax2 = ax.twinx()
        ax2.plot(hist.epoch, hist.val_top1, color="gray", ls="--", label="held-out top-1")
        ax2.set_ylabel("top-1 agreement")
        ax2.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)



def compare(dirs: list[Path]) -> pd.DataFrame:
    """One row per train-drafter checkpoint directory (its ``metrics.json``): held-out top-1 by depth on its
    own split's held-out rows, expected accepted tokens at draft length 4, data and training seconds."""
    rows = []
    for d in dirs:
        m = json.loads((Path(d) / "metrics.json").read_text())
        v = m.get("validation") or {}
        rows.append({"head": Path(d).name, **{f"top1_d{i + 1}": x for i, x in enumerate(v.get("top1_by_depth") or [])},
                     "expected_accepted": v.get("expected_accepted"),
                     "tokens": (m.get("data") or {}).get("train_tokens"),
                     "train_s": (m.get("seconds") or {}).get("training"),
                     **{f"{t}_top1": x.get("top1") for t, x in (m.get("tasks") or {}).items()}})
    return pd.DataFrame(rows)


if __name__ == "__main__":  # python -m specbench.pipelines.train_drafter DIR... : compare checkpoints
    import sys

    table = compare([Path(a) for a in sys.argv[1:]])
    print(tables.to_markdown(table.round(3)))
