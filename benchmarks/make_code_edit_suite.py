"""Build benchmarks/data/code_edit.jsonl: edit requests on real functions from CPython's standard library.

The functions are taken verbatim from the standard library of the Python running this script
(Python Software Foundation License; see benchmarks/data/CODE_EDIT_SOURCE). Nobody here wrote
them, and the instructions are mechanical, so the suite tunes nothing toward PocketSpec.
Each row is one edit (category: rename, type_hints, docstring, api_change); rows of category
`multi_turn` have a second turn that asks to modify the first reply.

    python benchmarks/make_code_edit_suite.py [--per-category 8] [--seed 0] [--out FILE]

Another seed draws other functions: a held-out suite for checking that a change helps edits nobody
tuned it on (write it outside benchmarks/data with --out).
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import sys
import sysconfig
from pathlib import Path

MODULES = ("textwrap.py", "shlex.py", "fnmatch.py", "difflib.py", "string.py", "csv.py", "calendar.py",
           "ipaddress.py", "fractions.py", "statistics.py", "heapq.py", "bisect.py", "base64.py",
           "configparser.py", "argparse.py", "glob.py", "posixpath.py", "gettext.py", "quopri.py", "uu.py")
MIN_LINES, MAX_LINES = 12, 45
OUT = Path(__file__).resolve().parent / "data" / "code_edit.jsonl"


def _functions(path: Path) -> list[tuple[str, str, list[str]]]:
    """(name, source, parameter names) of every top-level function of a usable size."""
    text = path.read_text(encoding="utf-8")
    found = []
    for node in ast.parse(text).body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("__"):
            continue
        source = ast.get_source_segment(text, node)
        num_lines = source.count("\n") + 1 if source else 0
        params = [arg.arg for arg in node.args.args if arg.arg not in ("self", "cls")]
        if MIN_LINES <= num_lines <= MAX_LINES and params:
            found.append((node.name, source, params))
    return found


def _instruction(kind: str, name: str, params: list[str], rng: random.Random) -> str:
    if kind == "rename":
        param = rng.choice(params)
        return (f"Rename the parameter `{param}` of `{name}` to `{param}_value` everywhere it is used, and "
                "change nothing else. Reply with the complete updated function only.")
    if kind == "type_hints":
        return f"Add Python type hints to every parameter and the return value of `{name}`. Reply with the complete function only."
    if kind == "docstring":
        return (f"Write a Google-style docstring for `{name}` (Args, Returns) and put it in the function. "
                "Reply with the complete function only.")
    param = params[-1]
    return (f"Make `{param}` a keyword-only parameter of `{name}` (add `*` before it) and keep the body the same. "
            "Reply with the complete function only.")


def build(per_category: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    candidates = [(module, *function) for module in MODULES if (stdlib / module).exists()
                  for function in _functions(stdlib / module)]
    rng.shuffle(candidates)
    rows, kinds = [], ("rename", "type_hints", "docstring", "api_change", "multi_turn")
    for index, (module, name, source, params) in enumerate(candidates[:per_category * len(kinds)]):
        kind = kinds[index % len(kinds)]
        first_kind = rng.choice(kinds[:4]) if kind == "multi_turn" else kind
        turn = f"```python\n{source}\n```\n\n{_instruction(first_kind, name, params, rng)}"
        row = {"id": f"code-edit-{index:03d}", "category": kind, "turns": [turn],
               "source": f"CPython {sys.version.split()[0]} Lib/{module}:{name}"}
        if kind == "multi_turn":
            row["turns"].append(f"Now also rename the function `{name}` to `{name}_v2` in your version. "
                                "Reply with the complete function only.")
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-category", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = build(args.per_category, args.seed)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
