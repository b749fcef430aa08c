"""Timeline charts and the text summary of a simulated trace."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from mlagen.backends.sc11.costmodel import simulate
from mlagen.backends.sc11.timeline import plot_all, plot_core, text_summary

from test_sc11_cost_synth import pipeline


@pytest.fixture(scope="module")
def sim():
    return simulate(pipeline(cores=3, steps=6, buffers=2).array())


def test_core_chart_png_and_svg(sim, tmp_path):
    files = plot_core(sim, 1, tmp_path / "core1")
    assert sorted(f.suffix for f in files) == [".png", ".svg"]
    for f in files:
        assert f.stat().st_size > 2000
    assert files[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    root = ET.parse(files[1]).getroot()                 # a well-formed SVG
    assert root.tag.endswith("svg")


def test_all_cores_chart(sim, tmp_path):
    (f,) = plot_all(sim, tmp_path / "all.svg", by="op")
    text = f.read_text()
    assert "core 2 BDC" in text and "matmul" in text


def test_bad_requests(sim, tmp_path):
    with pytest.raises(ValueError, match="core 9"):
        plot_core(sim, 9, tmp_path / "x")
    with pytest.raises(ValueError, match="colour by"):
        plot_all(sim, tmp_path / "x", by="colour")


def test_text_summary_names_the_numbers(sim):
    s = text_summary(sim)
    assert f"{sim.total_s * 1e6:.2f} us" in s
    assert "pipelined bound" in s and "dominant engine" in s
    assert "SDMA" in s and "BDC" in s
