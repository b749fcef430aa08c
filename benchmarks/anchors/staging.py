"""What the anchors' stage-and-build scripts share: a one-line refusal with exit status 2,
and `git archive` of some paths of a mirrored repository at a commit into a folder."""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path


def fail(tool: str, msg: str):
    """Bad input: one line, exit status 2."""
    print(f"{tool}: {msg}", file=sys.stderr)
    raise SystemExit(2)


def archive(tool: str, repo: Path, commit: str, paths: list[str], dest: Path) -> int:
    """Extract `paths` of `repo` at `commit` into dest; returns the number of files."""
    try:
        data = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit,
                               *paths], check=True, capture_output=True).stdout
    except (subprocess.CalledProcessError, OSError) as e:
        why = getattr(e, "stderr", None) or str(e).encode()
        fail(tool, f"{repo}: git archive {commit} failed: "
                   f"{(why.decode(errors='replace').strip().splitlines() or ['?'])[-1]}")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        tar.extractall(dest, members=members, filter="data")
    return len(members)
