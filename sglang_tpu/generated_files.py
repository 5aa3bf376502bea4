"""Files generated from one source: rewrite those that differ, or with `--check` name them.

The operator's generator (`python -m tpuserve_operator.build.generate`) and the observability
generator (`python -m tpuserve.observability.generate`) both run `main` over their own files;
it lives here because both packages may import `sglang_tpu` and neither may import the other.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

# Path relative to the repository root -> the text the file must hold.
Files = Mapping[Path, str]


def read(path: Path) -> str:
    """A file's text, or "" when there is no file."""
    return path.read_text(encoding="utf-8") if path.exists() else ""


def stale(files: Files, root: Path) -> list[Path]:
    """The paths whose file under `root` does not hold its text."""
    return [path for path, text in files.items() if read(root / path) != text]


def main(
    argv: list[str] | None,
    *,
    description: str,
    module: str,
    root: Path,
    files: Callable[[], Files],
    orphans: Callable[[], list[Path]] = list,
) -> int:
    """Write every file of `files()` that differs and delete the `orphans()` (generated files
    no source makes any more); with `--check` write nothing, name them and exit 1."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--check", action="store_true", help="Only report stale files.")
    args = parser.parse_args(argv)
    expected = files()
    if args.check:
        found = stale(expected, root) + orphans()
        for path in found:
            print(f"stale: {path} (run python -m {module})", file=sys.stderr)
        return 1 if found else 0
    for path in stale(expected, root):
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(expected[path], encoding="utf-8")
        print(f"wrote {path}")
    for path in orphans():
        (root / path).unlink()
        print(f"removed {path}")
    return 0
