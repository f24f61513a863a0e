#!/usr/bin/env python3
"""Check the relative links of the project's Markdown, and that the book's contents are whole.

Checked files: README.md, RELIABILITY.md, BENCHMARKS.md and every .md file under docs/src/.

* Every relative link resolves: inline links and images (`[x](path)`, `[x](path#anchor)`,
  `[x](#anchor)`) and reference-style definitions (`[label]: path`) name an existing file or
  directory, resolved from the directory of the file that holds the link, as GitHub resolves
  them. A full reference (`[x][label]`) must have its definition.
* Every `#anchor` into a Markdown file (the same one or another) matches one of its headings'
  slugs, by the rule GitHub and mdBook share: the heading's text (code spans, emphasis and
  links reduced to their text) in lower case, every character that is not a letter, a digit,
  `-` or `_` dropped, each space made `-`; a heading that repeats an earlier slug gets `-1`,
  then `-2`. Explicit `id="…"` / `name="…"` HTML anchors count too. Anchors into files that
  are not Markdown (GitHub's `#L10`) are not checked.
* Every chapter file under docs/src/ is listed in docs/src/SUMMARY.md, and every SUMMARY entry
  names a file that exists.

External links (http, https, mailto and other schemes) are not fetched. Fenced code blocks
(``` and ~~~), inline code spans and HTML comments are skipped, so a path in an example is
never taken for a link.

Exit status 1 with one line per problem, `file:line: target (reason)`; 0 with a one-line
summary. `--self-test` builds a temporary tree with one good link and one broken link of each
kind and checks that each broken one, and only those, is reported. `--root DIR` checks another
checkout (default: the repository this script is in).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote

TOP_LEVEL = ("README.md", "RELIABILITY.md", "BENCHMARKS.md")
BOOK_SRC = Path("docs") / "src"
SUMMARY = "SUMMARY.md"

SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*#*[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# `[text](target)` or `![alt](target)`, target bare or in <…>, with an optional title. The text
# may wrap onto the next line, never across a blank one.
INLINE_LINK = re.compile(
    r"!?\[(?P<text>(?:[^\[\]\n]|\n(?![ \t]*\n)|\[[^\[\]\n]*\])*)\]"
    r"\(\s*(?:<(?P<angled>[^<>\n]*)>|(?P<bare>[^\s()]*(?:\([^\s()]*\)[^\s()]*)*))"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^()]*\)))?\s*\)"
)
REFERENCE_DEF = re.compile(
    r"^ {0,3}\[(?P<label>[^\]\n]+)\]:[ \t]*(?:<(?P<angled>[^<>\n]*)>|(?P<bare>\S+))", re.M
)
FULL_REFERENCE = re.compile(r"(?<![\]\\])\[(?P<text>[^\[\]\n]+)\]\[(?P<label>[^\[\]\n]+)\]")
HTML_ANCHOR = re.compile(r"<[A-Za-z][^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']")


class Problem:
    def __init__(self, path: Path, line: int, target: str, reason: str) -> None:
        self.path, self.line, self.target, self.reason = path, line, target, reason

    def render(self, root: Path) -> str:
        return f"{self.path.relative_to(root)}:{self.line}: {self.target} ({self.reason})"


def blank(text: str, start: int, end: int) -> str:
    """`text` with [start, end) replaced by spaces, newlines kept (offsets and lines hold)."""
    middle = "".join("\n" if c == "\n" else " " for c in text[start:end])
    return text[:start] + middle + text[end:]


def without_code(text: str) -> str:
    """Fenced blocks, HTML comments and inline code spans blanked out."""
    text = without_code_blocks_only(text)
    # A code span: a run of backticks closed by a run of the same length, within a paragraph.
    pos = 0
    while True:
        opening = re.compile(r"(?<!`)(`+)(?!`)").search(text, pos)
        if not opening:
            break
        ticks = opening.group(1)
        closing = re.compile(r"(?<!`)" + ticks + r"(?!`)|\n[ \t]*\n").search(text, opening.end())
        if not closing or closing.group(0).startswith("\n"):
            pos = opening.end()  # unmatched: literal backticks
            continue
        text = blank(text, opening.start(), closing.end())
        pos = closing.end()
    return text


def heading_text(raw: str) -> str:
    """The text a heading renders: code spans, links and emphasis reduced to their text."""
    text = re.sub(r"(`+)(.+?)\1", lambda m: m.group(2).strip(), raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("*", "")


def slug(text: str) -> str:
    out = []
    for ch in heading_text(text).strip().lower():
        if ch.isalnum() or ch in "-_":
            out.append(ch)
        elif ch.isspace():
            out.append("-")
    return "".join(out)


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown file's headings and HTML ids give it."""
    clean = without_code_blocks_only(text)
    found: set[str] = set()
    seen: dict[str, int] = {}
    lines = clean.split("\n")
    for i, line in enumerate(lines):
        title = None
        atx = ATX_HEADING.match(line)
        if atx:
            title = atx.group(2) or ""
        elif (
            i > 0
            and SETEXT_UNDERLINE.match(line)
            and lines[i - 1].strip()
            and not lines[i - 1].lstrip().startswith(("|", "-", "*", "+", ">"))
            and not SETEXT_UNDERLINE.match(lines[i - 1])
        ):
            title = lines[i - 1].strip()
        if title is None:
            continue
        base = slug(title)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    found.update(HTML_ANCHOR.findall(clean))
    return found


def without_code_blocks_only(text: str) -> str:
    """Fenced blocks and HTML comments blanked out; code spans kept (headings are made of them)."""
    lines = text.split("\n")
    fence: str | None = None
    for i, line in enumerate(lines):
        if fence is None:
            opened = FENCE_OPEN.match(line)
            if opened:
                fence = opened.group(1)
                lines[i] = ""
        else:
            closing = line.strip()
            if closing and set(closing) == {fence[0]} and len(closing) >= len(fence):
                fence = None
            lines[i] = ""
    text = "\n".join(lines)
    for comment in reversed(list(re.finditer(r"<!--.*?-->", text, re.S))):
        text = blank(text, comment.start(), comment.end())
    return text


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every inline link, image and reference definition outside code."""
    clean = without_code(text)
    found = []
    for m in INLINE_LINK.finditer(clean):
        target = m.group("angled") if m.group("angled") is not None else m.group("bare")
        start = m.start("angled") if m.group("angled") is not None else m.start("bare")
        found.append((clean.count("\n", 0, start) + 1, target))
    for m in REFERENCE_DEF.finditer(clean):
        target = m.group("angled") if m.group("angled") is not None else m.group("bare")
        found.append((clean.count("\n", 0, m.start()) + 1, target))
    return found


def undefined_references(text: str) -> list[tuple[int, str]]:
    clean = without_code(text)
    defined = {m.group("label").strip().lower() for m in REFERENCE_DEF.finditer(clean)}
    return [
        (clean.count("\n", 0, m.start()) + 1, f"[{m.group('text')}][{m.group('label')}]")
        for m in FULL_REFERENCE.finditer(clean)
        if m.group("label").strip().lower() not in defined
    ]


def summary_entries(summary: Path) -> list[tuple[int, str]]:
    return links(summary.read_text(encoding="utf-8"))


def files_to_check(root: Path) -> tuple[list[Path], list[Problem]]:
    problems = []
    files = []
    for name in TOP_LEVEL:
        path = root / name
        if path.is_file():
            files.append(path)
        else:
            problems.append(Problem(root / name, 0, name, "missing file"))
    src = root / BOOK_SRC
    if src.is_dir():
        files.extend(sorted(src.rglob("*.md")))
    else:
        problems.append(Problem(root / BOOK_SRC, 0, str(BOOK_SRC), "missing directory"))
    return files, problems


def check(root: Path) -> tuple[list[Problem], int, int, int]:
    """Problems, files checked, relative links checked, external links skipped."""
    root = root.resolve()
    files, problems = files_to_check(root)
    anchor_cache: dict[Path, set[str]] = {}

    def anchors_of(path: Path) -> set[str]:
        if path not in anchor_cache:
            anchor_cache[path] = anchors(path.read_text(encoding="utf-8"))
        return anchor_cache[path]

    relative = external = 0
    for path in files:
        text = path.read_text(encoding="utf-8")
        for line, target in links(text):
            if not target:
                problems.append(Problem(path, line, "(empty)", "empty link target"))
                continue
            if SCHEME.match(target) or target.startswith("//"):
                external += 1
                continue
            relative += 1
            file_part, _, anchor = target.partition("#")
            if file_part.startswith("/"):
                problems.append(Problem(path, line, target, "absolute path; use a relative one"))
                continue
            if file_part:
                dest = (path.parent / unquote(file_part)).resolve()
                if not dest.exists():
                    problems.append(Problem(path, line, target, "missing file"))
                    continue
                try:
                    dest.relative_to(root)
                except ValueError:
                    problems.append(Problem(path, line, target, "outside the repository"))
                    continue
            else:
                dest = path
            if anchor and dest.is_file() and dest.suffix == ".md":
                if unquote(anchor) not in anchors_of(dest):
                    where = "in this file" if dest == path else f"in {dest.relative_to(root)}"
                    problems.append(Problem(path, line, target, f"no heading {where} has this anchor"))
        for line, reference in undefined_references(text):
            problems.append(Problem(path, line, reference, "reference without a definition"))

    src = root / BOOK_SRC
    summary = src / SUMMARY
    if src.is_dir():
        if not summary.is_file():
            problems.append(Problem(summary, 0, SUMMARY, "missing file"))
        else:
            listed = set()
            for line, target in summary_entries(summary):
                file_part = target.partition("#")[0]
                if not file_part or SCHEME.match(file_part):
                    if not file_part:
                        problems.append(Problem(summary, line, target or "(empty)", "SUMMARY entry without a file"))
                    continue
                dest = (summary.parent / unquote(file_part)).resolve()
                listed.add(dest)
                # A missing file is already reported above, as every link is.
            for chapter in sorted(src.rglob("*.md")):
                if chapter.resolve() != summary.resolve() and chapter.resolve() not in listed:
                    rel = os.path.relpath(chapter, src)
                    problems.append(Problem(chapter, 1, rel, "chapter not listed in SUMMARY.md"))
    problems.sort(key=lambda p: (str(p.path), p.line, p.target))
    return problems, len(files), relative, external


def report(root: Path) -> int:
    problems, files, relative, external = check(root)
    root = root.resolve()
    if problems:
        for problem in problems:
            print(problem.render(root))
        print(f"check_links: {len(problems)} broken in {files} files", file=sys.stderr)
        return 1
    print(
        f"check_links: {files} files, {relative} relative links and anchors resolve, "
        f"every chapter is in SUMMARY.md ({external} external links not fetched)"
    )
    return 0


def self_test() -> int:
    """A tree with one good link of each kind and one broken link of each kind."""
    files = {
        "README.md": (
            "# Project\n\n## Usage\n\n## Usage\n\n"
            "[book](docs/src/intro.md) [usage again](#usage-1) [src](src/) [a file](src/lib.rs)\n"
            "[ref][good] [external](https://example.invalid/nowhere)\n\n"
            "[good]: docs/src/guide/a.md#section-two\n"
            "```sh\n[not a link](missing-in-a-fence.md)\n# Not a heading\n```\n"
            "`[not a link](missing-in-code.md)` and a span over\ntwo lines: `[x](nope.md)\n"
            "still code` end.\n"
            "[missing file](docs/src/nope.md)\n"
            "[missing anchor here](#no-such-heading)\n"
            "[the fence's heading](#not-a-heading)\n"
        ),
        "RELIABILITY.md": "# Reliability\n\n[back](README.md#usage)\n[bad ref]: RELIABILITY-2.md\n",
        "BENCHMARKS.md": "# Benchmarks\n\nSee [`it`](README.md#project) and [this][undefined].\n",
        "src/lib.rs": "// code\n",
        "docs/src/SUMMARY.md": (
            "# Summary\n\n- [Intro](intro.md)\n- [Guide](guide/a.md)\n- [Gone](guide/gone.md)\n"
        ),
        "docs/src/intro.md": (
            "# What it is: `dedup`, *the* [worker](../../README.md)!\n\n"
            "[a](guide/a.md#section-two) [code](../../src/lib.rs)\n"
            "[other anchor](guide/a.md#no-such-section)\n"
        ),
        "docs/src/guide/a.md": "# A\n\n## Section two\n\nText\n\n[up](../intro.md#what-it-is-dedup-the-worker)\n",
        "docs/src/guide/orphan.md": "# Not in the summary\n",
    }
    expected = {
        ("README.md", 18, "docs/src/nope.md", "missing file"),
        ("README.md", 19, "#no-such-heading", "no heading in this file has this anchor"),
        ("README.md", 20, "#not-a-heading", "no heading in this file has this anchor"),
        ("RELIABILITY.md", 4, "RELIABILITY-2.md", "missing file"),
        ("BENCHMARKS.md", 3, "[this][undefined]", "reference without a definition"),
        ("docs/src/SUMMARY.md", 5, "guide/gone.md", "missing file"),
        (
            "docs/src/intro.md",
            4,
            "guide/a.md#no-such-section",
            "no heading in docs/src/guide/a.md has this anchor",
        ),
        ("docs/src/guide/orphan.md", 1, "guide/orphan.md", "chapter not listed in SUMMARY.md"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp).resolve()
        for name, text in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        problems, _, relative, external = check(root)
        got = {(str(p.path.relative_to(root)), p.line, p.target, p.reason) for p in problems}
        failures = []
        for item in sorted(expected - got):
            failures.append(f"not reported: {item}")
        for item in sorted(got - expected):
            failures.append(f"reported wrongly: {item}")
        if external != 1:
            failures.append(f"external links counted: {external}, expected 1")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            exit_status = report(root)
        if exit_status != 1:
            failures.append(f"exit status {exit_status} with broken links, expected 1")
        # The same tree with every broken link removed passes.
        fixed = dict(files)
        fixed["README.md"] = files["README.md"].split("[missing file]")[0]
        fixed["RELIABILITY.md"] = "# Reliability\n\n[back](README.md#usage)\n"
        fixed["BENCHMARKS.md"] = "# Benchmarks\n\nSee [`it`](README.md#project).\n"
        fixed["docs/src/SUMMARY.md"] = (
            "# Summary\n\n- [Intro](intro.md)\n- [Guide](guide/a.md)\n"
            "    - [Orphan](guide/orphan.md)\n"
        )
        fixed["docs/src/intro.md"] = files["docs/src/intro.md"].split("[other anchor]")[0]
        for name, text in fixed.items():
            (root / name).write_text(text, encoding="utf-8")
        problems, _, _, _ = check(root)
        for p in problems:
            failures.append(f"reported in the fixed tree: {p.render(root)}")
    if failures:
        print("check_links self-test FAILED:", file=sys.stderr)
        for failure in failures:
            print(f"  {failure}", file=sys.stderr)
        return 1
    print(
        f"check_links self-test: ok, all {len(expected)} broken links caught (missing file, "
        f"missing anchor in the same file and in another, a heading inside a fence, undefined "
        f"reference, SUMMARY entry without its file, chapter not in SUMMARY), exit status 1; "
        f"{relative} relative links checked, those in code skipped; the fixed tree is clean"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--self-test", action="store_true", help="check the checker")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    return report(args.root)


if __name__ == "__main__":
    sys.exit(main())
