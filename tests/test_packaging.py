"""The wheel carries what mlagen reads at run time (templates, target descriptions, example
schedules); .ci/wheel installs it outside the checkout and runs the main job."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ("templates", "targets", "schedules")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:   # the [test] extra installs it
        pytest.skip(f"setuptools {setuptools.__version__} predates SPDX license strings")
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(out), str(ROOT)],
                          capture_output=True, text=True)
    if proc.returncode != 0 and "No module named pip" in proc.stderr:
        pytest.skip("pip is not installed in this interpreter")
    assert proc.returncode == 0, proc.stderr
    (whl,) = out.glob("mlagen-*.whl")
    return zipfile.ZipFile(whl)


def test_wheel_ships_every_data_file(wheel):
    names = set(wheel.namelist())
    want = [p for top in DATA for p in sorted((ROOT / top).rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts]
    assert len(want) > 10
    missing = [str(p.relative_to(ROOT)) for p in want
               if "mlagen/_data/" + p.relative_to(ROOT).as_posix() not in names]
    assert not missing, missing


def test_wheel_ships_the_tuned_defaults_and_the_cpp_call_path(wheel):
    assert "mlagen/backends/hopper/tuned.json" in wheel.namelist()
    assert "mlagen/backends/hopper/fastcall.cpp" in wheel.namelist()


def test_wheel_metadata_has_the_spdx_license(wheel):
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in wheel.read(meta).decode()


def test_cli_finds_a_shipped_example_from_any_folder(tmp_path, monkeypatch):
    from mlagen.cli import _schedule

    monkeypatch.chdir(tmp_path)
    for spelled in ("schedules/sc11_attn.toml", "sc11_attn"):
        s = _schedule(spelled)
        assert s.name == "sc11_attn" and Path(s.source).is_file()
    from mlagen.errors import ScheduleError
    with pytest.raises(ScheduleError, match="cannot read schedule"):
        _schedule("elsewhere/sc11_attn.toml")     # a path with a folder is taken as given
