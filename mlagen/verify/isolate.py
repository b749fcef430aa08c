"""Running each example in a child process (GPU targets).

An illegal memory access poisons the CUDA context of the process it happens in: every later
kernel call fails too.  So on a GPU target the kernel runs in a persistent worker process
(spawned, as CUDA requires); when an example crashes the worker, raises, or hangs, that
example fails with what happened and the next example gets a fresh worker.

Tensors cross the pipe as torch.save bytes (CPU tensors); the worker moves inputs to its
device, runs into NaN-poisoned outputs (calls.py), and sends the outputs back on the CPU.
"""

from __future__ import annotations

import importlib
import io
import multiprocessing as mp
import time
import traceback
from typing import Optional

import torch

from ..problem import MlaInputs, MlaOutputs
from .calls import accepts_out, call_poisoned, poisoned_like


class ExampleCrashed(RuntimeError):
    """The worker died, hung, or the kernel raised; the message says which."""


def _dumps(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=False)


def _resolve(factory: str):
    module, _, name = factory.partition(":")
    return getattr(importlib.import_module(module), name)


def _poison_allocator(inputs: MlaInputs, out_shape, lse_shape, device: str):
    """For a GPU runner without out=: leave NaN-filled blocks of exactly the outputs' sizes
    in torch's caching allocator, where the runner's own torch.empty for out and lse will
    most likely find them.  Returns their addresses; the caller checks that the outputs
    really landed there before calling them poisoned."""
    dev_out = poisoned_like(inputs, out_shape, lse_shape, device=device)
    ptrs = (dev_out.out.data_ptr(), dev_out.lse.data_ptr())
    del dev_out          # freed on the current stream: the fill runs before any later kernel
    return ptrs


def _worker(conn, schedule, factory: str, device: str) -> None:
    """The child: make the runner once, then run examples until told to stop."""
    t0 = time.perf_counter()
    try:
        make = _resolve(factory)
        fns = {(): make(schedule)}
    except BaseException:   # report why the runner could not be made, then exit
        conn.send(("error", "making the runner failed:\n" + traceback.format_exc()))
        return
    conn.send(("ready", time.perf_counter() - t0))
    while True:
        try:
            msg = conn.recv_bytes()
        except EOFError:
            return
        if not msg:
            return
        inputs, out_shape, lse_shape, knobs = _loads(msg)
        try:
            # run-time knobs of the one build (a split count): a runner of its own each
            if knobs not in fns:
                fns[knobs] = make(schedule.replace(**dict(knobs)))
            fn = fns[knobs]
            dev_inputs = inputs.to(device)
            if accepts_out(fn) or not device.startswith("cuda"):
                outs, poisoned = call_poisoned(fn, dev_inputs, out_shape, lse_shape)
            else:
                ptrs = _poison_allocator(dev_inputs, out_shape, lse_shape, device)
                outs = fn(dev_inputs)
                poisoned = (outs.out.data_ptr(), outs.lse.data_ptr()) == ptrs
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            reply = MlaOutputs(out=outs.out.cpu(), lse=outs.lse.cpu())
            conn.send_bytes(_dumps(("ok", (reply, poisoned))))
        except BaseException:
            # the context may be unusable now (CUDA): report and let the parent restart us
            conn.send_bytes(_dumps(("error", traceback.format_exc())))
            return


class IsolatedRunner:
    """A runner whose kernel calls happen in a worker process.

    `factory` names a function ``schedule -> runner`` as "module:function" (the worker
    imports it); `timeout_s` bounds one example.
    """

    accepts_out = False          # poisoning happens in the worker; see `poisoned`

    def __init__(self, schedule, factory: str = "mlagen:runner", device: str = "cuda",
                 timeout_s: float = 300.0, start_timeout_s: float = 600.0):
        self.schedule, self.factory, self.device = schedule, factory, device
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self._ctx = mp.get_context("spawn")
        self._proc: Optional[mp.process.BaseProcess] = None
        self._conn = None
        self.restarts = 0          # workers lost to a crash, a hang or an error
        self.poisoned = True
        self.start_s = 0.0         # the last start: spawn to ready
        self.runner_s = 0.0        # of which making the runner (load, or build) in the worker

    # ---- worker lifetime -------------------------------------------------------------
    def start(self) -> None:
        t0 = time.perf_counter()
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_worker,
                                       args=(child, self.schedule, self.factory, self.device),
                                       daemon=True, name="mlagen-verify-worker")
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(self.start_timeout_s):
            self._kill()
            raise ExampleCrashed(f"the worker did not start within {self.start_timeout_s:g} s")
        try:
            kind, detail = parent.recv()
        except EOFError:
            code = self._proc.exitcode if self._proc else None
            self._kill()
            raise ExampleCrashed(f"the worker died while starting (exit code {code})") from None
        if kind != "ready":
            self._kill()
            raise ExampleCrashed(detail)
        self.start_s, self.runner_s = time.perf_counter() - t0, detail

    def _kill(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
        if self._proc is not None:
            self._proc.join(5)
        if self._conn is not None:
            self._conn.close()
        self._proc, self._conn = None, None

    def stop(self) -> None:
        """Tell the worker to exit (close waits for it; a second word to a worker that has
        gone is dropped)."""
        if self._conn is not None:
            try:
                self._conn.send_bytes(b"")
            except (OSError, BrokenPipeError):
                pass

    def close(self) -> None:
        if self._conn is not None:
            self.stop()
            if self._proc is not None:
                self._proc.join(5)
        self._kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- one example ------------------------------------------------------------------
    def run(self, inputs: MlaInputs, out_shape, lse_shape, knobs: tuple = ()) -> MlaOutputs:
        """One example; knobs: (name, value) pairs of run-time schedule knobs (the same
        build, another runner: schedule.replace(**knobs))."""
        if self._proc is None or not self._proc.is_alive():
            self._kill()
            self.start()
        conn = self._conn
        try:
            conn.send_bytes(_dumps((inputs.to("cpu"), tuple(out_shape), tuple(lse_shape),
                                    tuple(knobs))))
            if not conn.poll(self.timeout_s):
                self._kill()
                self.restarts += 1
                raise ExampleCrashed(f"the kernel did not finish within {self.timeout_s:g} s "
                                     f"(worker killed)")
            kind, detail = _loads(conn.recv_bytes())
        except (EOFError, OSError, BrokenPipeError):
            code = self._proc.exitcode if self._proc is not None else None
            if self._proc is not None:
                self._proc.join(5)
                code = self._proc.exitcode
            self._kill()
            self.restarts += 1
            raise ExampleCrashed(f"the worker process died (exit code {code}): the kernel "
                                 f"crashed the process") from None
        if kind == "error":
            self._kill()
            self.restarts += 1
            raise ExampleCrashed("the kernel raised in the worker:\n" + detail)
        outs, poisoned = detail
        self.poisoned = self.poisoned and poisoned
        return outs
