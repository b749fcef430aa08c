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


# ---------------------------------------------------------------- start-up ---------
from mlagen.backends.sc11.costmodel import TraceBuilder  # noqa: E402
from mlagen.backends.sc11.timeline import (ENGINE_COLOURS, idle_per_engine,  # noqa: E402
                                           phase_bands)
from mlagen.backends.sc11.trace import Engine, Mem  # noqa: E402


@pytest.fixture(scope="module")
def phased():
    """Two cores: a weight load (phase 0) streaming beside phases 1 then 2 (one phase only
    would draw one colour when bars are coloured by phase)."""
    tb = TraceBuilder()
    for c in range(2):
        w = tb.dma(c, Engine.SDMA, Mem.DDR, Mem.L2, 1 << 20, phase=0)
        a = tb.dma(c, Engine.GDMA, Mem.DDR, Mem.LMEM, 1 << 16, phase=1)
        m = tb.matmul(c, 32, 512, 576, deps=[a], phase=1)
        b = tb.dma(c, Engine.GDMA, Mem.DDR, Mem.LMEM, 1 << 16, deps=[m], phase=2)
        tb.matmul(c, 32, 512, 576, deps=[b, w], phase=2)
    return simulate(tb.array())


def test_every_chart_has_one_colour_per_engine_and_a_legend(phased, tmp_path):
    for f in (plot_all(phased, tmp_path / "all.svg")[0],
              plot_core(phased, 0, tmp_path / "core.svg")[0]):
        svg = f.read_text().lower()
        for name in ("SDMA", "GDMA", "BDC"):          # every engine that ran, in the legend
            assert f">{name.lower()}<" in svg or f"<!-- {name.lower()} -->" in svg, name
            assert ENGINE_COLOURS[name].lower() in svg
        assert "phase a" in svg                       # the phase bands are named


def test_setup_is_not_a_phase_band_and_idle_is_per_core(phased):
    bands = phase_bands(phased)
    assert 0 not in bands and sorted(bands) == [1, 2]
    (a1, b1), (a2, b2) = bands[1], bands[2]
    assert b1 <= a2 + 1e-12                           # sequential, not overlapping
    for e, (mean, mx) in idle_per_engine(phased).items():
        assert 0 <= mean <= mx <= phased.total_s + 1e-15, e
    s = text_summary(phased)
    assert "weights/setup" in s and "beside the phases" in s
    assert "idle gaps          " not in s             # no sum over lanes any more
