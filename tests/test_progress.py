"""Progress for a watching terminal: the seconds a silent step has taken, redrawn in place."""

from __future__ import annotations

import re
import time

from pocketspec.progress import elapsed_seconds


def test_a_silent_step_counts_its_seconds_in_place_and_ends_its_line(capsys):
    with elapsed_seconds(True, "  tracing"):
        time.sleep(2.4)
    drawn = capsys.readouterr().err
    assert re.fullmatch(r"(\r  tracing \d+ s)+\n", drawn), drawn  # redrawn in place, one line ended at the end
    seconds = [int(number) for number in re.findall(r"(\d+) s", drawn)]
    # 0 at the start, redrawn while the step works (a loaded machine may wake the ticker late: no exact sequence)
    assert seconds[0] == 0 and len(seconds) >= 3 and seconds == sorted(seconds) and seconds[-1] >= 2


def test_nothing_is_drawn_for_a_script(capsys):
    with elapsed_seconds(False, "  tracing"):
        pass
    assert capsys.readouterr().err == ""
