"""What serve_bench.py's runs add up to: each system's throughput, latency percentiles and
acceptance over its requests (over every round), the report's rows and notes, and the plot."""

from __future__ import annotations

import statistics
from pathlib import Path

from memplanner import format_bytes


def summarize_requests(done: list[dict], errors: list[str], seconds: float) -> dict:
    """Throughput, latency percentiles and acceptance over the requests of one or more replays."""
    tokens = sum(request["tokens"] for request in done)
    ttfts = [request["ttft"] for request in done if request["ttft"] is not None]
    itls = [request["itl"] for request in done if request["itl"] is not None]
    drafted, accepted = (sum(request[key] for request in done) for key in ("drafted", "accepted"))
    return {"requests": len(done), "errors": errors, "tokens": tokens, "seconds": seconds,
            "drafted": drafted, "accepted": accepted,
            "tok_per_s": tokens / seconds, "ttft_p50": _percentile(ttfts, 50), "ttft_p99": _percentile(ttfts, 99),
            "itl_p50": _percentile(itls, 50), "itl_p99": _percentile(itls, 99), "done": done}


def merge_rounds(runs: list[dict]) -> dict:
    """One system's runs at one N over every round, as one replay of all their requests."""
    merged = summarize_requests([request for run in runs for request in run["done"]],
                                [error for run in runs for error in run["errors"]], sum(run["seconds"] for run in runs))
    merged["rounds"] = len(runs)
    merged["tok_per_s_by_round"] = [run["tok_per_s"] for run in runs]
    peaks = [run["peak_memory_bytes"] for run in runs if run.get("peak_memory_bytes")]
    merged["peak_memory_bytes"] = max(peaks) if peaks else None
    return merged


def _percentile(values: list[float], percent: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


def summarize(results: dict, clients: list[int], budget_bytes: int | None) -> tuple[list[list], list[str]]:
    rows, notes = [], []
    for system, by_clients in results.items():
        for num_clients in clients:
            run = by_clients.get(str(num_clients))
            if run is None:
                continue
            peak = run.get("peak_memory_bytes")
            rows.append([system, num_clients, run["requests"], f"{run['tok_per_s']:.2f}",
                         *(f"{run[key]:.3f}" if run[key] is not None else "–"
                           for key in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")),
                         f"{run['accepted'] / run['drafted']:.2f}" if run.get("drafted") else "–",
                         format_bytes(peak) if peak else "–", len(run["errors"])])
    for num_clients in clients:
        def rate(system: str) -> float | None:
            run = results.get(system, {}).get(str(num_clients))
            return run["tok_per_s"] if run else None

        ours, plain = rate("pocketspec"), rate("pocketspec-none")
        peers = [value for value in (rate("llama-server"), rate("llama-server-md")) if value]
        if ours and peers:
            notes.append(f"N={num_clients}: pocketspec {ours / max(peers):.2f}x llama-server's better configuration")
        if ours and plain:
            notes.append(f"N={num_clients}: pocketspec with drafting {ours / plain:.2f}x without")
    for system, by_clients in results.items():
        one, four = by_clients.get("1"), by_clients.get("4")
        if one and four:
            notes.append(f"{system}: N=4 throughput {four['tok_per_s'] / one['tok_per_s']:.2f}x N=1")
        if budget_bytes and system.startswith("pocketspec"):
            over = [n for n, run in by_clients.items() if (run.get("peak_memory_bytes") or 0) > budget_bytes]
            notes.append(f"{system}: peak memory inside the budget at every N" if not over else
                         f"{system}: peak memory OVER the budget at N={','.join(over)}")
    return rows, notes


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    figure, axis = pyplot.subplots(figsize=(6, 4))
    for system, by_clients in results.items():
        points = sorted((int(n), run["tok_per_s"]) for n, run in by_clients.items())
        axis.plot([n for n, _ in points], [rate for _, rate in points], marker="o", label=system)
    axis.set_xlabel("concurrent clients")
    axis.set_ylabel("output tok/s")
    axis.set_xscale("log", base=2)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path)
