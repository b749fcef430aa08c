"""Start-up stays fast (<= 0.3 s for --help, check, generate, cache): the commands
that need no kernel must not import torch, numpy, hypothesis, matplotlib or rich.  Checked
by what a fresh process imported, not by a wall clock (CI machines are shared and noisy);
BENCHMARKS.md has the measured times."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "numpy", "hypothesis", "matplotlib", "rich", "filelock")
SCHEDULES = [str(p) for p in sorted((ROOT / "schedules").glob("*.toml"))]

PROBE = """
import contextlib, io, json, sys
from mlagen.cli import main
argv = json.loads(sys.argv[1])
with contextlib.redirect_stdout(io.StringIO()):
    try:
        rc = main(argv)
    except SystemExit as e:          # --help
        rc = e.code
heavy = json.loads(sys.argv[2])
print(json.dumps({"rc": rc, "loaded": [m for m in heavy if m in sys.modules],
                  "modules": len(sys.modules)}))
"""


@pytest.mark.parametrize("argv", [
    ["--help"],
    ["check", *SCHEDULES],
    ["generate", *SCHEDULES, "-o", "{tmp}"],
    ["cache", "list"],
    ["cache", "dir"],
    ["run", "--help"],
    ["verify", "--help"],
], ids=lambda a: " ".join(a[:2]))
def test_light_commands_import_no_heavy_module(argv, tmp_path):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)],
                          capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                               "MLAGEN_CACHE_DIR": str(tmp_path / "cache"),
                               "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["rc"] == 0
    assert got["loaded"] == [], f"{' '.join(argv)} imported {got['loaded']}"
    assert got["modules"] < 400, got["modules"]       # torch alone brings over 1000


def test_the_probe_sees_a_heavy_import(tmp_path):
    """Not vacuous: a command that does need torch shows up as importing it."""
    proc = subprocess.run([sys.executable, "-c", PROBE,
                           json.dumps(["run", str(ROOT / "schedules" / "sc11_attn.toml"),
                                       "--batch", "0"]), json.dumps(HEAVY)],
                          capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                               "HOME": str(tmp_path)})
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["rc"] == 2                     # refused at the argument, before any import...
    proc = subprocess.run([sys.executable, "-c", PROBE,
                           json.dumps(["run", str(ROOT / "schedules" / "sc11_attn.toml"),
                                       "--s-q", "9"]), json.dumps(HEAVY)],
                          capture_output=True, text=True, cwd=ROOT,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
                               "HOME": str(tmp_path)})
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["rc"] == 2 and "torch" in got["loaded"]   # ...run's own checks import it


def test_the_hopper_api_does_not_import_the_compiler():
    """A verify worker imports the Hopper API eagerly: torch._dynamo (about 2 s of its
    start) comes only with a torch.compile."""
    probe = ("import sys, mlagen.backends.hopper.api, mlagen.verify.runner, "
             "mlagen.verify.isolate; print('torch._dynamo' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_the_api_side_effects_run_outside_a_compiled_graph():
    """Under torch.compile a wrapped call (a build, a dlopen, a device query in the API)
    runs eagerly, outside the graph, on every call: never traced by dynamo."""
    import torch

    from mlagen.backends.hopper.api import _outside_graph

    traced = []

    def side_effect(x):
        traced.append(torch.compiler.is_compiling())      # True only while dynamo traces it
        return len(traced)

    for fn, want in ((side_effect, True), (_outside_graph(side_effect), False)):
        traced.clear()
        compiled = torch.compile(lambda x: x * fn(x), backend="eager")
        assert compiled(torch.ones(3)).tolist() == [1.0] * 3
        assert compiled(torch.ones(3)).tolist() == [2.0] * 3     # not a constant traced once
        assert traced and all(t is want for t in traced), traced   # the bare one: traced
