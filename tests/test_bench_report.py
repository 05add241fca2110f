"""The bench report on a small fake results file whose ratios are worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from apps.bench.figures import OVERALL, complete_repeats, speedups, summaries_by_category, summarize
from apps.bench.report import build_report

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


def test_report_states_where_each_system_falls_behind_the_fastest_peer(results):
    report = build_report(results)
    assert "- pocketspec-auto: at or above every peer in 2 of 2 categories\n" in report
    assert ("- pocketspec-auto@1GiB: at or above every peer in 1 of 2 categories; below the fastest in 1: "
            "writing 0.95× the tok/s of llama.cpp-speculative\n") in report  # no repeats: no spread to speak of


def test_a_deficit_the_repeats_cannot_tell_from_noise_is_counted_as_such(results):
    for row in results["rows"]:  # writing's two prompts become two repeats of one prompt
        if row["category"] == "writing":
            seen = [other for other in results["rows"] if other["category"] == "writing"
                    and other["system"] == row["system"]].index(row)
            row["repeat"] = row["round"] = seen
            if row["system"] == "pocketspec-auto@1GiB" and seen == 1:
                row["decode_seconds"] = 5.9  # 16.1 tok/s in the second repeat against the peer's 16
    report = build_report(results)
    assert ("below the fastest in 1 (1 of them with a spread that reaches 1.00×): "
            "writing 0.98× (0.95–1.01) the tok/s of llama.cpp-speculative") in report


def test_no_peer_columns_without_peers(results):
    results["systems"] = [system for system in results["systems"] if system["kind"] != "peer"]
    results["rows"] = [row for row in results["rows"] if row["system"] != "llama.cpp-speculative"]
    overall = table_rows(build_report(results), "Overall")
    assert not any(column.startswith("× llama") for column in overall["plain"])


def test_categories_keep_suite_order_with_overall_last(results):
    assert list(summaries_by_category(results)) == ["coding", "writing", OVERALL]


def test_ratios_compare_only_the_rounds_both_systems_completed(results):
    round_of = {"1": 0, "2": 1, "3": 2, "4": 2}
    for row in results["rows"]:
        row["round"] = round_of[row["prompt_id"]]
        if row["system"] == "plain" and row["prompt_id"] == "2":
            row["decode_seconds"] = 10.0  # the machine was slow during round 1
    results["rows"] = [row for row in results["rows"]
                       if not (row["system"] == "pocketspec-auto" and row["round"] == 1)]
    table = speedups(results)
    assert table["coding"]["pocketspec-auto"] == pytest.approx(2.0)  # round 0 only, not 20 / (100 / 15)
    assert table[OVERALL]["pocketspec-auto"] == pytest.approx((240 / 12.5) / (250 / 15))
    assert table["coding"]["pocketspec-auto@1GiB"] == pytest.approx((100 / 6.25) / (100 / 15))  # both rounds
    overall = table_rows(build_report(results), "Overall")
    assert overall["pocketspec-auto"]["× plain"] == f"{(240 / 12.5) / (250 / 15):.2f}×"


def test_partial_report_says_so_with_the_rounds_completed_and_their_start_up_cost(results):
    results["settings"]["max_prompts_per_round"] = 5
    results["rounds"] = {"num_planned": 3, "num_completed": 1, "is_partial": True, "wall_seconds": 100.0}
    results["systems"][0]["startup_seconds"] = [2.0, 1.0]
    results["systems"][1]["startup_seconds"] = [3.0]
    report = build_report(results)
    assert report.startswith("# PocketSpec bench: fake.jsonl (partial)\n")
    assert "Ran in 3 rounds (one per category, cut into groups of at most 5 prompts)" in report
    assert "**Partial results: the run stopped after 1 of 3 rounds**" in report
    # each system's later start-ups as measured (the first one can be slower: a fresh cost table, a cold cache)
    assert "mean: plain 1.5 s, pocketspec-auto 3.0 s; the rounds after the first added 1.0 s (1.0% of the 100 s run)" \
        in report


def test_report_of_a_run_stopped_before_its_first_round_ended(results):
    results["settings"]["max_prompts_per_round"] = 5
    results["rounds"] = {"num_planned": 2, "num_completed": 0, "is_partial": True, "wall_seconds": 3.0}
    results["rows"] = []
    report = build_report(results)
    assert "stopped after 0 of 2 rounds" in report and "No round completed: nothing was measured." in report
    assert "## Overall" not in report


def _row(system: str, repeat: int, tokens: int, seconds: float, **extra) -> dict:
    return {"system": system, "category": "coding", "round": repeat, "repeat": repeat, "num_decode_tokens": tokens,
            "decode_seconds": seconds, **extra}


def test_a_ratio_over_repeats_comes_with_its_lowest_and_highest_repeat():
    from apps.bench.figures import ratio_cell, ratio_spread

    plain = [_row("plain", 0, 100, 10.0), _row("plain", 1, 100, 10.0), _row("plain", 2, 100, 10.0)]
    spec = [_row("spec", 0, 100, 8.0), _row("spec", 1, 100, 5.0), _row("spec", 2, 100, 4.0)]
    assert ratio_spread(spec, plain) == pytest.approx((1.25, 2.5))
    assert ratio_cell(spec, plain) == f"{300 / 17 / 10:.2f}× (1.25–2.50)"
    assert ratio_cell(spec[:1], plain[:1]) == "1.25×"  # one repeat: no spread to show
    assert ratio_spread(spec, plain[:1]) is None  # only the repeats both systems ran count


def test_the_report_shows_the_calibrated_curve_beside_the_learned_one(results):
    from apps.bench.report import learned_curve_table

    curve = {"depth": 512, "widths": [1, 2, 16], "calibrated_seconds": [0.03, 0.06, 0.3],
             "learned_seconds": [0.036, 0.06, 0.24], "num_timed": [40, 9, 5]}
    table = learned_curve_table([_row("spec", 0, 10, 1.0), _row("spec", 0, 10, 1.0, verify_costs=curve)])
    assert "| 16 | 10.00 | 6.67 | 240 | 5 |" in table
    results["rows"] = [{**row, "verify_costs": curve} if row["system"] == "pocketspec-auto" else row
                       for row in results["rows"]]
    report = build_report(results)
    assert "### pocketspec-auto: verify cost by width at 512 cached tokens" in report


def test_tokens_per_step_counts_the_tokens_output_not_drafts_accepted_past_the_end(results):
    """A last step that accepts 4 drafts after the end token yields the end token alone: counting the drafts
    made 10 steps look like 14 tokens where 12 came out."""
    row = {**results["rows"][4], "num_steps": 10, "num_accepted": 4, "num_drafted": 8, "num_decode_tokens": 12}
    summary = summarize([row])
    assert summary["tokens_per_step"] == pytest.approx(1.2) and summary["acceptance_rate"] == pytest.approx(0.5)


def test_a_run_stopped_within_a_repeat_leaves_that_repeat_out_of_the_overall_ratio(results):
    """Repeat 2 ran coding only: pooled into ALL, coding weighed double and ALL's spread mixed a coding-only
    ratio with a both-categories one."""
    first = [{**row, "repeat": 0, "round": 0 if row["category"] == "coding" else 1} for row in results["rows"]]
    second = [{**row, "repeat": 1, "round": 2, "decode_seconds": row["decode_seconds"] / 4}
              for row in results["rows"] if row["category"] == "coding"]
    results["rows"] = first + second
    results["settings"]["max_prompts_per_round"] = 5
    results["rounds"] = {"num_planned": 4, "num_completed": 3, "is_partial": True, "wall_seconds": 100.0}
    assert complete_repeats(results["rows"]) == {0}
    report = build_report(results)
    assert table_rows(report, "Overall")["pocketspec-auto"]["× plain"] == "1.29×"  # the first repeat alone
    assert table_rows(report, "coding")["pocketspec-auto"]["× plain"] == "2.00× (2.00–2.00)"
    assert "ALL counts the repeat that ran every prompt" in report
    assert table_rows(report, "Overall")["plain"]["prompts"] == "4"  # prompts, not rows of every repeat


def test_a_failed_system_is_not_listed_as_not_run(results):
    results["systems"][0].update(status="failed", reason="round writing: plain worker exited with status 1")
    results["rows"] = [row for row in results["rows"] if row["category"] == "coding"]
    report = build_report(results)
    assert "## Failed\n\n- plain: round writing: plain worker exited with status 1 (its rows of the rounds before " \
           "are kept)" in report
    assert "## Not run\n\n- transformers-assisted: transformers is not installed\n\n" in report


def test_peak_memory_is_named_for_what_each_system_measured(results):
    assert "peak is the resident memory of the process that ran the system (the most" in build_report(results)
    for row in results["rows"]:
        if row["system"] == "pocketspec-auto":
            row["peak_gpu_bytes"] = row["peak_memory_bytes"]
    assert "but for pocketspec-auto: torch's allocator peak over the GPUs it used" in build_report(results)
