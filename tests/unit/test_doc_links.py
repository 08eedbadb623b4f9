"""Every relative link in README.md and docs/**/*.md leads to a file (and heading) that
exists, and the README's two commands are scripts of this checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"`[^`]*`")


def _prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans (links there are not links)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(_CODE_SPAN.sub("", line))
    return "\n".join(lines)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-``/``_`` dropped,
    spaces to ``-``."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (a repeated heading gets ``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        m = re.match(r"^#{1,6} (.+)$", line)
        if fenced or not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    targets = _LINK.findall(_prose(path.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_the_docs_exist() -> None:
    assert (ROOT / "README.md") in DOCS and len(DOCS) > 10


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    """The checker itself: a missing file and a missing heading are both caught."""
    (tmp_path / "a.md").write_text("# Title\n\n## Two `words`\n", encoding="utf-8")
    doc = tmp_path / "b.md"
    doc.write_text("[ok](a.md#two-words) [bad](c.md) [bad2](a.md#three) `[code](x.md)`\n"
                   "```\n[fenced](y.md)\n```\n[web](https://example.org/z.md)\n", encoding="utf-8")
    assert relative_links(doc) == ["a.md#two-words", "c.md", "a.md#three"]
    assert anchors(tmp_path / "a.md") == {"title", "two-words"}


def test_the_readme_commands_are_scripts_of_this_checkout() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].split() for line in block.strip().splitlines()]
    assert [c[:2] for c in commands] == [["bash", "deploy/demo.sh"], ["bash", "deploy/test.sh"]]
    for _, script in commands:
        assert (ROOT / script).is_file(), script
    assert "bash deploy/test.sh" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
