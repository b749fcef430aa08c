"""`mlagen tune --target hopper`: a measured search over the legal Hopper schedules for a
list of shapes, writing the table that the API's per-shape defaults read (defaults.py).

    table = tune(shapes, space="small", table_path=..., measure=...)

A shape is (b, s_q, s_k, h_q, varlen) with the benchmark of record's workload (bench.py).
Every candidate is a legal schedule (rules.check) of the search space; they are built first
(in parallel), then each (shape, candidate) is timed (do_bench median of the whole call)
and appended to a log beside the table, so an interrupted run resumes where it stopped.
The table is keyed by GPU name and mlagen version; within it, by (batch, s_q * h_q): the
two things both get_mla_metadata and flash_mla_with_kvcache know.  Shapes that share a key
(several s_k) pick the candidate with the best geometric mean of time / the shape's best;
the static default stays unless that is more than MARGIN faster than it, in the search and
again when the two are timed in turn (confirm).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from ...errors import MlagenError
from ...version import __version__

from .shapes import Shape, parse_shape
from .tuned import KNOBS, forget_tables, shape_key, table_key, user_table


def default_shapes() -> list[Shape]:
    """The benchmark of record's rows: the 51 anchor rows and the 8 graph rows."""
    from .bench import anchor_rows, graph_rows

    seen: dict[Shape, None] = {}
    for r in anchor_rows() + graph_rows():
        seen[Shape(r["b"], r["s_q"], r["sk"], r["h_q"], bool(r["varlen"]))] = None
    return list(seen)


def candidates(space: str = "small") -> list[dict]:
    """Knob sets of the search space that pass the rules (shared memory, registers)."""
    from ...schedule.records import Schedule
    from ...schedule.rules import check
    from ...errors import ScheduleError

    if space == "small":
        tiles = [(r, bkv, buf, w) for r in (16, 32, 64)
                 for bkv, buf in ((32, 2), (32, 3), (64, 2), (16, 4)) for w in (8,)]
        tiles += [(16, 32, 2, 4), (32, 32, 3, 4)]
        costs = (5,)
        wgmma_costs = (3, 5, 8)
    elif space == "defaults":
        from .defaults import tile_knobs

        tiles = sorted(set(tile_knobs().values()))
        costs = (5,)
        wgmma_costs = (5,)
    elif space == "wgmma":        # the wgmma kernels alone, their split policy wider
        tiles, costs = [], ()
        wgmma_costs = (2, 3, 5, 8, 12)
    elif space == "full":
        tiles = list(itertools.product((16, 32, 64), (16, 32, 64), range(1, 6), (4, 8)))
        costs = (2, 5, 10)
        wgmma_costs = (2, 3, 5, 8, 10)
    else:
        raise MlagenError(f"search space {space!r}: defaults, small, wgmma or full")
    from .defaults import WGMMA_KNOBS

    # the wgmma main loops have fixed tile knobs but for the few-rows kernel's rows and
    # consumer warpgroups (16 or 32 rows, warps 4 or 8) beside WGMMA_KNOBS (the 64-row
    # kernel); their split policy is searched
    wgmma_tiles = set(WGMMA_KNOBS.values())
    if space != "defaults":
        wgmma_tiles |= {(r, 64, 2, w) for r in (16, 32) for w in (4, 8)}
    grid = [(t, c, "mma_sync") for t, c in itertools.product(tiles, costs)]
    grid += [(t, c, "wgmma") for t in sorted(wgmma_tiles) for c in wgmma_costs]
    out = []
    for (r, bkv, buf, w), cost, loop in grid:
        knobs = dict(rows_per_tile=r, block_kv=bkv, buffers=buf, warps=w, split_cost=cost,
                     mainloop=loop)
        try:
            check(Schedule.build(target="hopper", **knobs))
        except ScheduleError:
            continue
        out.append(knobs)
    return out


def cand_id(knobs: dict) -> str:
    loop = knobs.get("mainloop", "mma_sync")
    return ("r{rows_per_tile}_bkv{block_kv}_buf{buffers}_w{warps}_c{split_cost}".format(**knobs)
            + ("" if loop == "mma_sync" else f"_{loop}"))


def schedule_of(knobs: dict, dtype: str = "bf16"):
    from ...schedule.records import Schedule
    from .defaults import canonical

    return canonical(Schedule.build(target="hopper", dtype=dtype, **knobs))


def build_schedules(schedules: Sequence, jobs: int = 8) -> list[Optional[str]]:
    """Build canonical schedules' libraries in parallel (cached); per schedule None, or the
    first line of why it did not build (not raised: the caller skips it)."""
    from concurrent.futures import ThreadPoolExecutor

    from ...jit import build
    from . import render

    def one(s):
        try:
            build(render(s))
            return None
        except Exception as e:
            return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"

    with ThreadPoolExecutor(jobs) as ex:
        return list(ex.map(one, schedules))


def build_all(cands: Sequence[dict], jobs: int = 8) -> dict[str, str]:
    """Build every candidate (in parallel); returns {cand_id: error} for those that failed."""
    errs = build_schedules([schedule_of(k) for k in cands], jobs)
    return {cand_id(k): e for k, e in zip(cands, errs) if e}


_DATA: dict[str, tuple] = {}      # the last shape's workload, shared by its candidates


def measure_gpu(shape: Shape, knobs: dict) -> float:
    """ms of one call (do_bench median, shorter than the bench's) with this schedule, on
    the shape's one workload: every candidate of a shape reads the same K pages."""
    import triton.testing

    from .bench import Caller

    if shape.label() not in _DATA:
        _DATA.clear()                     # one shape's K cache at a time (up to 2.4 GB)
    c = Caller(shape.b, shape.s_q, shape.sk, shape.h_q, shape.varlen, schedule_of(knobs),
               data=_DATA.get(shape.label()))
    _DATA[shape.label()] = c.data
    c()
    return triton.testing.do_bench(c, warmup=10, rep=60, return_mode="median")


def _load(path: Path) -> dict:
    if path.exists():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise MlagenError(f"{path}: not a tuning table ({e})") from None
    return {"format": 1, "tables": {}}


def log_path(table_path: Path) -> Path:
    return table_path.with_suffix(".log.jsonl")


def _read_log(path: Path, key: str) -> dict[tuple[str, str, int], float]:
    """{(shape, candidate, round): ms}: the search is round index 0, the confirmation 1.."""
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue                     # a line cut short by an interruption
            if rec.get("table") == key:
                done[(rec["shape"], rec["cand"], rec.get("round", 0))] = rec["ms"]
    return done


def static_default_id(rows_total: int) -> str:
    """The candidate id of the static default a shape of these rows gets without a table."""
    from .defaults import default_schedule

    m = default_schedule(rows_total).mapping
    return cand_id({n: getattr(m, n) for n in KNOBS})


# A measured candidate replaces the static default only when it is faster by more than
# this (geometric mean over the key's shapes): one do_bench median of each moves by ~1-2 %,
# and a table of noise picks would churn the defaults for nothing.
MARGIN = 0.02


def choose(shapes: Sequence[Shape], cands: Sequence[dict],
           times: dict[tuple[str, str], float], margin: float = MARGIN) -> dict[str, dict]:
    """Per (b, rows) key: the candidate with the best geometric mean of time / best time
    over the key's shapes (only candidates measured on all of them), unless the static
    default is within `margin` of it."""
    by_key: dict[str, list[Shape]] = {}
    for s in shapes:
        by_key.setdefault(shape_key(s.b, s.rows), []).append(s)
    entries = {}
    for key, group in by_key.items():
        best_ms = {}
        for s in group:
            ms = [times[(s.label(), cand_id(k))] for k in cands
                  if math.isfinite(times.get((s.label(), cand_id(k)), math.inf))]
            if ms:
                best_ms[s.label()] = min(ms)
        scored = []
        for k in cands:
            vals = [times.get((s.label(), cand_id(k)), math.inf) for s in group]
            if not all(math.isfinite(v) for v in vals) or len(best_ms) < len(group):
                continue
            score = math.exp(sum(math.log(v / best_ms[s.label()]) for v, s in zip(vals, group))
                             / len(group))
            scored.append((score, cand_id(k), k, vals))
        if not scored:
            continue
        score, cid, k, vals = min(scored, key=lambda t: (t[0], t[1]))
        default = static_default_id(group[0].rows)
        kept = [t for t in scored if t[1] == default and t[0] <= score * (1 + margin)]
        if kept:
            score, cid, k, vals = kept[0]
        entries[key] = {"knobs": {n: k[n] for n in KNOBS}, "candidate": cid,
                        "score": round(score, 4), "default": default,
                        "shapes": {s.label(): round(v, 5) for s, v in zip(group, vals)}}
    return entries


CONFIRM_ROUNDS = 3


def confirm(shapes: Sequence[Shape], cands: Sequence[dict], entries: dict[str, dict],
            timed: Callable[[Shape, dict, int], float], margin: float = MARGIN,
            rounds: int = CONFIRM_ROUNDS) -> None:
    """An entry whose pick is not the static default is timed again: pick and default in
    turn, `rounds` times each on every shape of the key, medians compared.  The pick stays
    only if still faster by more than `margin` (a single median of each in the search is
    one sample of noise); else the default is written back.  The entry records both."""
    by_id = {cand_id(k): k for k in cands}
    for key, e in entries.items():
        if e["candidate"] == e["default"] or e["default"] not in by_id:
            continue
        group = [s for s in shapes if shape_key(s.b, s.rows) == key]
        ratios, med = [], {}
        for s in group:
            t = {e["candidate"]: [], e["default"]: []}
            for r in range(1, rounds + 1):
                for cid in t:
                    t[cid].append(timed(s, by_id[cid], r))
            med[s.label()] = m = {cid: sorted(v)[len(v) // 2] for cid, v in t.items()}
            # a pick that fails now loses; a default that fails now makes any pick a gain
            ratios.append(0.0 if not math.isfinite(m[e["candidate"]]) else
                          math.inf if not math.isfinite(m[e["default"]]) else
                          m[e["default"]] / m[e["candidate"]])
        gain = (0.0 if min(ratios) == 0 else math.inf if max(ratios) == math.inf else
                math.exp(sum(math.log(r) for r in ratios) / len(ratios)))
        e["confirm"] = {"rounds": rounds, "speedup": _num(gain, 4),
                        "shapes": {lbl: {c: _num(v, 5) for c, v in m.items()}
                                   for lbl, m in med.items()}}
        if gain <= 1 + margin:
            k = by_id[e["default"]]
            e.update(knobs={n: k[n] for n in KNOBS}, candidate=e["default"],
                     shapes={lbl: _num(m[e["default"]], 5) for lbl, m in med.items()})


def _num(v: float, digits: int) -> Optional[float]:
    """A JSON-safe figure: None for a failed (infinite) time."""
    return round(v, digits) if math.isfinite(v) else None


def tune(shapes: Iterable[Shape], space: str = "small", table_path: Optional[Path] = None,
         gpu: Optional[str] = None, measure: Optional[Callable[[Shape, dict], float]] = None,
         build: bool = True, progress: bool = True, jobs: int = 8) -> dict:
    """Run (or resume) the search and write the table; returns this GPU's table."""
    shapes = list(shapes)
    if not shapes:
        raise MlagenError("no shapes to tune")
    table_path = Path(table_path) if table_path else user_table()
    if gpu is None:
        import torch

        if not torch.cuda.is_available():
            raise MlagenError("tune --target hopper needs an NVIDIA sm_90 GPU (none found)")
        gpu = torch.cuda.get_device_name()
    measure = measure or measure_gpu
    key = table_key(gpu)
    cands = candidates(space)
    failed = build_all(cands, jobs) if build else {}
    cands = [k for k in cands if cand_id(k) not in failed]
    log = log_path(table_path)
    log.parent.mkdir(parents=True, exist_ok=True)
    logged = _read_log(log, key)
    todo = [(s, k) for s in shapes for k in cands if (s.label(), cand_id(k), 0) not in logged]

    def timed(s: Shape, k: dict, rnd: int = 0) -> float:
        """One measurement, from the log when this run or an earlier one made it."""
        at = (s.label(), cand_id(k), rnd)
        if at in logged:
            return math.inf if logged[at] is None else logged[at]
        try:
            ms = float(measure(s, k))
        except Exception:                   # a candidate that fails here is just not chosen
            ms = math.inf
        logged[at] = ms if math.isfinite(ms) else None
        with log.open("a") as f:
            f.write(json.dumps({"table": key, "shape": s.label(), "cand": cand_id(k),
                                "round": rnd, "ms": logged[at]}) + "\n")
        return ms

    if progress and todo:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeRemainingColumn)

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeRemainingColumn()) as bar:
            task = bar.add_task("tuning", total=len(todo))
            for s, k in todo:
                bar.update(task, description=f"{s.label()} {cand_id(k)}")
                timed(s, k)
                bar.advance(task)
    else:
        for s, k in todo:
            timed(s, k)
    times = {(sh, c): (math.inf if v is None else v) for (sh, c, r), v in logged.items()
             if r == 0}
    data = _load(table_path)
    entries = choose(shapes, cands, times)
    confirm(shapes, cands, entries, timed)
    _DATA.clear()              # the last shape's workload (GPU memory) once timing is over
    mine = data["tables"].setdefault(key, {"gpu": gpu, "mlagen": __version__, "entries": {}})
    mine["space"] = space
    mine["entries"].update(entries)
    mine["failed_builds"] = failed
    tmp = table_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    tmp.replace(table_path)
    return mine


def tune_main(args) -> int:
    from .defaults import check_overrides

    check_overrides()            # a malformed MLAGEN_HOPPER_* table is refused first
    shapes = [parse_shape(x) for x in args.shape] if args.shape else default_shapes()
    if args.quick:
        shapes = shapes[:4]
    mine = tune(shapes, space=args.space, table_path=Path(args.table) if args.table else None,
                progress=not args.no_progress)
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"tuned defaults: {mine['gpu']}, mlagen {mine['mlagen']}")
    for col in ("batch, rows", "knobs", "score", "confirmed", "shapes (ms)"):
        t.add_column(col)
    for k, e in sorted(mine["entries"].items()):
        c = e.get("confirm")
        t.add_row(k, e["candidate"], f"{e['score']:.3f}",
                  f"{c['speedup']:.3f}x over the default" if c else "",
                  " ".join(f"{s}: {v:.4f}" for s, v in e["shapes"].items()))
    Console().print(t)
    print(f"table: {Path(args.table) if args.table else user_table()}")
    forget_tables()
    return 0
