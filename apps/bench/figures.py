"""The figures of `pocketspec bench`'s report, from the rows of results.json: rates, ratios between
systems over the rounds both completed, their spread over repeats, per-system summaries, and the rows
grouped by category (OVERALL: every category, over the repeats that ran every prompt).

A ratio between two systems compares only rows of the rounds both completed (rows carry
their round; rows without one count as one round), so both sides were measured at the
same time. With --repeats, each ratio is also computed within every repeat, and shown with the
lowest and highest of those, (min–max): a difference smaller than that spread is noise. Pure
functions of the results dict, tested on a small fake results file.
"""

from __future__ import annotations

from collections import defaultdict

OVERALL = "ALL"


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if numerator and denominator else None


def _rate(rows: list[dict]) -> float:
    decode_seconds = sum(row["decode_seconds"] for row in rows)
    return sum(row["num_decode_tokens"] for row in rows) / decode_seconds if decode_seconds else 0.0


def rate_ratio(rows: list[dict], reference_rows: list[dict]) -> float | None:
    """tok/s of rows over tok/s of reference_rows, both taken over the rounds both have rows in."""
    shared = {row.get("round") for row in rows} & {row.get("round") for row in reference_rows}
    return _ratio(_rate([row for row in rows if row.get("round") in shared]),
                  _rate([row for row in reference_rows if row.get("round") in shared]))


def ratio_spread(rows: list[dict], reference_rows: list[dict]) -> tuple[float, float] | None:
    """(lowest, highest) of the ratio computed within each repeat; None with fewer than two repeats."""
    repeats = sorted({row.get("repeat", 0) for row in rows} & {row.get("repeat", 0) for row in reference_rows})
    if len(repeats) < 2:
        return None
    ratios = [rate_ratio([row for row in rows if row.get("repeat", 0) == repeat],
                         [row for row in reference_rows if row.get("repeat", 0) == repeat]) for repeat in repeats]
    ratios = [ratio for ratio in ratios if ratio is not None]
    return (min(ratios), max(ratios)) if len(ratios) >= 2 else None


def ratio_cell(rows: list[dict], reference_rows: list[dict]) -> str:
    """'1.25×', or '1.25× (1.18–1.31)' with the spread over repeats."""
    ratio = rate_ratio(rows, reference_rows)
    if ratio is None:
        return "–"
    spread = ratio_spread(rows, reference_rows)
    return f"{ratio:.2f}×" + ("" if spread is None else f" ({spread[0]:.2f}–{spread[1]:.2f})")


def summarize(rows: list[dict]) -> dict:
    """One system's rows over some prompts: rates from summed tokens and seconds, not mean rates."""
    counted = [row for row in rows if row.get("num_drafted") is not None]
    drafted = sum(row["num_drafted"] for row in counted)
    accepted = sum(row["num_accepted"] for row in counted)
    steps = sum(row["num_steps"] for row in counted)
    # the tokens the steps yielded: accepted drafts past an end token or --max-tokens are verified, not output
    yielded = sum(row["num_decode_tokens"] for row in counted)
    matches = [row["matches_plain"] for row in rows if row.get("matches_plain") is not None]
    plain_steps = sum(row.get("steps_by_drafter", {}).get("none", 0) for row in rows)
    plain_step_seconds = sum(row.get("step_seconds_by_drafter", {}).get("none", 0.0) for row in rows)
    timed = [row for row in counted if row.get("loop_seconds") is not None]
    timed_steps = sum(row["num_steps"] for row in timed)
    gammas: dict[int, int] = defaultdict(int)
    for row in rows:
        for gamma, count in row.get("steps_by_gamma", {}).items():
            gammas[int(gamma)] += count
    return {
        "num_prompts": len({row.get("prompt_id") for row in rows}),  # each once, whatever the repeats
        "tokens_per_second": _rate(rows),
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_per_step": accepted / steps if steps else None,
        "ttft_seconds": sum(row["ttft_seconds"] for row in rows) / len(rows),
        "peak_memory_bytes": max(row["peak_memory_bytes"] for row in rows),
        "match_rate": sum(matches) / len(matches) if matches else None,
        "tokens_per_step": yielded / steps if steps else None,
        # mean time of a step that drafted nothing: what speculation costs where it cannot help
        "plain_step_ms": 1000 * plain_step_seconds / plain_steps if plain_steps else None,
        # time a step spends outside the model forwards: the speculative loop's own overhead
        "loop_ms_per_step": 1000 * sum(row["loop_seconds"] for row in timed) / timed_steps if timed_steps else None,
        "common_gammas": sorted(gammas, key=gammas.get, reverse=True)[:3],
    }


def complete_repeats(rows: list[dict]) -> set[int]:
    """The repeats that ran every prompt any repeat ran: a run stopped within a repeat (--repeats) leaves its
    last one short of some categories, which would weigh the others double in OVERALL and skew its spread."""
    prompts_by_repeat: dict[int, set] = defaultdict(set)
    for row in rows:
        prompts_by_repeat[row.get("repeat", 0)].add(row.get("prompt_id"))
    every_prompt = set().union(*prompts_by_repeat.values())
    complete = {repeat for repeat, prompts in prompts_by_repeat.items() if prompts == every_prompt}
    return complete or set(prompts_by_repeat)  # repeats of different prompts (not the bench's own): all count


def rows_by_category(results: dict) -> dict[str, dict[str, list[dict]]]:
    """{category: {system: rows}}, categories in suite order and OVERALL last (the complete repeats' rows),
    systems in their order."""
    grouped: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in results["rows"]:
        grouped[row["category"]][row["system"]].append(row)
    complete = complete_repeats(results["rows"])
    for row in results["rows"]:
        if row.get("repeat", 0) in complete:
            grouped[OVERALL][row["system"]].append(row)
    order = [system["name"] for system in results["systems"]]
    return {category: {name: by_system[name] for name in order if name in by_system}
            for category, by_system in grouped.items()}


def summaries_by_category(results: dict) -> dict[str, dict[str, dict]]:
    """{category: {system: summary}}, categories in suite order and OVERALL last."""
    return {category: {name: summarize(rows) for name, rows in by_system.items()}
            for category, by_system in rows_by_category(results).items()}


def speedups(results: dict) -> dict[str, dict[str, float | None]]:
    """{category: {system: tok/s ÷ plain tok/s}} for every system but plain, over shared rounds."""
    return {category: {name: rate_ratio(rows, by_system.get("plain", [])) for name, rows in by_system.items()
                       if name != "plain"}
            for category, by_system in rows_by_category(results).items()}


def gpu_systems(results: dict) -> list[str]:
    """The systems whose peak is torch's GPU allocator peak (bench/worker.py), in their order."""
    names = {row["system"] for row in results["rows"] if row.get("peak_gpu_bytes") is not None}
    return [system["name"] for system in results["systems"] if system["name"] in names]
