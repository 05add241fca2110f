"""From the rows of `pocketspec bench` (results.json) to report.md: a table overall and per
category, with each system's ratio against plain decoding and against each peer (the figures:
apps/bench/figures.py), the standing against the targets, the rounds, and what did not run.
"""

from __future__ import annotations

from apps.bench.figures import (OVERALL, complete_repeats, gpu_systems, rate_ratio, ratio_cell, ratio_spread,
                                rows_by_category, speedups, summarize)
from apps.report import markdown_table

def _peer_names(results: dict) -> list[str]:
    return [system["name"] for system in results["systems"] if system["kind"] == "peer" and system["status"] == "ok"]


def _cell(value, suffix: str = "") -> str:
    return "–" if value is None else f"{value:.2f}{suffix}"


def _table(rows_by_system: dict[str, list[dict]], peers: list[str]) -> str:
    columns = ["system", "prompts", "tok/s", "× plain", *[f"× {peer}" for peer in peers], "acceptance",
               "tokens/step", "γ=0 step ms", "loop ms/step", "common γ", "TTFT s", "peak GiB", "matches plain"]
    rows = []
    for name, own_rows in rows_by_system.items():
        summary = summarize(own_rows)
        ratios = [ratio_cell(own_rows, rows_by_system[other]) if other in rows_by_system else "–"
                  for other in ("plain", *peers)]
        rows.append([name, summary["num_prompts"], _cell(summary["tokens_per_second"]), *ratios,
                     _cell(summary["acceptance_rate"]), _cell(summary["tokens_per_step"]),
                     _cell(summary["plain_step_ms"]), _cell(summary["loop_ms_per_step"]),
                     ",".join(map(str, summary["common_gammas"])) or "–",
                     _cell(summary["ttft_seconds"]), _cell(summary["peak_memory_bytes"] / 2**30),
                     "–" if summary["match_rate"] is None else f"{summary['match_rate']:.0%}"])
    return markdown_table(columns, rows)


def _speedup_matrix(results: dict) -> str:
    grouped = rows_by_category(results)
    systems = [name for name in grouped[OVERALL] if name != "plain"]
    rows = [[category, *[ratio_cell(by_system[name], by_system.get("plain", [])) if name in by_system else "–"
                         for name in systems]]
            for category, by_system in grouped.items()]
    return markdown_table(["category", *systems], rows)


def _target_lines(results: dict) -> list[str]:
    """How each PocketSpec system stands against the issue's targets; stated, never judged here."""
    table = speedups(results)
    overall = rows_by_category(results).get(OVERALL, {})
    lines = []
    for system in results["systems"]:
        if system["kind"] != "pocketspec" or system["name"] not in overall:
            continue
        by_category = {category: values[system["name"]] for category, values in table.items()
                       if category != OVERALL and values.get(system["name"]) is not None}
        if by_category:
            worst = min(by_category, key=by_category.get)
            lines.append(f"{system['name']}: lowest speedup over plain {by_category[worst]:.2f}× ({worst})")
        for peer in _peer_names(results):
            ratio = ratio_cell(overall[system["name"]], overall[peer]) if peer in overall else "–"
            lines.append(f"{system['name']}: {ratio} the tok/s of {peer} overall")
        standing = _best_peer_line(system["name"], rows_by_category(results), _peer_names(results))
        if standing:
            lines.append(standing)
    return lines


def _best_peer_line(name: str, grouped: dict[str, dict[str, list[dict]]], peers: list[str]) -> str | None:
    """How often `name` is at or above every peer of a category (its tok/s over each peer's, over their shared
    rounds), and where it is not, its ratio to the fastest peer there with the spread over repeats: a
    spread that reaches 1.00× is a difference the repeats cannot tell from noise."""
    behind, num_categories = [], 0
    for category, by_system in grouped.items():
        present = [peer for peer in peers if peer in by_system]
        if category == OVERALL or name not in by_system or not present:
            continue
        ratios = {peer: rate_ratio(by_system[name], by_system[peer]) for peer in present}
        ratios = {peer: ratio for peer, ratio in ratios.items() if ratio is not None}
        if not ratios:
            continue
        num_categories += 1
        fastest = min(ratios, key=ratios.get)
        if ratios[fastest] < 1.0:
            spread = ratio_spread(by_system[name], by_system[fastest])
            behind.append((category, fastest, ratio_cell(by_system[name], by_system[fastest]), spread))
    if not num_categories:
        return None
    line = f"{name}: at or above every peer in {num_categories - len(behind)} of {num_categories} categories"
    if behind:
        spreads = [spread for *_, spread in behind if spread is not None]
        within = sum(spread[1] >= 1.0 for spread in spreads)
        noise = f" ({within} of them with a spread that reaches 1.00×)" if spreads else ""  # none without repeats
        line += (f"; below the fastest in {len(behind)}{noise}: "
                 + "; ".join(f"{category} {cell} the tok/s of {peer}" for category, peer, cell, _ in behind))
    return line


def _rounds_lines(results: dict) -> list[str]:
    """How the run was cut into rounds, whether it is complete, and what the rounds cost."""
    rounds = results.get("rounds")
    if rounds is None:
        return []
    lines = [f"Ran in {rounds['num_planned']} rounds (one per category, cut into groups of at most "
             f"{results['settings']['max_prompts_per_round']} prompts): in each, plain decoding first, then every other "
             "system over the same prompts, each in its own process (their order rotating by one place each repeat); "
             "ratios compare rows of the same rounds."]
    if rounds["is_partial"]:
        lines.append(f"**Partial results: the run stopped after {rounds['num_completed']} of {rounds['num_planned']} "
                     "rounds**; only completed rounds are counted.")
        repeats = {row.get("repeat", 0) for row in results["rows"]}
        complete = complete_repeats(results["rows"])
        if repeats - complete:
            counted = f"the {len(complete)} repeats" if len(complete) > 1 else "the repeat"
            lines.append(f"{OVERALL} counts {counted} that ran every prompt; the categories' "
                         "tables also count the rounds of the repeat that was stopped.")
    startups = {system["name"]: system["startup_seconds"] for system in results["systems"]
                if system.get("startup_seconds")}
    if startups:  # each system's first start-up is paid by any run; the later ones are the rounds' price
        extra = sum(sum(seconds[1:]) for seconds in startups.values())
        share = f" ({extra / rounds['wall_seconds']:.1%} of the {rounds['wall_seconds']:.0f} s run)" \
            if rounds.get("wall_seconds") else ""
        lines.append("Start-up of each worker process, once per system per round (imports, model load from the page "
                     "cache, warm-up; not timed), mean: "
                     + ", ".join(f"{name} {sum(seconds) / len(seconds):.1f} s" for name, seconds in startups.items())
                     + f"; the rounds after the first added {extra:.1f} s{share}.")
    return lines


def _huge_pages_lines(results: dict, peers: list[str]) -> list[str]:
    state = results.get("machine", {}).get("doctor", {}).get("huge_pages")
    if state is None:
        return []
    peers_note = "; llama.cpp's peers ran with the environment the bench was given, as a user runs them" if peers else ""
    return [f"Huge pages for PocketSpec's processes (pocketspec/huge_pages.py): {state}{peers_note}."]


def learned_curve_table(rows: list[dict]) -> str | None:
    """A PocketSpec system's verify cost by width, × one row: its calibrated table against what its
    controller learned by its last prompt (the last round's worker), and how often each width was timed."""
    curves = [row["verify_costs"] for row in rows if row.get("verify_costs")]
    if not curves:
        return None
    last = curves[-1]
    calibrated, learned = last["calibrated_seconds"], last["learned_seconds"]
    table_rows = [[width, f"{calibrated[index] / calibrated[0]:.2f}", f"{learned[index] / learned[0]:.2f}",
                   f"{1000 * learned[index]:.0f}", last["num_timed"][index]]
                  for index, width in enumerate(last["widths"])]
    return markdown_table(["rows", "calibrated × one row", "learned × one row", "learned ms", "times timed"],
                          table_rows)


def _learned_curve_sections(grouped: dict) -> list[str]:
    body = []
    for name, rows in grouped.get(OVERALL, {}).items():
        table = learned_curve_table(rows)
        if table is not None:
            depth = next(row["verify_costs"]["depth"] for row in reversed(rows) if row.get("verify_costs"))
            body += [f"### {name}: verify cost by width at {depth} cached tokens", "", table, ""]
    return (["## What the controller learned of the cost curve", "",
             "The calibrated table (POCKETSPEC_HOME/costs) beside the costs the controller had learned by the end "
             "of the last round: the calibration's errors, and how far the run corrected them.", ""] + body
            if body else [])


def _peak_meaning(results: dict) -> str:
    on_gpu = gpu_systems(results)
    resident = "the resident memory of the process that ran the system"
    if not on_gpu:
        return resident
    return f"{resident}, but for {', '.join(on_gpu)}: torch's allocator peak over the GPUs it used"


def _rows_kept(system: dict, grouped: dict) -> str:
    if system["name"] in grouped.get(OVERALL, {}):  # plain: the rounds before its failure still compare
        return "its rows of the rounds before are kept"
    return "no rows: every system is compared over the same prompts"


def build_report(results: dict, plot_names: list[str] = ()) -> str:
    """report.md: settings, the overall table, the speedup matrix, one table per category, plots."""
    settings = results["settings"]
    peers = _peer_names(results)
    grouped = rows_by_category(results)
    is_partial = results.get("rounds", {}).get("is_partial", False)
    body = [f"# PocketSpec bench: {settings['suite_name']}" + (" (partial)" if is_partial else ""), "",
            f"Command: `{settings['command']}`", "",
            f"Target `{settings['target']}`, draft model `{settings['draft'] or 'none'}`, "
            f"backend {settings['backend']}, "
            f"temperature {settings['temperature']}, {settings['max_tokens']} new tokens, "
            f"{settings['num_prompts']} prompts, {settings['num_threads']} threads, "
            f"context {settings['max_context']}.", "",
            "tok/s is the decode rate (the decode steps' tokens, an end-of-generation token included, over their "
            "time; prompt processing excluded); TTFT is the prompt's processing time; "
            f"peak is {_peak_meaning(results)} (the most over its rounds); ratios "
            "compare summed tokens over summed seconds.", ""]
    body += [line for text in _rounds_lines(results) + _huge_pages_lines(results, peers) for line in (text, "")]
    if OVERALL not in grouped:
        body += ["No round completed: nothing was measured.", ""]
    else:
        body += ["## Overall", "", _table(grouped[OVERALL], peers), "",
                 "## Speedup over plain decoding, by category", "", _speedup_matrix(results), ""]
    targets = _target_lines(results)
    if targets:
        body += ["## Against the targets", ""] + [f"- {line}" for line in targets] + [""]
    for category, by_system in grouped.items():
        if category != OVERALL:
            body += [f"## {category}", "", _table(by_system, peers), ""]
    body += _learned_curve_sections(grouped)
    not_run = [system for system in results["systems"] if system["status"] == "skipped"]
    if not_run:
        body += ["## Not run", ""] + [f"- {system['name']}: {system['reason']}" for system in not_run] + [""]
    failed = [system for system in results["systems"] if system["status"] == "failed"]
    if failed:
        body += ["## Failed", ""] + [f"- {system['name']}: {system['reason']} ({_rows_kept(system, grouped)})"
                                     for system in failed] + [""]
    notes = [note for system in results["systems"] for note in system.get("notes", [])] + results.get("notes", [])
    if notes:
        body += ["## Notes", ""] + [f"- {note}" for note in notes] + [""]
    body += [f"![{name}]({name})" for name in plot_names]
    return "\n".join(body).rstrip() + "\n"
