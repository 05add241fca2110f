"""Writing a benchmark's results: one JSON file with everything and one Markdown table."""

from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone
from pathlib import Path


def machine_description() -> dict:
    import psutil

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "num_cpus": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def markdown_table(columns: list[str], rows: list[list]) -> str:
    def cell(value) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(out_dir: Path, name: str, payload: dict, title: str, columns: list[str], rows: list[list],
                  notes: list[str] = ()) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine_description(), **payload}
    json_path = out_dir / f"{name}.json"
    json_path.write_text(json.dumps(payload, indent=1))
    markdown_path = out_dir / f"{name}.md"
    body = [f"# {title}", "", markdown_table(columns, rows), ""] + [f"- {note}" for note in notes]
    markdown_path.write_text("\n".join(body) + "\n")
    return json_path, markdown_path
