"""What a session's controller learned about this machine's cost tables, kept for the next session.

A cost table (pocketspec/calibrate.py) is measured once. The controller then corrects it from
the passes it times, and explores the widths the table may price wrong
(pocketspec/speculation/costs.py). Kept in one process only, that learning was paid for again
by every process: each `pocketspec generate`, and each round of `pocketspec bench`, explored
the same widths at the same price. Replayed on the recorded answers in the bench's rounds
(benchmarks/replay_drafting.py --fresh-rounds), that price was 1.2 % of the speed on the EPYC's
table and 3-4 % in the categories that draft little, where it made speculation slower than plain
decoding.

So a session keeps its table's learned corrections in POCKETSPEC_HOME beside the table
(costs/NAME.learned.json), tied to the table's numbers (a table measured again starts afresh),
and the next session on that table starts from them. A file that cannot be read or written
costs only the head start.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from memplanner.measured_costs import MeasuredCosts
from pocketspec.calibrate import cost_table_path
from pocketspec.measured_cache import read_json, write_json
from pocketspec.speculation.costs import CostTable


def learned_costs_path(costs: MeasuredCosts) -> Path:
    return cost_table_path(costs.key).with_suffix(".learned.json")


def _table_fingerprint(costs: MeasuredCosts) -> str:
    return hashlib.sha1(json.dumps(costs.to_json()["seconds"], sort_keys=True).encode()).hexdigest()[:20]


def adopt_learned_costs(table: CostTable) -> bool:
    """Starts `table` from what an earlier session on the same calibrated table learned; whether there was any."""
    if table.measured is None:
        return False
    kept = read_json(learned_costs_path(table.measured))
    if not isinstance(kept, dict) or kept.get("table") != _table_fingerprint(table.measured):
        return False
    try:
        table.adopt(kept.get("learned"))
    except ValueError:
        return False
    return True


def keep_learned_costs(table: CostTable) -> bool:
    """Keeps what `table` learned for the next session; whether it was written (nothing to keep, or a home
    that cannot be written: False)."""
    learned = table.learned()
    if learned is None or not table.num_observed:  # nothing timed in this session: nothing new to keep
        return False
    return write_json(learned_costs_path(table.measured),
                      {"table": _table_fingerprint(table.measured), "learned": learned})
