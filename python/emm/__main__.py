"""``python -m emm ARGS``: runs the ``emm`` command of this installation with ARGS
(``python -m emm replay snapshot.pickle``), after checking that the ``emm`` imported
is emm-cuda's."""

from __future__ import annotations

import os
import sys
from typing import List, Optional

from . import _install


def main(argv: Optional[List[str]] = None) -> int:
    """Checks the distribution, then replaces this process with the ``emm`` binary;
    returns 2 (with the reason on stderr) when either is wrong."""
    args = sys.argv[1:] if argv is None else argv
    bad = _install.problem()
    if bad is not None:
        print(f"python -m emm: {bad}", file=sys.stderr)
        return 2
    exe = _install.binary()
    if exe is None:
        print(
            "python -m emm: the `emm` program was not found in this installation of emm-cuda "
            "(it is installed beside Python's scripts, e.g. venv/bin/emm); reinstall the wheel, "
            "or from a checkout build it with `cargo build --release -p emm-cli`",
            file=sys.stderr,
        )
        return 2
    sys.stdout.flush()
    os.execv(exe, [str(exe), *args])
    return 0  # not reached: execv returns only by raising


if __name__ == "__main__":
    sys.exit(main())
