"""How much of the PyTorch API that real programs use flowgraph provides: the coverage table in docs/migration.md.

The yardstick (``tools/api_yardstick.txt``) lists the public torch names used by nanoGPT, minGPT, makemore,
pytorch/examples and timm's basic models, one qualified name per line, grouped by program. Each name is
looked up in flowgraph by replacing the leading ``torch`` with ``flowgraph`` (importing submodules as
needed, then ``getattr``; ``torch.Tensor.x``, ``torch.nn.Module.x`` and ``torch.optim.Optimizer.x`` are also
looked up on an instance, for attributes set in ``__init__``). ``tools/api_reasons.toml`` says which names
flowgraph provides under another name (``[renamed]``, checked the same way), which it deliberately does
not provide and why (``[not_provided]``), and which torch names each "not available" entry of the guide
stands for (``[guide]``). Everything else that does not resolve is reported as missing.

    python tools/api_coverage.py            # print the table
    python tools/api_coverage.py --write    # regenerate it in docs/migration.md (between the coverage markers)
    python tools/api_coverage.py --check    # exit 1 if the doc is stale or the reasons file is inconsistent

The script imports only flowgraph (never torch), so its result does not depend on torch being installed.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pathlib
import sys
import tomllib
import types
from collections.abc import Callable
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[1]
YARDSTICK = ROOT / "tools" / "api_yardstick.txt"
REASONS = ROOT / "tools" / "api_reasons.toml"
DOC = ROOT / "docs" / "migration.md"
START, END = "<!-- coverage:start -->", "<!-- coverage:end -->"
COMMAND = "python tools/api_coverage.py --write"

# Display groups, most specific prefix first; a name belongs to the first group whose prefix it starts with.
GROUPS = [
    ("torch.Tensor", "torch.Tensor."),
    ("torch.nn.Module", "torch.nn.Module."),
    ("torch.nn.functional", "torch.nn.functional."),
    ("torch.nn.init", "torch.nn.init."),
    ("torch.nn.utils", "torch.nn.utils."),
    ("torch.nn", "torch.nn."),
    ("torch.optim", "torch.optim."),
    ("torch.utils.data", "torch.utils.data."),
    ("torch", "torch."),
]
STATUS_ORDER = ["available", "other name", "not provided", "missing"]


def _samples() -> dict[str, Callable[[], object]]:
    """Instances on which instance attributes of a class are looked up (``module.training``, ``t.grad``)."""
    import flowgraph as fg
    from flowgraph import nn, optim

    return {
        "flowgraph.Tensor": lambda: fg.zeros(1),
        "flowgraph.nn.Module": lambda: nn.Module(),
        "flowgraph.optim.Optimizer": lambda: optim.SGD([nn.Parameter(fg.zeros(1))], lr=0.1),
    }


_MISSING = object()


def _inside(module: types.ModuleType, package: str) -> bool:
    """Whether ``module``'s file lies in the directory of the imported ``package``: an editable install's
    import hook can otherwise serve a submodule missing from this checkout from another copy of the tree."""
    roots = [pathlib.Path(p).resolve() for p in getattr(sys.modules[package], "__path__", [])]
    origin = getattr(module, "__file__", None)
    return origin is not None and any(pathlib.Path(origin).resolve().is_relative_to(r) for r in roots)


def lookup(qualified: str) -> object:
    """The object ``qualified`` (``flowgraph.a.B.c``) names, or ``_MISSING``: getattr from the top package,
    importing a submodule where an attribute is absent, and trying an instance for the classes in
    ``_samples()``. A ``name(keyword=)`` suffix also requires that keyword in the object's signature."""
    keyword = None
    if qualified.endswith("=)"):
        qualified, _, keyword = qualified[:-2].partition("(")
    parts = qualified.split(".")
    try:
        obj = importlib.import_module(parts[0])
    except Exception:  # noqa: BLE001 - a package that cannot be imported provides nothing
        return _MISSING
    samples = _samples()
    for i, part in enumerate(parts[1:], start=1):
        prefix = ".".join(parts[:i])
        try:
            obj = getattr(obj, part)
            if isinstance(obj, types.ModuleType) and not _inside(obj, parts[0]):
                return _MISSING
            continue
        except AttributeError:
            pass
        except Exception:  # noqa: BLE001 - a lazy attribute that fails to load is not provided
            return _MISSING
        if prefix in samples:
            try:
                obj = getattr(samples[prefix](), part)
                continue
            except AttributeError:
                return _MISSING
        try:
            obj = importlib.import_module(f"{prefix}.{part}")
        except Exception:  # noqa: BLE001 - ImportError, or an optional dependency failing to load
            return _MISSING
        if not _inside(obj, parts[0]):
            return _MISSING
    if keyword is not None:
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):
            return _MISSING
        if keyword not in params:
            return _MISSING
    return obj


def provided(qualified: str) -> bool:
    """Whether ``lookup(qualified)`` finds something other than a module: yardstick names are functions,
    classes and attributes, so a same-named flowgraph module (``fg.dtype``, the dtype module) is no match."""
    obj = lookup(qualified)
    return obj is not _MISSING and not isinstance(obj, types.ModuleType)


def counterpart(torch_name: str) -> str:
    """The flowgraph name a torch name would have: ``torch.nn.Linear`` -> ``flowgraph.nn.Linear``."""
    if not torch_name.startswith("torch."):
        raise ValueError(f"yardstick names start with 'torch.', got {torch_name!r}")
    return "flowgraph" + torch_name[len("torch"):]


def short(flowgraph_name: str) -> str:
    """``flowgraph.nn.Linear`` -> ``fg.nn.Linear`` for display."""
    return "fg" + flowgraph_name[len("flowgraph"):] if flowgraph_name.startswith("flowgraph.") else flowgraph_name


def group_of(name: str) -> str:
    """The display group of a torch name (see ``GROUPS``)."""
    for group, prefix in GROUPS:
        if name.startswith(prefix):
            return group
    raise ValueError(f"{name!r} is not a torch name")


def read_yardstick(path: pathlib.Path = YARDSTICK) -> dict[str, list[str]]:
    """``{program: [names]}`` in file order; a program starts at a ``# == <program> (...)`` comment."""
    programs: dict[str, list[str]] = {}
    current = None
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.strip()
        if line.startswith("# == "):
            current = line[len("# == "):].split(" (")[0]
            programs[current] = []
        elif line and not line.startswith("#"):
            if current is None:
                raise ValueError(f"{path}:{number}: a name before the first '# == <program>' header")
            counterpart(line)  # validates the form
            programs[current].append(line)
    return programs


@dataclass
class Reasons:
    """The contents of ``api_reasons.toml``."""

    renamed: dict[str, str] = field(default_factory=dict)
    not_provided: dict[str, str] = field(default_factory=dict)
    guide: dict[str, list[str]] = field(default_factory=dict)


def read_reasons(path: pathlib.Path = REASONS) -> Reasons:
    """Parse the reasons file (tables ``renamed``, ``not_provided`` and ``guide``)."""
    data = tomllib.loads(path.read_text())
    unknown = set(data) - {"renamed", "not_provided", "guide"}
    if unknown:
        raise ValueError(f"{path}: unknown tables {sorted(unknown)}; expected renamed, not_provided, guide")
    return Reasons(dict(data.get("renamed", {})), dict(data.get("not_provided", {})), dict(data.get("guide", {})))


@dataclass
class Row:
    """One torch name's coverage."""

    name: str
    programs: list[str]
    status: str  # one of STATUS_ORDER
    note: str = ""  # the flowgraph name for 'other name', the reason for 'not provided'


def classify(programs: dict[str, list[str]], reasons: Reasons) -> tuple[list[Row], list[str]]:
    """Every yardstick name's row (sorted by name), and the problems that make ``--check`` fail: a reason
    or rename for a name flowgraph now provides under torch's name, a rename whose target does not exist, and
    entries for names that are not in the yardstick."""
    used_by: dict[str, list[str]] = {}
    for program, names in programs.items():
        for name in names:
            used_by.setdefault(name, [])
            if program not in used_by[name]:
                used_by[name].append(program)
    rows, problems = [], []
    for name in sorted(used_by):
        if provided(counterpart(name)):
            rows.append(Row(name, used_by[name], "available"))
            for table in ("renamed", "not_provided"):
                if name in getattr(reasons, table):
                    problems.append(f"{name}: flowgraph now provides {short(counterpart(name))}; remove it from "
                                    f"[{table}] in {REASONS.name}")
        elif name in reasons.renamed:
            target = reasons.renamed[name]
            if not provided(target):
                problems.append(f"{name}: [renamed] target {target} does not exist in flowgraph")
                rows.append(Row(name, used_by[name], "missing"))
            else:
                rows.append(Row(name, used_by[name], "other name", short(target)))
        elif name in reasons.not_provided:
            rows.append(Row(name, used_by[name], "not provided", reasons.not_provided[name]))
        else:
            rows.append(Row(name, used_by[name], "missing"))
    for table in ("renamed", "not_provided"):
        for name in sorted(set(getattr(reasons, table)) - set(used_by)):
            problems.append(f"{name}: in [{table}] of {REASONS.name} but not in {YARDSTICK.name}")
    return rows, problems


def guide_status(reasons: Reasons) -> list[tuple[str, list[str], list[str]]]:
    """``(entry, names now provided, names still absent)`` for each of the guide's "not available" entries."""
    out = []
    for entry, names in reasons.guide.items():
        have = [n for n in names if provided(counterpart(n))]
        out.append((entry, have, [n for n in names if n not in have]))
    return out


def _code(names) -> str:
    return ", ".join(f"`{n}`" for n in names)


def render(programs: dict[str, list[str]], rows: list[Row], guide: list[tuple[str, list[str], list[str]]]) -> str:
    """The Markdown between the coverage markers."""
    out = [
        f"Generated by `{COMMAND}` from `tools/api_yardstick.txt` (the public torch names that nanoGPT, minGPT,",
        "makemore, pytorch/examples and timm's basic models use) and `tools/api_reasons.toml` (what flowgraph",
        "provides under another name, and what it leaves out on purpose, with the reason). A test runs",
        "`python tools/api_coverage.py --check`, so this table cannot go stale. *Available*: flowgraph has the",
        "name with `torch` replaced by `fg` (`torch.nn.Linear` -> `fg.nn.Linear`, `torch.Tensor.view` ->",
        "`fg.Tensor.view`).",
        "",
        "| program | names used | available | other name | not provided | missing |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    status = {r.name: r.status for r in rows}
    for program, names in list(programs.items()) + [("all (distinct names)", sorted(status))]:
        distinct = sorted(set(names))
        counts = [sum(status[n] == s for n in distinct) for s in STATUS_ORDER]
        pct = f" ({100 * counts[0] / len(distinct):.0f}%)" if distinct else ""
        out.append(f"| {program} | {len(distinct)} | {counts[0]}{pct} | " + " | ".join(map(str, counts[1:])) + " |")

    out += ["", "By namespace:", "", "| namespace | names used | available | other name | not provided | missing |",
            "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for group, _ in GROUPS:
        members = [r for r in rows if group_of(r.name) == group]
        if members:
            counts = [sum(r.status == s for r in members) for s in STATUS_ORDER]
            out.append(f"| `{group}` | {len(members)} | " + " | ".join(map(str, counts)) + " |")

    out += ["", "Names not available under torch's name:", "",
            "| torch name | status | flowgraph / why | used by |", "| --- | --- | --- | --- |"]
    for s in STATUS_ORDER[1:]:
        for r in rows:
            if r.status == s:
                out.append(f"| `{r.name}` | {s} | {r.note} | {', '.join(r.programs)} |")

    out += ["", "The entries of the lists \"Not available yet\" and \"Not in flowgraph\" above (and of the",
            "sections on data loading, checkpoints and optimizers), checked against flowgraph as it is now:", "",
            "| entry in this guide | now | torch names checked |", "| --- | --- | --- |"]
    for entry, have, absent in guide:
        now = "available" if not absent else ("partly" if have else "not available")
        checked = ", ".join([f"`{n}` (yes)" for n in have] + [f"`{n}` (no)" for n in absent])
        out.append(f"| {entry} | {now} | {checked} |")

    out += ["", "<details><summary>Available names, by namespace</summary>", ""]
    for group, prefix in GROUPS:
        names = [r.name[len(prefix):] for r in rows if r.status == "available" and group_of(r.name) == group]
        if names:
            out.append(f"- `{group}`: {_code(names)}")
    out += ["", "</details>"]
    return "\n".join(out)


def splice(doc: str, table: str) -> str:
    """``doc`` with the text between the coverage markers replaced by ``table``."""
    if doc.count(START) != 1 or doc.count(END) != 1 or doc.index(START) > doc.index(END):
        raise ValueError(f"{DOC.name} must contain {START} and then {END}, once each")
    head, rest = doc.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{table}\n{END}{tail}"


def build(yardstick: pathlib.Path = YARDSTICK, reasons_path: pathlib.Path = REASONS) -> tuple[str, list[str]]:
    """The generated table and the reasons file's problems."""
    programs = read_yardstick(yardstick)
    reasons = read_reasons(reasons_path)
    rows, problems = classify(programs, reasons)
    return render(programs, rows, guide_status(reasons)), problems


def main(argv: list[str] | None = None, doc_path: pathlib.Path = DOC) -> int:
    """Command line: print, ``--write`` or ``--check`` (exit status 1 on a stale doc or inconsistent reasons)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="regenerate the table in docs/migration.md")
    mode.add_argument("--check", action="store_true", help="fail if docs/migration.md's table is stale")
    args = parser.parse_args(argv)
    table, problems = build()
    for problem in problems:
        print(f"api_reasons.toml: {problem}", file=sys.stderr)
    if args.write:
        doc_path.write_text(splice(doc_path.read_text(), table))
        print(f"wrote the coverage table into {doc_path}")
        return 1 if problems else 0
    if args.check:
        doc = doc_path.read_text()
        if splice(doc, table) != doc:
            print(f"{doc_path}: the coverage table is stale; run `{COMMAND}`", file=sys.stderr)
            return 1
        return 1 if problems else 0
    print(table)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # run from a checkout: the flowgraph next to this script
    sys.exit(main())
