"""How many runs in a row measured a cost table whose repeats disagreed, so that a machine busy at every
start stops measuring at every start.

A table whose repeats disagree (pocketspec/cost_samples.py) is used for the run that measured it and
not cached: the next run measures again, maybe on a quieter machine. On a machine that is never
quiet that meant measuring at every start for good (15-45 s for SmolLM2, about a minute for the
1.5B target on 2 cores). So the runs are counted beside the table (costs/NAME.untrusted.json), and
the MAX_UNTRUSTED_RUNS-th in a row caches its table anyway: the controller corrects each width it
times (pocketspec/learned_costs.py), and `pocketspec doctor --calibrate` measures again on request.
"""

from __future__ import annotations

from pathlib import Path

from pocketspec.measured_cache import read_json, write_json

MAX_UNTRUSTED_RUNS = 3


def _count_path(table_path: Path) -> Path:
    return Path(table_path).with_suffix(".untrusted.json")


def count_untrusted_run(table_path: Path) -> bool:
    """Counts one more run whose table for `table_path` was not trusted (under the home's measuring lock);
    whether it is the MAX_UNTRUSTED_RUNS-th in a row, which caches its table (then forget_untrusted_runs)."""
    counted = read_json(_count_path(table_path))
    runs = counted.get("runs") if isinstance(counted, dict) else None
    runs = (runs if type(runs) is int and 0 <= runs < MAX_UNTRUSTED_RUNS else 0) + 1
    if runs >= MAX_UNTRUSTED_RUNS:
        return True
    write_json(_count_path(table_path), {"runs": runs})  # a home that cannot be written never caches it: said
    return False


def forget_untrusted_runs(table_path: Path) -> None:
    """A trusted table was cached (or an untrusted one, at last): the next disagreement counts from one."""
    try:
        _count_path(table_path).unlink(missing_ok=True)
    except OSError:  # unwritable home: the count stays, and the table is cached where it can be
        pass


def untrusted_ending(is_cached: bool) -> str:
    """How a note that a table's repeats disagreed ends: the likely cause, and what becomes of the table."""
    if is_cached:
        return (f", in {MAX_UNTRUSTED_RUNS} runs in a row (is the machine always this busy?); cached anyway: the "
                "controller corrects each width it times, and `pocketspec doctor --calibrate` measures again")
    return " (is the machine busy?); this run uses them, the next one measures them again"
