"""The throughput page's table on synthetic runs: tokens per second are total tokens over total seconds, each method
against autoregressive decoding at its own batch size and at batch 1, and the share of outputs equal to batch 1's
autoregressive output; each batch's wall time split into forwards, drafting and the rest; a directory without records
is refused naming the fix."""

from __future__ import annotations

import json

import pytest

from specbench.errors import SpecbenchError
from specbench.reproduction import batch_throughput as T


def _run(path, size, rows):
    path.mkdir()
    (path / "config.yaml").write_text(f"decoding:\n  batch_size: {size}\n")
    (path / "examples.jsonl").write_text(
        "".join(
            json.dumps({"query_id": q, "method": m, "new_tokens": n, "seconds": s, "output_ids": ids}) + "\n"
            for q, m, n, s, ids in rows
        )
    )
    return path


def test_the_table_is_the_records_totals_and_ratios(tmp_path):
    one = _run(
        tmp_path / "b1",
        1,
        [("a", "autoregressive", 10, 1.0, [1, 2]), ("b", "autoregressive", 10, 1.0, [3]),
         ("a", "fixed:pl", 10, 0.5, [1, 2]), ("b", "fixed:pl", 10, 0.5, [3])],
    )  # fmt: skip
    four = _run(
        tmp_path / "b4",
        4,
        [("a", "autoregressive", 10, 0.25, [1, 2]), ("b", "autoregressive", 10, 0.25, [3, 4]),
         ("a", "fixed:pl", 10, 0.5, [1, 2]), ("b", "fixed:pl", 10, 0.5, [3])],
    )  # fmt: skip
    t = T.table([one, four]).set_index(["batch size", "method"])
    assert t.loc[(1, "autoregressive"), "tokens/s"] == pytest.approx(10.0)
    assert t.loc[(1, "fixed:pl"), "vs autoregressive, same batch"] == pytest.approx(2.0)
    assert t.loc[(4, "autoregressive"), "vs autoregressive at batch 1"] == pytest.approx(4.0)
    assert t.loc[(4, "fixed:pl"), "vs autoregressive, same batch"] == pytest.approx(0.5)
    assert t.loc[(4, "autoregressive"), "same output as batch 1"] == pytest.approx(0.5)  # query b forked
    assert t.loc[(4, "fixed:pl"), "same output as batch 1"] == pytest.approx(1.0)
    page = T.write([one, four], tmp_path / "page.md").read_text()
    assert "batch size |" in page and "b4" in page and "page.png" in page


def test_a_directory_without_records_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecbenchError, match="holds no examples.jsonl"):
        T.table([tmp_path / "empty"])


def test_the_page_names_the_code_each_run_came_from(tmp_path):
    from specbench import provenance

    rows = [("a", "autoregressive", 10, 1.0, [1])]
    one, four = _run(tmp_path / "b1", 1, rows), _run(tmp_path / "b4", 4, rows)
    for run, commit in ((one, "a" * 40), (four, "b" * 40)):
        provenance.record(run, {"commit": commit, "dirty": False, "packages": {}})
    page = T.write([one, four], tmp_path / "page.md").read_text()
    assert "**Mixed code**" in page and "`aaaaaaaaaa`: 1 runs" in page and "`bbbbbbbbbb`: 1 runs" in page
    provenance.record(four, {"commit": "a" * 40, "dirty": False, "packages": {}})
    four_only = T.write([four], tmp_path / "again.md").read_text()
    assert "**Mixed code**" in four_only  # a run resumed at another commit says so


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _two_queries(tmp_path, batches, rounds):
    """A batch-4 run of queries ``a`` and ``b`` in one batch under ``autoregressive`` and ``fixed:pl``: its batches
    ``(method, seconds, forwards)`` in the order they ran, and its ``rounds``."""
    four = _run(
        tmp_path / "b4",
        4,
        [("a", "autoregressive", 2, 1.0, [1, 2]), ("b", "autoregressive", 1, 0.5, [3]),
         ("a", "fixed:pl", 2, 1.0, [1, 2]), ("b", "fixed:pl", 1, 0.5, [3])],
    )  # fmt: skip
    batch = {"batch": 0, "query_ids": ["a", "b"], "new_tokens": 3}
    _jsonl(
        four / "batches.jsonl", [{"method": m, "seconds": t, "forwards": n, **batch} for m, t, n in batches]
    )
    _jsonl(four / "rounds.jsonl", [{"t_select": 0.0, "t_switch": 0.0, **r} for r in rounds])
    return four


def test_each_batchs_time_is_split_into_forwards_drafting_and_the_rest(tmp_path):
    four = _two_queries(
        tmp_path,
        [("fixed:pl", 2.0, 1), ("autoregressive", 1.5, 2)],  # in the order they ran
        [
            {"query_id": q, "method": m, "t_verify": v, "t_draft": d, "drafted": n}
            for q, m, v, d, n in [
                ("a", "autoregressive", 0.25, 0.0, 0),
                ("b", "autoregressive", 0.25, 0.0, 0),
                ("a", "autoregressive", 0.5, 0.0, 0),
                ("a", "fixed:pl", 0.5, 0.125, 3),
                ("b", "fixed:pl", 0.5, 0.125, 0),
            ]
        ],
    )
    b = T.batch_times([four]).set_index("method")
    assert b.loc["fixed:pl", "slot"] == 1 and b.loc["autoregressive", "slot"] == 2
    assert b.loc["autoregressive", "forward seconds"] == pytest.approx(1.0)
    assert b.loc["autoregressive", "the rest"] == pytest.approx(0.5)
    assert b.loc["fixed:pl", "drafting seconds"] == pytest.approx(0.25)
    assert b.loc["fixed:pl", "the rest"] == pytest.approx(0.75)
    assert b.loc["fixed:pl", "draft tokens verified"] == 3 and b.loc["fixed:pl", "forwards"] == 1
    assert "Where each batch's time went" in T.write([four], tmp_path / "page.md").read_text()


def test_each_forward_is_read_back_from_its_rows_rounds(tmp_path):
    """A batch's forward ``i`` holds the round ``i`` of every row still in it: its seconds the rows' shares summed,
    grouped by whether it held the whole batch and whether any row drafted."""
    four = _two_queries(
        tmp_path,
        [("autoregressive", 1.5, 2), ("fixed:pl", 2.0, 2)],
        [
            {"query_id": q, "method": m, "round": i, "t_verify": v, "drafted": n, "t_draft": 0.0}
            for q, m, i, v, n in [
                ("a", "autoregressive", 0, 0.25, 0),
                ("b", "autoregressive", 0, 0.25, 0),
                ("a", "autoregressive", 1, 0.5, 0),
                ("a", "fixed:pl", 0, 0.5, 3),
                ("b", "fixed:pl", 0, 0.5, 0),
                ("b", "fixed:pl", 1, 0.75, 0),
            ]
        ],
    )
    f = T.forward_times([four]).set_index(["method", "rows in the forward", "a row drafted"])
    assert f.loc[("autoregressive", "full", "no"), "ms a forward"] == pytest.approx(500.0)
    assert f.loc[("autoregressive", "fewer", "no"), "ms a forward"] == pytest.approx(500.0)
    assert f.loc[("fixed:pl", "full", "yes"), "ms a forward"] == pytest.approx(1000.0)
    assert f.loc[("fixed:pl", "fewer", "no"), "ms a forward"] == pytest.approx(750.0)
    assert len(f) == 4 and set(f.forwards) == {1}
    assert "## What a forward cost" in T.write([four], tmp_path / "page.md").read_text()


def test_a_waves_forwards_are_read_back_from_the_forward_each_round_records(tmp_path):
    """Continuous batching (two rows in flight, query ``c`` taking ``a``'s place): a row's round ``i`` is not the
    wave's forward ``i``, so each forward is the rounds that record it (``Round.forward``); it is full when it holds
    the rows in flight."""
    wave = _run(
        tmp_path / "b2",
        2,
        [(q, "autoregressive", 1, 0.5, [1]) for q in "abc"],
    )
    _jsonl(
        wave / "batches.jsonl",
        [{"method": "autoregressive", "batch": 0, "rows": 2, "query_ids": list("abc"), "new_tokens": 3,
          "seconds": 2.0, "forwards": 4}],
    )  # fmt: skip
    _jsonl(
        wave / "rounds.jsonl",
        [
            {"query_id": q, "method": "autoregressive", "round": i, "forward": f, "t_verify": v, "drafted": 0,
             "t_draft": 0.0, "t_select": 0.0, "t_switch": 0.0}
            for q, i, f, v in [("a", 0, 0, 0.25), ("b", 0, 0, 0.25), ("b", 1, 1, 0.25), ("c", 0, 1, 0.25),
                               ("b", 2, 2, 0.25), ("c", 1, 2, 0.25), ("c", 2, 3, 0.125)]
        ],
    )  # fmt: skip
    f = T.forward_times([wave]).set_index(["rows in the forward"])
    assert f.loc["full", "forwards"] == 3 and f.loc["full", "ms a forward"] == pytest.approx(500.0)
    assert f.loc["fewer", "forwards"] == 1 and f.loc["fewer", "ms a forward"] == pytest.approx(125.0)
    page = T.write([wave], tmp_path / "page.md").read_text()
    assert "batch size 2: waves of 3 queries, 2 in flight" in page
    static = T.write([_two_queries(tmp_path, [("autoregressive", 1.0, 1)], [])], tmp_path / "static.md")
    assert "batch size 4: static batches of 2 queries" in static.read_text()


def test_runs_again_give_each_ratio_its_spread_over_runs(tmp_path):
    """Three runs at batch 4 (the main one and two repeats): each method's ratio to autoregressive decoding in each
    run, their mean and a t-interval over the runs; a batch size run once, or a method one run ran, gets no row."""

    def run(name, ar_s, pl_s, size=4):
        return _run(
            tmp_path / name,
            size,
            [("a", "autoregressive", 10, ar_s, [1]), ("a", "fixed:pl", 10, pl_s, [1])],
        )

    main = run("b4", 1.0, 0.5)  # 2.0
    again = [run("b4_run2", 1.2, 0.5), run("b4_run3", 1.0, 0.625)]  # 2.4, 1.6
    solo = _run(
        tmp_path / "b4_run4", 4, [("a", "autoregressive", 10, 1.0, [1]), ("a", "fixed:other", 10, 1.0, [1])]
    )
    r = T.repeat_table([run("b1", 1.0, 0.5, size=1), main, run("b8", 1.0, 0.5, size=8)], [*again, solo])
    (row,) = r.to_dict("records")
    assert row["batch size"] == 4 and row["runs"] == 3 and row["each run's ratio"] == "2.000, 2.400, 1.600"
    assert row["mean"] == pytest.approx(2.0)
    half = 4.302652729 * 0.4 / 3**0.5  # t(0.975, 2) x sd / sqrt(3)
    assert row["95% CI low"] == pytest.approx(2.0 - half, rel=1e-4)
    assert row["95% CI high"] == pytest.approx(2.0 + half, rel=1e-4)
    page = T.write([main], tmp_path / "page.md", repeats=again).read_text()
    assert "## Runs again" in page and "--repeats" in page


def test_batch_one_is_set_beside_the_code_before_batching(tmp_path):
    """``--before``: per method both batch-1 runs ran, the paired speed ratio (this code / before) with its interval;
    a method as fast as before is within noise, one that slowed by half is not; runs not at batch 1 are refused."""
    import numpy as np

    rng = np.random.default_rng(0)
    queries = [f"q{i}" for i in range(24)]

    def rows(
        slow,
    ):  # each query's own length of work, the same in both runs; 2% timing noise of each run's own
        return [
            (
                q,
                m,
                20,
                (0.5 + i / 24) * (slow if m == "fixed:x" else 1.0) * (1 + 0.02 * rng.standard_normal()),
                [1],
            )
            for i, q in enumerate(queries)
            for m in ("autoregressive", "fixed:x")
        ]

    now = _run(tmp_path / "b1", 1, rows(2.0))
    before = _run(tmp_path / "before", 1, [r for r in rows(1.0) if r[0] != "q0"])
    b = T.before_table([now], before).set_index("method")
    assert b.loc["autoregressive", "within noise"] == "yes" and b.loc["autoregressive", "queries"] == 23
    assert b.loc["fixed:x", "within noise"] == "no"
    assert b.loc["fixed:x", "speed, this code / before"] == pytest.approx(0.5, rel=0.05)
    page = T.write([now], tmp_path / "page.md", before).read_text()
    assert "## Batch 1 against the code before batching" in page and f"--before {before}" in page
    four = _run(tmp_path / "b4", 4, rows(1.0))
    with pytest.raises(SpecbenchError, match="no run given is at batch size 1"):
        T.before_table([four], before)
    with pytest.raises(SpecbenchError, match="ran at batch size 4"):
        T.before_table([now], four)
    from specbench import provenance

    for run in (now, before):  # a before run that ran this code (its commit is this run's) is refused
        provenance.record(run, {"commit": "c" * 40, "dirty": False, "packages": {}})
    with pytest.raises(SpecbenchError, match="did not run the code before batching"):
        T.before_table([now], before)
    provenance.record(before, {"commit": "d" * 40, "dirty": False, "packages": {}})
    with pytest.raises(SpecbenchError, match="did not run"):  # a run resumed at this code's commit spans it
        T.before_table([now], before)


def test_runs_of_other_queries_or_settings_are_refused(tmp_path):
    """Issue 71: the page paired runs by batch size only, so three unrelated runs read as "11.7x autoregressive at
    batch 1"; runs that did not decode the same queries with the same target, data and limits are refused, naming
    what differs."""
    rows = [("a", "autoregressive", 10, 1.0, [1]), ("b", "autoregressive", 10, 1.0, [2])]
    one, four = _run(tmp_path / "b1", 1, rows), _run(tmp_path / "b4", 4, rows)
    T.write([one, four], tmp_path / "same.md")  # the same queries and settings: fine
    other = _run(
        tmp_path / "q", 4, [("c", "autoregressive", 10, 1.0, [1]), ("d", "autoregressive", 10, 1.0, [2])]
    )
    with pytest.raises(SpecbenchError, match=r"did not decode what .*queries: 2 vs 2 queries \(4 differ\)"):
        T.write([one, other], tmp_path / "page.md")
    longer = _run(tmp_path / "m", 4, rows)
    (longer / "config.yaml").write_text("decoding:\n  batch_size: 4\n  max_new_tokens: 256\n")
    with pytest.raises(SpecbenchError, match=r"decoding.max_new_tokens: None vs 256"):
        T.write([one, four], tmp_path / "page.md", repeats=[longer])
    assert not (tmp_path / "page.md").exists()
