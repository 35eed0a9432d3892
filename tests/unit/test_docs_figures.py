"""Issue 42: every figure a hand-written page quotes comes from a generated one. A decimal in the prose of README.md
or a hand-written page of docs/ (code spans, code blocks and comments aside: those are commands and settings) must
appear, to the digits quoted, in a page a make target writes: the reproduction report (docs/reproduction/), the pages
the Makefile copies into docs/ (`cp ... docs/<page>`), the shipped heads' generated records (specbench/heads/) or the
papers' published numbers (specbench/reproduction/published.yaml). A figure rounded from a generated one counts as
quoted from it (1.83 from 1.834). Issue 56: so must an integer of three digits or more (a count or a duration: 1,360
generations, 106 minutes), unless it is a setting (a config's or the Makefile's), a year, or the end of a range; the
README's generated blocks are not prose. Pure text: no model is loaded."""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DECIMAL = re.compile(r"(?<![\w.])(\d+\.\d+)(?![\w.]*\d)")
# an integer of two digits or more (1,360 or 1360, 48): a count or a duration; not part of a word, a decimal or a path
INTEGER = re.compile(r"(?<![\w.,/-])(\d{1,3}(?:,\d{3})+|\d{2,})(?![\w]|[.,]\d)")
# a number that names a thing rather than counting one: an issue, a stop, a table, a figure, a round of review
NAMING = re.compile(
    r"(?:issues?|stops?|Issues?|Stops?|Table|Tables|Fig\.|Figure|Theorem|round|Round|commit|#)\s*$"
)
YEARS = range(1900, 2101)  # a year is not a figure
COPY = re.compile(r"^\s*cp\s+\S+\s+(docs/[\w./-]+\.md)", re.M)


def generated_pages(root: Path = ROOT) -> list[Path]:
    """The pages make targets write: the report and every ``cp ... docs/<page>.md`` of the Makefile."""
    copied = [root / p for p in COPY.findall((root / "Makefile").read_text())]
    return sorted({*root.glob("docs/reproduction/**/*.md"), *copied})


def generated_sources(root: Path = ROOT) -> list[Path]:
    heads = [p for p in root.glob("specbench/heads/**/*") if p.suffix in (".json", ".csv", ".md")]
    return [*generated_pages(root), *heads, root / "specbench/reproduction/published.yaml"]


def rounded(figures: set[str]) -> set[str]:
    """Every figure and each of its roundings to fewer decimals (half up, as the tables print)."""
    out = set()
    for f in figures:
        d = Decimal(f)
        for k in range(1, len(f.split(".")[1]) + 1):
            out.add(str(d.quantize(Decimal(1).scaleb(-k), rounding=ROUND_HALF_UP)))
    return out


def prose(text: str) -> str:
    """``text`` with generated blocks (between a ``do not edit -->`` marker and its ``<!-- end of`` marker), code
    blocks, code spans and HTML comments blanked (line numbers kept)."""

    def blank(m: re.Match) -> str:
        return "\n" * m.group(0).count("\n")

    for pattern in (r"do not edit -->.*?<!-- end of", r"```.*?```", r"<!--.*?-->", r"`[^`\n]*`"):
        text = re.sub(pattern, blank, text, flags=re.S)
    return text


def unquoted(page: Path, held: set[str]) -> list[tuple[int, str]]:
    """(line, figure) of every decimal in ``page``'s prose that no generated page holds."""
    return [
        (i, m.group(1))
        for i, line in enumerate(prose(page.read_text(encoding="utf-8")).splitlines(), 1)
        for m in DECIMAL.finditer(line)
        if m.group(1) not in held
    ]


def integers(text: str) -> set[str]:
    """Every run of digits in ``text``, thousands separators dropped (1,360 and 1360 alike)."""
    return set(re.findall(r"\d+", re.sub(r"(?<=\d),(?=\d{3})", "", text)))


def settings_integers(root: Path = ROOT) -> set[str]:
    """The integers of the configs and the Makefile: settings (row counts, token limits), not measured figures."""
    return set().union(
        *(integers(p.read_text("utf-8")) for p in [*root.glob("conf/**/*.yaml"), root / "Makefile"])
    )


def unquoted_integers(page: Path, held: set[str], text: str | None = None) -> list[tuple[int, str]]:
    """(line, integer) of every integer of two digits or more in ``page``'s prose (or in ``text``) that neither a
    generated page nor a setting holds (years, and numbers that name an issue, a table or a figure, aside)."""
    body = prose(page.read_text(encoding="utf-8")) if text is None else text
    return [
        (i, m.group(1))
        for i, line in enumerate(body.splitlines(), 1)
        for m in INTEGER.finditer(line)
        if (v := m.group(1).replace(",", "")) not in held
        and int(v) not in YEARS
        and not NAMING.search(line[: m.start()])
    ]


def makefile_comments(root: Path = ROOT) -> str:
    """The Makefile's comments (a comment line, or the comment after a recipe line), line numbers kept: prose that
    quotes measured times and counts."""
    out = []
    for line in (root / "Makefile").read_text(encoding="utf-8").splitlines():
        out.append(line.split("#", 1)[1] if "#" in line else "")
    return prose("\n".join(out))


def makefile_settings(root: Path = ROOT) -> set[str]:
    """The integers of the Makefile's commands and variables (its comments left out), and of the configs."""
    code = "\n".join(
        line.split("#", 1)[0] for line in (root / "Makefile").read_text(encoding="utf-8").splitlines()
    )
    return integers(code).union(*(integers(p.read_text("utf-8")) for p in root.glob("conf/**/*.yaml")))


def unquoted_in_hand_pages(scan, held: set[str]) -> dict[str, list[tuple[int, str]]]:
    """``scan(page, held)`` over README.md and every hand-written page of docs/ (the generated ones aside): each
    page's (line, figure) no generated page holds."""
    generated = generated_pages()
    hand = [ROOT / "README.md", *(p for p in sorted(ROOT.glob("docs/*.md")) if p not in generated)]
    found = {str(p.relative_to(ROOT)): scan(p, held) for p in hand}
    return {k: v for k, v in found.items() if v}


FIX = "quote a generated page's figure and link it, or write the figure into a generated page"


def test_hand_written_pages_quote_only_generated_integers():
    """Issue 56: counts and durations typed into a hand-written page (positions, generations, minutes) come from a
    generated page too, or are settings (a config's or the Makefile's)."""
    held = settings_integers().union(
        *(integers(p.read_text("utf-8")) for p in generated_sources() if p.is_file())
    )
    found = unquoted_in_hand_pages(unquoted_integers, held)
    assert not found, (
        f"hand-written pages quote integers no generated page or setting holds (line, integer): {found}; {FIX}"
    )


def test_the_makefiles_comments_quote_only_generated_integers():
    """Issue 67: the times and counts the Makefile's comments give (a target's minutes, a trace's positions) come from
    a generated page (docs/reproduction/TIMES.md: the times the targets record as they finish) or are settings."""
    held = makefile_settings().union(
        *(integers(p.read_text("utf-8")) for p in generated_sources() if p.is_file())
    )
    found = unquoted_integers(ROOT / "Makefile", held, makefile_comments())
    assert not found, (
        f"the Makefile's comments quote integers no generated page or setting holds: {found}; {FIX}"
    )


def test_hand_written_pages_quote_only_generated_figures():
    assert (
        ROOT / "docs/budget-cpu.md" in generated_pages() and len(generated_pages()) > 10
    )  # the scan sees the report's pages
    held = rounded(
        {f for p in generated_sources() if p.is_file() for f in DECIMAL.findall(p.read_text("utf-8"))}
    )
    found = unquoted_in_hand_pages(unquoted, held)
    assert not found, (
        f"hand-written pages quote figures no generated page holds (line, figure): {found}; {FIX}"
    )


def test_the_scan_catches_a_made_up_figure(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "The method runs 1.834x.\nIn code: `speedup 9.99`.\n```\n7.77\n```\nIt runs 4.321x (made up).\n"
    )
    held = rounded({"1.834"})
    assert unquoted(page, held) == [(6, "4.321")]
    assert "1.83" in held and "1.8" in held and "1.84" not in held
    page.write_text(
        "It took 1,360 generations and 45 minutes.\nRows 2,000 and `9,999`; in 2024 run-1234 (v1.234).\n"
        "<!-- demo: do not edit -->\n777 s\n<!-- end of the demo -->\nThen 15,946 positions.\n"
    )
    assert unquoted_integers(page, integers("2000 and 1360 45")) == [(6, "15,946")]
    page.write_text(
        "Issue 67 ran 48 queries, Table 12 and round 5.\n"
    )  # two digits count; names are not figures
    assert unquoted_integers(page, set()) == [(1, "48")]
