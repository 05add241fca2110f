"""Progress for a watching terminal: the seconds a silent step has taken, redrawn in place."""

from __future__ import annotations

import re
import time

from pocketspec.progress import elapsed_seconds


def test_a_silent_step_counts_its_seconds_in_place_and_ends_its_line(capsys):
    with elapsed_seconds(True, "  tracing"):
        time.sleep(2.4)
    drawn = capsys.readouterr().err
    assert drawn.startswith("\r  tracing 0 s\r  tracing 1 s\r")  # redrawn while the step works
    assert re.search(r"\r  tracing [23] s\n$", drawn) and drawn.count("\n") == 1


def test_nothing_is_drawn_for_a_script(capsys):
    with elapsed_seconds(False, "  tracing"):
        pass
    assert capsys.readouterr().err == ""
