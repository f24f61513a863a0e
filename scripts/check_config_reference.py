#!/usr/bin/env python3
"""Checks the book's configuration reference against config/default.toml, key by key.

config/default.toml holds every key the settings struct reads, set or, for a key unset by
default, as a commented-out example (`# dedup_window = "1m"`), and a table of named tables
(`[sources.NAME]`) as a commented-out example table (`# [sources.github]`, its keys commented
out below it), whose keys the reference names `sources.NAME.key`; it is loaded into `Settings`,
whose sections deny unknown fields, on every start and in the tests. So a key it has and the
reference's table lacks is an undocumented setting, and a key the table names that it lacks is
a documented one that does nothing. The table's first column names keys as `section.key`, with
`a.x` / `y` / `z` for several keys of one section; its other columns are not checked.

  python3 scripts/check_config_reference.py             # exit 1 and a list on any difference
  python3 scripts/check_config_reference.py --self-test # the parser on a sample table
"""

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = ROOT / "config" / "default.toml"
REFERENCE = ROOT / "docs" / "src" / "configuration.md"


def toml_keys(table, prefix=""):
    """Every leaf key of `table`, dotted (`consumer.stale_guard.enabled`)."""
    keys = set()
    for name, value in table.items():
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(value, dict):
            keys |= toml_keys(value, path)
        else:
            keys.add(path)
    return keys


def commented_keys(text):
    """Keys shown as commented-out examples under their `[section]`: `# key = value`; under a
    commented-out example of a named table (`# [sources.github]`), as `sources.NAME.key`."""
    keys, section = set(), ""
    for line in text.splitlines():
        header = re.match(r"^\[([a-z_.]+)\]\s*$", line)
        if header:
            section = header.group(1)
            continue
        named = re.match(r"^#\s?\[([a-z_.]+)\.[a-z0-9_-]+\]\s*$", line)
        if named:
            section = f"{named.group(1)}.NAME"
            continue
        listed = re.match(r"^#\s?\[\[([a-z_.]+)\]\]\s*$", line)
        if listed:
            section = listed.group(1)
            continue
        example = re.match(r"^#\s?([a-z_]+) = \S", line)
        if example:
            name = example.group(1)
            keys.add(f"{section}.{name}" if section else name)
    return keys


def reference_keys(markdown):
    """The keys the reference's table names in its first column."""
    keys = set()
    for line in markdown.splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        names = re.findall(r"`([^`]+)`", first)
        section = ""
        for name in names:
            if "." in name:
                section = name.rsplit(".", 1)[0]
                keys.add(name)
            elif section:
                keys.add(f"{section}.{name}")
            else:
                keys.add(name)
    return keys


def self_test():
    sample = (
        "| key | environment | default | meaning |\n"
        "|---|---|---|---|\n"
        "| `database_url` | `DATABASE_URL` | x | y |\n"
        "| `roles.ingress` / `consumer` | | `true` / `true` | z |\n"
        "| `consumer.stale_guard.enabled` / `types` | | | |\n"
    )
    got = reference_keys(sample)
    want = {
        "database_url",
        "roles.ingress",
        "roles.consumer",
        "consumer.stale_guard.enabled",
        "consumer.stale_guard.types",
    }
    assert got == want, got
    assert toml_keys({"a": 1, "b": {"c": 2, "d": {"e": 3}}}) == {"a", "b.c", "b.d.e"}
    assert commented_keys("# top = 1\n[consumer]\n# the window, see below\n# window_secs = 60\n") == {
        "top",
        "consumer.window_secs",
    }
    assert commented_keys("[a]\n# x = 1\n# [sources.github]\n# scheme = \"github\"\n[b]\n# y = 2\n") == {
        "a.x",
        "sources.NAME.scheme",
        "b.y",
    }
    print("check_config_reference: self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    text = DEFAULTS.read_text()
    defaults = toml_keys(tomllib.loads(text)) | commented_keys(text)
    documented = reference_keys(REFERENCE.read_text())
    undocumented = sorted(defaults - documented)
    unknown = sorted(documented - defaults)
    for key in undocumented:
        print(f"{DEFAULTS.relative_to(ROOT)} has `{key}`, which {REFERENCE.relative_to(ROOT)} does not list")
    for key in unknown:
        print(f"{REFERENCE.relative_to(ROOT)} lists `{key}`, which {DEFAULTS.relative_to(ROOT)} does not have")
    if undocumented or unknown:
        return 1
    print(f"check_config_reference: the {len(defaults)} keys of config/default.toml are the reference's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
