"""The GPU suite's Markdown: its results (benchmarks/gpu_suite.py) as one screen of tables."""

from __future__ import annotations

from gpu_suite_group import VERIFY_WIDTHS


def markdown(results: dict) -> str:
    lines = [f"# GPU suite on {results['device']}", "",
             f"torch {results['torch']}; copy bandwidth {results['bandwidth_bytes_per_second'] / 1e9:.0f} GB/s; "
             f"batch 1, context {results['context']}; {results['seconds']:.0f} s in all.", "",
             *([results["note"], ""] if results.get("note") else []),
             *(_draws_lines(results["draws"]) if "draws" in results else []),
             "| model | weights | decode step | open s | tok/s | roofline tok/s | of roofline | note |",
             "|---|---|---|---|---|---|---|---|"]
    for row in results["rows"]:
        step = row["variant"] + (" (cached compile)" if row.get("cached") else "")
        if "error" in row:
            lines.append(f"| {row['model']} | {row['weights']} | {step} | | | | | {row['error'][:120]} |")
            continue
        notes = list(row.get("notes") or [])
        if "tokens" in row:
            notes.append(f"greedy tokens first differ at {row['first_difference']}, "
                         f"{len(row['wrong_verdicts'])} wrong verdicts")
        lines.append(f"| {row['model']} | {row['weights']} | {step} | {row['open_seconds']:.1f} | "
                     f"{row['tokens_per_second']:.1f} | {row['roofline_tokens_per_second']:.0f} | "
                     f"{row['efficiency']:.1%} | {'; '.join(notes)} |")
    for row in results["rows"]:
        if "verify" not in row:
            continue
        lines += ["", f"## Verify curve: {row['model']} {row['weights']} {row['variant']} (ms; replay = the graph alone)",
                  "", "| depth | " + " | ".join(f"w={width}" for width in VERIFY_WIDTHS) + " | w=16 / w=1 |",
                  "|---|" + "---|" * (len(VERIFY_WIDTHS) + 1)]
        for depth, widths in row["verify"]["verify_ms"].items():
            replays = row["verify"]["replay_ms"][depth]
            cells = [f"{widths[width]:.3f} ({replays[width]:.3f})" for width in widths]
            lines.append(f"| {depth} | " + " | ".join(cells) + f" | {widths['16'] / widths['1']:.2f} |")
    for row in results["rows"]:
        if "speculation" not in row:
            continue
        lines += ["", f"## Speculative loop: {row['model']} {row['weights']} {row['variant']} (greedy, a prompt that "
                      "repeats itself; loop = the step outside the forwards: drafting, the controller, bookkeeping)",
                  "", "| drafter | decode tok/s | ms a step | loop ms a step | loop share of the step | acceptance |",
                  "|---|---|---|---|---|---|"]
        for drafter, found in row["speculation"].items():
            lines.append(f"| {drafter} | {found['decode_tokens_per_second']} | {found['step_ms']} | "
                         f"{found['loop_ms_per_step']} | {found['loop_share']:.1%} | {found['acceptance']:.2f} |")
    for row in results["rows"]:
        if "sampled_verify" in row:
            lines += _sampled_lines(row)
    for replay in results.get("predicted", []):
        if "error" in replay:
            lines += ["", f"Predicted on {replay['trace']} ({replay.get('table')}): {replay['error'][:300]}"]
            continue
        speedups = ", ".join(f"{category} {found['speedup']:.2f}×" for category, found in replay["summary"].items())
        lines += ["", f"Predicted × plain on {replay['trace']} (replay_drafting, γ auto, on the "
                      f"{replay.get('table')} compiled verify curve): {speedups}"]
        overall = replay["summary"].get("all", {})
        if "host_ms_per_step" in overall:  # timed on this machine's CPU, beside the table's step
            host, step = overall["host_ms_per_step"], overall["step_ms"]
            lines.append(f"The engine's own work on this host: {host:.3f} ms a step beside the {step:.3f} ms the "
                         f"table predicts for its forwards ({host / (host + step):.1%} of a step)"
                         + (f", and {overall['request_host_ms']:.2f} ms a request (indexing its prompt, remembering "
                            "its output)." if "request_host_ms" in overall else "."))
    return "\n".join(lines) + "\n"


def _draws_lines(found: dict) -> list[str]:
    if "error" in found:
        return [f"Device draws against the host's: {found['error']}", ""]
    rows = found["rows"]
    return [f"Device draws against the host's (seeded sampling, docs/exactness.md): uniforms bit-equal in "
            f"{found['uniform_rows_equal']}/{rows} rows of the vocabulary; the same token drawn in "
            f"{found['draws_equal_t1']}/{rows} rows at temperature 1 and {found['draws_equal_top_p']}/{rows} "
            "with top-p 0.9.", ""]


def _sampled_lines(row: dict) -> list[str]:
    found = row["sampled_verify"]
    lines = ["", f"## Sampled verify: {row['model']} {row['weights']} {row['variant']} (depth {found['depth']}; "
                 "temperature 0.8, top-p 0.95, on the device outside the graph; peak = the allocator's beyond what "
                 "was allocated before the call; planned = the torch plan's term for the sampled temporaries)", "",
             "| width | greedy ms | sampled ms | sampled − greedy ms | greedy peak MiB | sampled peak MiB | planned MiB |",
             "|---|---|---|---|---|---|---|"]
    for width, sampled in found["ms"]["sampled"].items():
        greedy = found["ms"]["greedy"][width]
        peaks = [found["peak_bytes"][name][width] for name in ("greedy", "sampled")]
        peak_cells = " | ".join("–" if peak is None else f"{peak / 2**20:.1f}" for peak in peaks)
        lines.append(f"| {width} | {greedy:.3f} | {sampled:.3f} | {sampled - greedy:.3f} | {peak_cells} | "
                     f"{found['planned_bytes'][width] / 2**20:.1f} |")
    return lines
