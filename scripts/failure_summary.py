"""Prints, from a `cargo test` log, a short summary of every failed test: its name, where it
panicked and the first lines of its message.

CI shows only the end of a long output. A failed test's message (a timeout's "waiting for ...",
an assertion's values) comes before libtest's list of failures and, in the integration tests,
before the binary's whole log, so it is cut. scripts/test.sh prints this summary last.

    python3 scripts/failure_summary.py LOG [--lines N]
    python3 scripts/failure_summary.py --self-test
"""

import re
import sys

# libtest's block for a failed test: "---- name stdout ----", then what the test printed,
# then the panic ("thread 'name' panicked at file:line:col:" and the message lines).
HEADER = re.compile(r"^---- (\S+) stdout ----$")
PANIC = re.compile(r"^thread '.*'(?: \(\d+\))? panicked at (.+):$")
# Where a block ends: the next block, or libtest's list of failures.
END = re.compile(r"^(---- \S+ stdout ----|failures:|test result: )")
MAX_WIDTH = 240


def summarise(log_lines, lines_per_test=4, max_tests=4):
    """The summary's lines: a header, then per failed test its name, panic location and the
    first `lines_per_test` non-empty message lines (each cut to MAX_WIDTH characters)."""
    failures = []
    current = None
    for line in log_lines:
        line = line.rstrip("\n")
        header = HEADER.match(line)
        if header:
            current = {"name": header.group(1), "at": None, "message": []}
            failures.append(current)
            continue
        if current is None:
            continue
        if END.match(line):
            current = None
            continue
        panic = PANIC.match(line)
        if panic and current["at"] is None:
            current["at"] = panic.group(1)
            continue
        if current["at"] is not None and line.strip() and not line.startswith("note: "):
            if len(current["message"]) < lines_per_test:
                current["message"].append(line[:MAX_WIDTH])
    if not failures:
        return []
    out = [f"[failure summary] {len(failures)} failed test(s); first lines of each message:"]
    for failure in failures[:max_tests]:
        out.append(f"* {failure['name']} (panicked at {failure['at'] or 'unknown'})")
        out.extend(f"    {m}" for m in failure["message"])
    if len(failures) > max_tests:
        out.append(f"* and {len(failures) - max_tests} more (see above)")
    return out


def self_test():
    log = """running 2 tests
test a::one ... ok
test b::two ... FAILED

failures:

---- b::two stdout ----
thread 'b::two' (28536) panicked at tests/it/b.rs:12:5:
timed out after 90s waiting for 100 good messages; delivered 99, dead 6
missing: ["evt_good_042"]
the binary logged:
line 1
line 2
note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace


failures:
    b::two

test result: FAILED. 1 passed; 1 failed
""".splitlines()
    got = summarise(log, lines_per_test=3)
    want = [
        "[failure summary] 1 failed test(s); first lines of each message:",
        "* b::two (panicked at tests/it/b.rs:12:5)",
        "    timed out after 90s waiting for 100 good messages; delivered 99, dead 6",
        '    missing: ["evt_good_042"]',
        "    the binary logged:",
    ]
    assert got == want, got
    assert summarise(["test a ... ok", "test result: ok."]) == []
    print("failure_summary self-test: ok")


def main(argv):
    if argv[1:] == ["--self-test"]:
        self_test()
        return 0
    path = argv[1]
    lines_per_test = int(argv[3]) if len(argv) > 3 and argv[2] == "--lines" else 4
    with open(path, encoding="utf-8", errors="replace") as log:
        summary = summarise(log, lines_per_test=lines_per_test)
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
