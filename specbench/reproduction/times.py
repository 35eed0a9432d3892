"""The measured time of every long make target, recorded as it finishes and published as a generated page.

The Makefile's long targets (the reproduction plan, the traces, the cascades, the throughput runs) take hours on
2 CPUs; the Makefile's comments and the docs give their times. So that those figures come from a measurement and
not a memory, each such target records its wall time when it finishes (``record``: one JSON line per completion in
``outputs/make_times.jsonl``, with the commit and whether anything else was running is for the person to say: the
docs' rule is that timed targets run alone), and ``make report`` writes ``docs/reproduction/TIMES.md`` from that
log (``page``): the last completion of each target, in minutes, with its commit and date. A target resumed after an
interruption records the time of its last part only, and the page says so in its notes.

    python -m specbench.reproduction.times record TARGET START_EPOCH_SECONDS [--log LOG]
    python -m specbench.reproduction.times record TARGET --seconds S [--log LOG]     # a time measured elsewhere
    python -m specbench.reproduction.times page LOG OUT
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

from specbench.errors import SpecbenchError, exit_on
from specbench.files import atomic_write_text

LOG = Path("outputs/make_times.jsonl")


def record(target: str, seconds: float, log: Path = LOG, note: str = "") -> dict:
    """Append one completion of ``target`` (its wall ``seconds``) to ``log``, with the code's commit."""
    from specbench.provenance import code_state

    if not target or seconds < 0:
        raise SpecbenchError(
            f"a time of {seconds} s for target {target!r}", "give a target and a positive time"
        )
    state = code_state()
    entry = {
        "target": target,
        "seconds": round(float(seconds), 1),
        "finished": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": state.get("commit"),
        "dirty": state.get("dirty"),
        **({"note": note} if note else {}),
    }
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")
    return entry


def read(log: Path) -> list[dict]:
    """The log's entries, oldest first (a damaged line named, not skipped)."""
    log = Path(log)
    if not log.is_file():
        raise SpecbenchError(f"{log} does not exist", "run a timed make target first (it writes the log)")
    out = []
    for i, line in enumerate(log.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            float(entry["seconds"]), str(entry["target"])
        except (ValueError, KeyError, TypeError):
            raise SpecbenchError(
                f"{log}: line {i} is damaged ({line[:60]!r})", f"delete line {i} of {log}"
            ) from None
        out.append(entry)
    return out


def page(log: Path) -> str:
    """``TIMES.md``: each target's last recorded completion, in minutes, with its commit and date."""
    import pandas as pd

    from specbench.pipelines.tables import to_markdown
    from specbench.provenance import label

    last: dict[str, dict] = {}
    for e in read(log):
        last[e["target"]] = e
    table = pd.DataFrame(
        [
            {
                "target": f"make {t}",
                "minutes": round(e["seconds"] / 60),
                "seconds": e["seconds"],
                "commit": label(e.get("commit"), e.get("dirty")),
                "finished": e.get("finished", ""),
                "note": e.get("note", ""),
            }
            for t, e in sorted(last.items())
        ]
    )
    return "\n".join(
        [
            "# The measured time of each long make target",
            "",
            f"Generated from `{log}` (`python -m specbench.reproduction.times page`): each target's wall time at its "
            "last completion, run alone on this machine's 2 CPUs. A target resumed after an interruption records "
            "only its last part (its note says so).",
            "",
            to_markdown(table),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    r = sub.add_parser("record")
    r.add_argument("target")
    r.add_argument("start", nargs="?", type=float, help="the target's start, in seconds since the epoch")
    r.add_argument("--seconds", type=float, default=None, help="its measured time instead of a start")
    r.add_argument("--note", default="")
    r.add_argument("--log", default=str(LOG))
    w = sub.add_parser("page")
    w.add_argument("log")
    w.add_argument("out")
    a = p.parse_args(argv)
    try:
        if a.verb == "record":
            if (a.start is None) == (a.seconds is None):
                raise SpecbenchError("record needs a start time or --seconds (one of them)", "pass one")
            seconds = a.seconds if a.seconds is not None else time.time() - a.start
            print(json.dumps(record(a.target, seconds, Path(a.log), a.note)))
        else:
            atomic_write_text(Path(a.out), page(Path(a.log)))
            print(f"wrote {a.out}")
    except SpecbenchError as exc:
        exit_on(exc)


if __name__ == "__main__":
    main()
