"""The published-measurement corpus (benchmarks/published/*.jsonl) is well-formed: every row has its source,
verbatim quote, full setting and a known metric and unit; ids are unique; every workload path exists."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks" / "published"))

import corpus  # noqa: E402


def test_every_row_is_well_formed():
    rows = corpus.load_rows()  # raises with the list of problems
    assert len(rows) >= 60


def test_workload_paths_exist():
    for row in corpus.load_rows():
        w = row["setting"]["workload"]
        if ":" not in w.split("/")[0]:
            assert (ROOT / w).is_file(), f"{row['id']}: {w} missing"


def test_units_convert_decimal_and_binary():
    gb = {"metric": "max_allocated", "value": 1.5, "unit": "GB"}
    gib = {"metric": "max_allocated", "value": 1.5, "unit": "GiB"}
    assert corpus.published_bytes(gb) == 1_500_000_000            # 1.5 x 1e9
    assert corpus.published_bytes(gib) == 1_610_612_736           # 1.5 x 2**30
    assert corpus.published_bytes({"metric": "oom", "value": None, "unit": None}) is None


def test_a_bad_row_is_reported():
    bad = {"id": "x", "source": {"name": "s"}, "quote": "", "setting": {}, "metric": "peak", "value": "1",
           "unit": "GB", "gpuwise_args": None, "why_not": None}
    problems = corpus.check_row(bad)
    assert any("setting misses model" in p for p in problems)
    assert any("unknown metric" in p for p in problems)
    assert any("needs why_not" in p for p in problems)
    assert any("source needs" in p for p in problems)


def test_duplicate_ids_are_refused(tmp_path):
    line = (ROOT / "benchmarks/published/litgpt-resource-tables.jsonl").read_text().splitlines()[0]
    (tmp_path / "a.jsonl").write_text(line + "\n" + line + "\n")
    with pytest.raises(ValueError, match="appears 2 times"):
        corpus.load_rows(tmp_path)
