"""Every ```python block in docs/tutorials/*.md and docs/migration.md runs against the real package.

Blocks of one file run in order in one fresh namespace (like notebook cells), with the working directory
in a temporary folder. Fence info strings:

* ```python          runs;
* ```python no-run   is shown only (needs a GPU, serves forever ...); the text around it says why;
* ```python torch    the PyTorch side of a migration pair: runs in its own namespace (also in order) when
  torch is importable, and is skipped otherwise.

A failing block fails the test with the file, the block's first line number and the traceback.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import time
import traceback

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [p for p in sorted((ROOT / "docs" / "tutorials").glob("*.md")) + [ROOT / "docs" / "migration.md"]
        if p.exists()]
FENCE = re.compile(r"^```(.*)$")
KINDS = {"python": "run", "python no-run": "no-run", "python torch": "torch"}
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _rel(path: pathlib.Path) -> pathlib.Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def blocks(path: pathlib.Path) -> list[tuple[str, int, str]]:
    """``(kind, first code line number, source)`` for every ```python fence of ``path``."""
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m.group(1).strip():
            info, start = m.group(1).strip(), i + 1
            j = start
            while j < len(lines) and lines[j].strip() != "```":
                j += 1
            if j == len(lines):
                raise AssertionError(f"{_rel(path)}:{i + 1}: unclosed ``` fence")
            if info.startswith("python"):
                if info not in KINDS:
                    raise AssertionError(f"{_rel(path)}:{i + 1}: unknown fence {info!r}; "
                                         f"use one of {sorted(KINDS)}")
                out.append((KINDS[info], start + 1, "\n".join(lines[start:j])))
            i = j + 1
        else:
            i += 1
    return out


def run_blocks(path: pathlib.Path, selected: list[tuple[int, str]]) -> list[tuple[int, float]]:
    """Run ``selected`` blocks in order in one namespace; returns ``(line, seconds)`` per block."""
    rel = _rel(path)
    namespace: dict = {"__name__": f"docs_{path.stem.replace('-', '_')}"}
    times = []
    for line, source in selected:
        # Padded so that tracebacks show the markdown file's own line numbers and lines.
        code = compile("\n" * (line - 1) + source, str(path), "exec")
        start = time.perf_counter()
        failure = None
        try:
            exec(code, namespace)
        except BaseException as exc:  # noqa: BLE001 - reported with the block's location
            # The traceback without this harness's frame: it starts in the markdown file.
            failure = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next))
        if failure is not None:
            pytest.fail(f"{rel}: the block at line {line} failed:\n{failure}", pytrace=False)
        times.append((line, time.perf_counter() - start))
    return times


def test_every_tutorial_is_there():
    names = [p.name for p in DOCS if p.parent.name == "tutorials"]
    for i in range(12):
        assert any(n.startswith(f"{i:02d}-") for n in names), f"docs/tutorials/{i:02d}-*.md is missing"
    assert (ROOT / "docs" / "migration.md").exists()


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_doc_blocks_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = blocks(path)
    runnable = [(line, src) for kind, line, src in found if kind == "run"]
    assert runnable, f"{_rel(path)} has no runnable ```python block"
    import flowgraph as fg

    fg.manual_seed(0)
    times = run_blocks(path, runnable)
    slow = [(line, round(s, 1)) for line, s in times if s > 5.0]
    if slow:
        print(f"{path.name}: blocks over 5 s (line, seconds): {slow}")


@pytest.mark.parametrize("path", [p for p in DOCS if any(k == "torch" for k, _, _ in blocks(p))],
                         ids=lambda p: p.name)
def test_doc_torch_blocks_run(path, tmp_path, monkeypatch):
    if not HAS_TORCH:
        pytest.skip("torch is not installed: the PyTorch side of the migration pairs is not run")
    monkeypatch.chdir(tmp_path)
    run_blocks(path, [(line, src) for kind, line, src in blocks(path) if kind == "torch"])


def test_harness_names_the_failing_block_and_keeps_one_namespace(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("text\n```python\nvalue = 41\n```\n\n```python no-run\nraise SystemExit\n```\n"
                   "```python\nvalue += 1\nassert value == 41, 'boom'\n```\n")
    found = blocks(doc)
    assert [(kind, line) for kind, line, _ in found] == [("run", 3), ("no-run", 7), ("run", 10)]
    with pytest.raises(pytest.fail.Exception) as info:
        run_blocks(doc, [(line, src) for kind, line, src in found if kind == "run"])
    message = str(info.value)
    assert "the block at line 10 failed" in message and "AssertionError: boom" in message
    assert f'"{doc}", line 11' in message                    # the traceback points into the markdown file


def test_harness_rejects_unknown_fences(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("```python no_run\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="unknown fence 'python no_run'"):
        blocks(doc)


LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_relative_links_resolve(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)   # code blocks
    text = re.sub(r"`[^`\n]*`", "", text)                                     # inline code
    broken = []
    for target in LINK.findall(text):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        file = target.split("#", 1)[0]
        if file and not (path.parent / file).exists():
            broken.append(target)
    assert not broken, f"{_rel(path)}: links to missing files: {broken}"
