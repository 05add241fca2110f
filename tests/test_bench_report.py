"""The bench report on a small fake results file whose ratios are worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.bench_report import OVERALL, build_report, speedups, summaries_by_category

RESULTS_PATH = Path(__file__).parent / "data" / "bench_results_small.json"


@pytest.fixture
def results() -> dict:
    return json.loads(RESULTS_PATH.read_text())


def table_rows(report: str, section: str) -> dict[str, list[str]]:
    """The rows of the first table under `## section`, keyed by their first cell."""
    lines = report.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0].splitlines()
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if line.startswith("|")]
    header, rows = cells[0], cells[2:]
    return {row[0]: dict(zip(header, row)) for row in rows}


def test_rates_are_summed_tokens_over_summed_seconds(results):
    summaries = summaries_by_category(results)
    assert summaries["coding"]["plain"]["tokens_per_second"] == pytest.approx(10.0)
    assert summaries[OVERALL]["plain"]["tokens_per_second"] == pytest.approx(300 / 20)
    assert summaries[OVERALL]["pocketspec-auto"]["acceptance_rate"] == pytest.approx(64 / 100)
    assert summaries[OVERALL]["pocketspec-auto"]["mean_accepted_per_step"] == pytest.approx(64 / 226)
    assert summaries[OVERALL]["pocketspec-auto"]["match_rate"] == pytest.approx(0.75)
    assert summaries[OVERALL]["plain"]["acceptance_rate"] is None  # nothing drafted


def test_speedups_against_plain_per_category(results):
    table = speedups(results)
    assert table["coding"]["pocketspec-auto"] == pytest.approx(2.0)
    assert table["writing"]["pocketspec-auto"] == pytest.approx(0.95)
    assert table["writing"]["llama.cpp-speculative"] == pytest.approx(0.8)
    assert table[OVERALL]["pocketspec-auto"] == pytest.approx((290 / 15) / 15)
    assert "plain" not in table[OVERALL]


def test_report_tables_show_ratios_against_plain_and_each_peer(results):
    report = build_report(results, ["speedup.png", "frontier.png"])
    overall = table_rows(report, "Overall")
    assert list(overall) == ["plain", "pocketspec-auto", "pocketspec-auto@1GiB", "llama.cpp-speculative"]
    assert overall["pocketspec-auto"]["× plain"] == "1.29×"
    assert overall["pocketspec-auto"]["× llama.cpp-speculative"] == "1.34×"
    assert overall["pocketspec-auto"]["matches plain"] == "75%"
    assert overall["pocketspec-auto"]["peak GiB"] == "1.50"
    assert overall["plain"]["acceptance"] == "–"
    coding = table_rows(report, "coding")
    assert coding["pocketspec-auto"]["× llama.cpp-speculative"] == "1.60×"
    assert coding["pocketspec-auto@1GiB"]["× plain"] == "1.60×"
    assert table_rows(report, "writing")["pocketspec-auto"]["matches plain"] == "50%"
    matrix = table_rows(report, "Speedup over plain decoding, by category")
    assert matrix["writing"]["pocketspec-auto"] == "0.95×"
    assert matrix[OVERALL]["llama.cpp-speculative"] == f"{(260 / 18) / 15:.2f}×"


def test_report_states_targets_skipped_systems_notes_and_plots(results):
    report = build_report(results, ["speedup.png", "frontier.png"])
    assert "pocketspec-auto: lowest speedup over plain 0.95× (writing)" in report
    assert "pocketspec-auto: 1.34× the tok/s of llama.cpp-speculative overall" in report
    assert "- transformers-assisted: transformers is not installed" in report
    assert "- llama.cpp-speculative: n-max 3" in report
    assert "`pocketspec bench --pair qwen-coder --per-category 2`" in report
    assert "![speedup.png](speedup.png)" in report and "![frontier.png](frontier.png)" in report


def test_no_peer_columns_without_peers(results):
    results["systems"] = [system for system in results["systems"] if system["kind"] != "peer"]
    results["rows"] = [row for row in results["rows"] if row["system"] != "llama.cpp-speculative"]
    overall = table_rows(build_report(results), "Overall")
    assert not any(column.startswith("× llama") for column in overall["plain"])


def test_categories_keep_suite_order_with_overall_last(results):
    assert list(summaries_by_category(results)) == ["coding", "writing", OVERALL]
