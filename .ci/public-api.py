#!/usr/bin/env python3
"""The library's public API, as rustdoc lists it, against the committed listing.

Reads `target/doc/subloop/all.html` (written by `cargo doc --no-deps
--all-features`), the page that lists every public item of the crate, and
compares its items with `docs/public-api.txt`. A difference fails, printing
what was added and removed: a change of the public surface is then made on
purpose, with the listing regenerated (`python3 .ci/public-api.py --write`)
and the change noted in CHANGELOG.md.
"""

import html
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "target" / "doc" / "subloop" / "all.html"
LISTING = ROOT / "docs" / "public-api.txt"
HEADER = (
    "# The public items of the subloop library (all features), one per line:\n"
    "# kind and path, as `cargo doc --no-deps --all-features` lists them.\n"
    "# Regenerate with `python3 .ci/public-api.py --write` after `cargo doc`.\n"
)


def items(page: str) -> list[str]:
    """`kind path` for every item of rustdoc's all-items page."""
    found = []
    # Sections: <h3 id="structs">Structs</h3><ul class="all-items">…</ul>
    for section in re.finditer(r'<h3 id="([a-z-]+)">.*?</h3>\s*<ul class="all-items">(.*?)</ul>', page, re.S):
        kind = section.group(1).rstrip("s") if section.group(1) != "macros" else "macro"
        kind = {"type-aliase": "type", "attribute-macro": "attr", "derive-macro": "derive"}.get(kind, kind)
        for link in re.finditer(r"<a [^>]*>(.*?)</a>", section.group(2), re.S):
            path = html.unescape(re.sub(r"<[^>]+>", "", link.group(1))).strip()
            found.append(f"{kind} {path}")
    return sorted(set(found))


def main() -> int:
    if not PAGE.exists():
        print(f"public-api: {PAGE} is missing; run `cargo doc --no-deps --all-features` first", file=sys.stderr)
        return 2
    now = items(PAGE.read_text(encoding="utf-8"))
    if not now:
        print(f"public-api: no item found in {PAGE}; has rustdoc's page changed shape?", file=sys.stderr)
        return 2
    if "--write" in sys.argv[1:]:
        LISTING.write_text(HEADER + "".join(f"{line}\n" for line in now), encoding="utf-8")
        print(f"public-api: {len(now)} items written to {LISTING.relative_to(ROOT)}")
        return 0
    committed = [
        line
        for line in LISTING.read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    ] if LISTING.exists() else []
    added = sorted(set(now) - set(committed))
    removed = sorted(set(committed) - set(now))
    print(f"public-api: {len(now)} public items")
    if not added and not removed:
        return 0
    for line in added:
        print(f"  + {line}")
    for line in removed:
        print(f"  - {line}")
    print(
        "public-api: the public API differs from docs/public-api.txt; if the change is meant, "
        "run `python3 .ci/public-api.py --write` and say what changed in CHANGELOG.md",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
