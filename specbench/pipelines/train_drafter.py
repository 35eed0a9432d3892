"""``specbench train-drafter``: a draft head for a given target, trained by distillation from that target.

Data: ``dataset`` (a training split), teacher-forced: prompt (built as ``eval`` builds it) plus the
reference response (``train.responses=reference``, the default) or the target's own greedy
response (``train.responses=target``: batched greedy ``generate``, appended to ``responses.jsonl``
as it goes and reused on a rerun). One target forward per sequence gives the
features and the teacher distributions (``drafters/distill.py``). The head (``drafter.kind=eagle``:
EAGLE-1 layout, ``drafter.layers`` decoder layers, ``drafter.vocab`` draft sub-vocabulary) trains
on the response positions with smooth-L1 on the next feature plus cross-entropy to the target's
top-k distribution.

Writes into ``out`` (default ``$SPECBENCH_CACHE/drafters/<name>``): ``model.safetensors`` +
``config.json`` (the kind, the target and its vocabulary fingerprint, the data, the steps, the
sub-vocabulary), ``history.csv``, ``loss.png``, ``metrics.json`` (held-out agreement with the target
and expected accepted tokens at draft length 4 on every task of ``eval_sets``), and ``state.pt``
after every epoch, so an interrupted run resumes to the same weights as an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from specbench.drafters.distill import Example, agreement, batches, loss_of, pairs, sub_vocabulary, teach
from specbench.drafters.eagle import EagleHead, HeadLogits, save_head, vocab_fingerprint
from specbench.errors import SpecbenchError
from specbench.models import Target, load_model
from specbench.models.loading import cache_dir
from specbench.pipelines import report
from specbench.pipelines.session import Prompter, eos_ids_of, start_run
from specbench.records import JsonlWriter, read_jsonl
from specbench.tasks import load_dataset_config, truncate_fields
from specbench.tasks.datasets import load_source

log = logging.getLogger(__name__)
KINDS = ("eagle",)


def checkpoint_dir(cfg: DictConfig) -> Path:
    if cfg.get("out"):
        return Path(str(cfg.out))
    name = cfg.get("name") or cfg.dataset.get("name") or "head"
    return cache_dir() / "drafters" / str(name)


def signature(cfg: DictConfig) -> dict:
    """What must match for a rerun to resume a checkpoint directory."""
    plain = lambda node: OmegaConf.to_container(node, resolve=True)  # noqa: E731
    return {"target": str(cfg.target.model), "dataset": plain(cfg.dataset), "drafter": plain(cfg.drafter),
            "train": {k: v for k, v in plain(cfg.train).items() if k not in ("epochs", "time_budget_s")}}


def examples_of(queries, prompter: Prompter, tokenizer, responses: dict[str, list[int]] | None,
                max_tokens: int) -> list[Example]:
    """Prompt + response sequences; queries without a reference are skipped (logged) with reference responses."""
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
    return out


def target_responses(target: Target, prompter: Prompter, queries, path: Path, max_new: int, eos,
                     batch_size: int = 16) -> dict:
    """The target's greedy answer per query (``max_new`` tokens at most, cut after EOS), appended to
    ``path`` as each batch finishes (resumable). Batched Hugging Face ``generate`` with left padding:
    these are training texts, not timed outputs."""
    done = {r["query_id"]: r["ids"] for r in read_jsonl(path)}
    todo = [q for q in queries if q.id not in done]
    tok = target.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    with JsonlWriter(path) as writer, tqdm(total=len(todo), desc="target responses", unit="query") as bar:
        for s in range(0, len(todo), batch_size):
            chunk = todo[s:s + batch_size]
            prompts = [prompter(q) for q in chunk]
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=target.device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=target.device)
            with torch.inference_mode():
                seq = target.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                            eos_token_id=sorted(eos), pad_token_id=pad)
            for q, row in zip(chunk, seq[:, width:].tolist()):
                cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
                writer.write({"query_id": q.id, "ids": row[:cut]})
                done[q.id] = row[:cut]
            bar.update(len(chunk))
    return done


def teacher_items(model, examples: list[Example], top_k: int, desc: str) -> list[dict]:
    return [pairs(ex, teach(model, ex, top_k)) for ex in tqdm(examples, desc=desc, unit="seq")]


def run(cfg: DictConfig, output_dir: str | Path) -> Path:
    out = start_run(cfg, output_dir)
    kind = str(cfg.drafter.kind)
    if kind not in KINDS:
        raise SpecbenchError(f"train-drafter: drafter.kind '{kind}' is not supported",
                             f"use one of: {', '.join(KINDS)} (fine-tuning hf drafters is not built yet)")
    tr = cfg.train
    if str(tr.responses) not in ("reference", "target"):
        raise SpecbenchError(f"train.responses must be reference or target, got '{tr.responses}'",
                             "set train.responses=reference (teacher-forced references) or target")
    ckpt = checkpoint_dir(cfg)
    ckpt.mkdir(parents=True, exist_ok=True)
    sig = signature(cfg)
    state_path = ckpt / "state.pt"
    if (ckpt / "signature.json").exists() and json.loads((ckpt / "signature.json").read_text()) != sig:
        if not cfg.get("overwrite"):
            raise SpecbenchError(f"{ckpt} holds a head trained with another config",
                                 "pass out=<another directory> or name=<another name>, or overwrite=true")
        state_path.unlink(missing_ok=True)
    (ckpt / "signature.json").write_text(json.dumps(sig, indent=1))

    loaded = load_model(cfg.target.model, dtype=cfg.target.dtype, device=cfg.target.device)
    target = Target(loaded)
    if target.is_encoder_decoder:
        raise SpecbenchError("eagle heads need a decoder-only target", "pick a decoder-only target")
    tok = loaded.tokenizer
    prompter = Prompter(tok, cfg.target.prompt.style, cfg.templates[cfg.target.prompt.templates],
                        cfg.target.prompt.get("system"), [], cfg.target.prompt.get("chat_template"))
    max_input = tr.get("max_input_tokens") or cfg.dataset.get("max_input_tokens")
    queries = [truncate_fields(q, tok, max_input) for q in load_dataset_config(cfg.dataset)]
    eos = eos_ids_of(loaded)
    responses = (target_responses(target, prompter, queries, ckpt / "responses.jsonl", int(tr.max_new_tokens), eos)
                 if str(tr.responses) == "target" else None)
    examples = examples_of(queries, prompter, tok, responses, int(tr.max_tokens))
    n_val = min(int(tr.val_examples), len(examples) // 5)
    train_ex, val_ex = examples[n_val:], examples[:n_val]
    if not train_ex:
        raise SpecbenchError("no training sequences (every response was empty or the dataset is too small)",
                             "use more rows (dataset.limit) or longer train.max_tokens")
    d2t = sub_vocabulary(train_ex, cfg.drafter.get("vocab"), target.vocab_size, always=sorted(eos))
    t2d = None
    if d2t is not None:
        t2d = torch.full((target.vocab_size,), -1, dtype=torch.long)
        t2d[d2t] = torch.arange(len(d2t))
    model = target.model

    seed = int(tr.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head = EagleHead(model, layers=int(cfg.drafter.layers), dtype=torch.float32)
    for p in model.parameters():
        p.requires_grad_(False)
    logits = HeadLogits(target, d2t)
    embed = model.get_input_embeddings()
    opt = torch.optim.AdamW(head.parameters(), lr=float(tr.lr), weight_decay=0.0)
    history: list[dict] = []
    epoch0 = 0
    if state_path.exists():
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["opt"])
        history, epoch0 = state["history"], state["epoch"]
        log.info("resuming %s after epoch %d", ckpt, epoch0)
    epochs = int(tr.epochs)
    train_items = val_items = []
    if epoch0 < epochs:  # a finished run (rerun for its files) needs no teacher pass over the training data
        train_items = teacher_items(model, train_ex, int(tr.top_k), "teacher (train)")
        val_items = teacher_items(model, val_ex, int(tr.top_k), "teacher (held out)")
    budget = float(tr.time_budget_s) if tr.get("time_budget_s") else None
    started = time.perf_counter()
    bar = tqdm(range(epoch0, epochs), desc=f"train-drafter {ckpt.name}", unit="epoch", initial=epoch0, total=epochs)
    for epoch in bar:
        head.train()
        gen = torch.Generator().manual_seed(seed * 1_000 + epoch)
        stats = []
        for batch in batches(train_items, int(tr.batch_size), int(tr.seq_len), gen):
            loss, s = loss_of(head, embed, logits, batch, float(tr.feature_weight), float(tr.ce_weight), t2d)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            stats.append(s)
        head.eval()
        row = {"epoch": epoch + 1, **{k: sum(s[k] for s in stats) / len(stats) for k in stats[0]}}
        if val_items:
            with torch.no_grad():
                vb = next(batches(val_items, len(val_items), int(tr.seq_len), torch.Generator().manual_seed(0)))
                _, vs = loss_of(head, embed, logits, vb, float(tr.feature_weight), float(tr.ce_weight), t2d)
            row.update({f"val_{k}": v for k, v in vs.items()})
        history.append(row)
        bar.set_postfix(loss=f"{row['loss']:.3f}", top1=f"{row.get('val_top1', row['top1']):.3f}")
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "history": history, "epoch": epoch + 1},
                   state_path)
        if budget is not None and time.perf_counter() - started > budget and epoch + 1 < epochs:
            log.warning("train.time_budget_s=%s reached after epoch %d of %d: stopping", budget, epoch + 1, epochs)
            break
    steps = len(history)
    meta = {"kind": kind, "target": str(cfg.target.model), "vocab": vocab_fingerprint(tok),
            "layers": int(cfg.drafter.layers), "sub_vocabulary": None if d2t is None else int(len(d2t)),
            "data": OmegaConf.to_container(cfg.dataset, resolve=True), "responses": str(tr.responses),
            "train_sequences": len(train_ex), "train_tokens": int(sum(len(e.ids) - e.start for e in train_ex)),
            "epochs": steps, "seed": seed}
    save_head(head, d2t, ckpt, meta)
    hist = pd.DataFrame(history)
    hist.to_csv(ckpt / "history.csv", index=False)
    try:
        if len(hist):
            plot_history(hist, ckpt / "loss.png", title=f"{ckpt.name}: {cfg.target.model}")
    except ImportError:
        log.warning("matplotlib is not installed: loss.png skipped")
    metrics = held_out_metrics(cfg, head, embed, logits, target, prompter, tok, ckpt, eos)
    (ckpt / "metrics.json").write_text(json.dumps(metrics, indent=1))
    table = pd.DataFrame([{"task": t, **m} for t, m in metrics["tasks"].items()])
    report.write_tables(table, out, stem="metrics", title=f"train-drafter {ckpt.name}",
                        notes="top1: held-out agreement of the head's argmax with the target's (teacher-forced "
                              "features); expected_accepted: accepted draft tokens per round at draft length 4 "
                              "drafting on its own features (exact for the target's own text, an estimate on "
                              "reference text).")
    report.print_table(report.to_markdown(table), title=f"draft head {ckpt} (held-out)")
    (out / "checkpoint.txt").write_text(str(ckpt) + "\n")
    return out


def held_out_metrics(cfg, head, embed, logits, target, prompter, tok, ckpt: Path, eos) -> dict:
    """Agreement on each held-out set, on the same kind of text the head trained on (references, or
    the target's own answers, generated once and kept in ``heldout_<task>.jsonl``)."""
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
            responses = target_responses(target, prompter, queries, ckpt / f"heldout_{task}.jsonl",
                                         int(cfg.train.max_new_tokens), eos)
        else:
            responses, queries = None, [q for q in queries if q.reference]
        ex = examples_of(queries, prompter, tok, responses, int(cfg.train.max_tokens))
        items = teacher_items(target.model, ex, int(cfg.train.top_k), f"held out ({task})")
        tasks[task] = agreement(head, embed, logits, items, depth=4)
    return {"head": ckpt.name, "responses": str(cfg.train.responses), "tasks": tasks}


def plot_history(hist: pd.DataFrame, path: Path, title: str = "") -> None:
    plt = report.pyplot()
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

