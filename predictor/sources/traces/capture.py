"""Record a user's own training loop: a Kineto trace and an execution trace per rank.

.. code-block:: python

    import tuner

    with tuner.capture("traces/run1", warmup=2, active=3) as cap:
        for batch in loader:
            train_step(batch)
            cap.step()          # one call per iteration

    # then:  tuner replay traces/run1

Each rank writes ``rank{R}.kineto.json.gz`` (``torch.profiler``; CPU ops, and CUDA kernels
and runtime calls when CUDA is available) and ``rank{R}.et.json`` (``ExecutionTraceObserver``,
for the same active iterations), so ``tuner replay DIR`` pairs them. The rank comes from
``torch.distributed`` when it is initialised, else 0. Iterations after the active window run
unprofiled. Torch is imported only when a capture starts.

``rank{R}.steps.csv`` records the wall time of every iteration (between two ``step()`` calls,
the time spent inside ``step()`` — trace export — excluded), the process's minor page faults in it,
and whether the profiler was recording it: what-if predictions (:mod:`predictor.whatif.apply`) compare
the profiled iterations with the unprofiled ones after the window to remove the profiler's own cost.
Its header also holds this host's cost of one page fault (``page_fault_s``, timed when the capture
ends): on a CPU the profiled steps can fault many more pages than the unprofiled ones (a small
Hugging Face GPT-2 at batch 32: about 18 000 a step against 3 000), time spent in the ops that write
fresh memory, not per profiled event.

On CUDA those unprofiled iterations are only clean if CUPTI is detached when the window ends, which
Kineto does only with ``TEARDOWN_CUPTI=1`` (pytorch/pytorch#144455); without it the after-window steps
of an H200 capture (torch 2.11, CUDA 13.0) ran 6-33 % slower than the same steps unprofiled. A capture
recording CUDA on CUDA >= 12.6 therefore sets ``TEARDOWN_CUPTI=1`` while it runs, unless the variable is
already set or ``teardown_cupti=False`` (PyTorch sets it to 0 for CUDA graphs on older CUDA, where
teardown crashes); ``steps.csv`` records whether it did.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
from pathlib import Path
from types import TracebackType

__all__ = ["Capture", "ModuleRanges", "capture", "kineto_path", "et_path", "steps_path", "read_step_times",
           "minor_faults", "page_fault_s"]


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


def _cuda_at_least(major: int, minor: int) -> bool:
    """Whether PyTorch's CUDA runtime version is at least ``major.minor`` (False without CUDA)."""
    import torch

    try:
        got = tuple(int(x) for x in str(torch.version.cuda or "0.0").split(".")[:2])
    except ValueError:
        return False
    return got >= (major, minor)


def kineto_path(folder: str | Path, rank: int) -> Path:
    """Where rank ``rank``'s Kineto trace goes."""
    return Path(folder) / f"rank{rank}.kineto.json.gz"


def et_path(folder: str | Path, rank: int) -> Path:
    """Where rank ``rank``'s execution trace goes."""
    return Path(folder) / f"rank{rank}.et.json"


def steps_path(folder: str | Path, rank: int) -> Path:
    """Where rank ``rank``'s per-iteration wall times go (CSV, not JSON: trace loaders skip it)."""
    return Path(folder) / f"rank{rank}.steps.csv"


def read_step_times(path: str | Path, text: str | None = None) -> dict:
    """``{"wall_s": [...], "window": [...], "minor_faults": [...], "torch_threads": int | None,
    "page_fault_s": float | None}`` of a ``steps.csv`` (window: ``wait``, ``warmup``, ``active`` or
    ``after``; ``minor_faults``: per iteration, NaN where not recorded; ``page_fault_s``: seconds per
    page fault on the capturing host); empty lists if unreadable. ``text``: the file's contents when
    they come from elsewhere (an archive member)."""
    out: dict = {"wall_s": [], "window": [], "minor_faults": [], "torch_threads": None, "page_fault_s": None}
    if text is None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return out
    for line in text.splitlines():
        if line.startswith("# torch_threads="):
            with contextlib.suppress(ValueError):
                out["torch_threads"] = int(line.split("=", 1)[1])
            continue
        if line.startswith("# page_fault_s="):
            with contextlib.suppress(ValueError):
                out["page_fault_s"] = float(line.split("=", 1)[1])
            continue
        parts = line.split(",")
        if len(parts) not in (3, 4) or parts[0] == "step":
            continue
        try:
            wall = float(parts[1])
            faults = float(parts[3]) if len(parts) == 4 else float("nan")
        except ValueError:
            continue
        out["wall_s"].append(wall)
        out["window"].append(parts[2].strip())
        out["minor_faults"].append(faults)
    return out


def minor_faults() -> int:
    """Minor page faults of this process so far (0 where the platform does not count them)."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return 0
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def page_fault_s(mib: int = 16, repeats: int = 3) -> float | None:
    """This host's cost of one minor page fault (seconds): the first fill of a fresh anonymous mapping
    less a second fill of it, per page faulted (the fastest of ``repeats``); None if nothing faulted."""
    import torch

    best = None
    for _ in range(repeats):
        with mmap.mmap(-1, mib << 20) as m:
            t = torch.frombuffer(m, dtype=torch.uint8)
            f0, t0 = minor_faults(), time.perf_counter()
            t.fill_(1)
            t1, f1 = time.perf_counter(), minor_faults()
            t.fill_(2)
            t2 = time.perf_counter()
            del t
        if f1 > f0:
            cost = max((t1 - t0) - (t2 - t1), 0.0) / (f1 - f0)
            best = cost if best is None else min(best, cost)
    return best


class ModuleRanges:
    """Global ``nn.Module`` forward hooks that open a ``record_function`` range ``nn.Module: <Class>_<i>``
    before each forward and close it after (``i``: the instance's number among its class, in first-call
    order, as the profiler's Python tracer names modules). Costs two profiler events per module call."""

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._per_class: dict[str, int] = {}
        self._open: list = []
        self._handles: list = []

    def _name(self, mod) -> str:
        key = id(mod)
        nm = self._names.get(key)
        if nm is None:
            cls = type(mod).__name__
            k = self._per_class.get(cls, 0)
            self._per_class[cls] = k + 1
            nm = self._names[key] = f"nn.Module: {cls}_{k}"
        return nm

    def register(self) -> ModuleRanges:
        import torch
        from torch.nn.modules import module as nn_module

        enter = torch.ops.profiler._record_function_enter_new
        leave = torch.ops.profiler._record_function_exit._RecordFunction

        def pre(mod, _args) -> None:
            self._open.append(enter(self._name(mod), None))

        def post(_mod, _args, _out) -> None:
            if self._open:
                leave(self._open.pop())

        self._handles = [nn_module.register_module_forward_pre_hook(pre),
                         nn_module.register_module_forward_hook(post, always_call=True)]
        return self

    def remove(self) -> None:
        import torch

        for h in self._handles:
            h.remove()
        self._handles = []
        while self._open:  # ranges a failed forward left open
            torch.ops.profiler._record_function_exit._RecordFunction(self._open.pop())


class Capture:
    """Context manager around ``torch.profiler.profile`` with an ``ExecutionTraceObserver``.

    ``wait`` iterations run unprofiled, ``warmup`` are profiled and discarded, ``active`` are
    recorded; :meth:`step` marks the end of an iteration. ``record_shapes`` keeps op input
    shapes (what-if transforms rescale them); ``execution_trace=False`` skips the ET.
    ``teardown_cupti``: on CUDA >= 12.6, set ``TEARDOWN_CUPTI=1`` for the capture if it is unset, so the
    iterations after the window run without CUPTI attached (module docstring). ``modules``: wrap every
    ``nn.Module`` forward in a ``record_function`` range ``nn.Module: <Class>_<i>`` (the module hierarchy
    that layer changes find repeated blocks in, :mod:`predictor.sources.traces.modules`).
    """

    def __init__(self, folder: str | Path, warmup: int = 2, active: int = 3, *, wait: int = 0,
                 record_shapes: bool = True, execution_trace: bool = True, cuda: bool | None = None,
                 teardown_cupti: bool = True, modules: bool = True) -> None:
        if warmup < 0 or active < 1 or wait < 0:
            raise ValueError("capture needs warmup >= 0, active >= 1, wait >= 0")
        self.folder = Path(folder)
        self.warmup = warmup
        self.active = active
        self.wait = wait
        self.record_shapes = record_shapes
        self.execution_trace = execution_trace
        self.cuda = cuda
        self.teardown_cupti = teardown_cupti
        self.modules = modules
        self._module_hooks: ModuleRanges | None = None
        self._set_cupti = False  # this capture set TEARDOWN_CUPTI (and unsets it on exit)
        self.rank = 0
        self.steps = 0
        self.written: list[Path] = []
        self._prof = None
        self._et = None
        self._exported = False
        self._t_last: float | None = None  # perf_counter when the previous step() returned
        self._f_last = 0  # minor page faults when the previous step() returned
        self.wall_s: list[float] = []  # per iteration, seconds
        self.faults: list[int] = []  # per iteration, minor page faults of the process

    @property
    def kineto_file(self) -> Path:
        return kineto_path(self.folder, self.rank)

    @property
    def et_file(self) -> Path:
        return et_path(self.folder, self.rank)

    def _export(self, prof) -> None:
        if self._exported:
            return
        prof.export_chrome_trace(str(self.kineto_file))
        self._exported = True
        self.written.append(self.kineto_file)

    def __enter__(self) -> Capture:
        import torch
        from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

        self.rank = _rank()
        self.folder.mkdir(parents=True, exist_ok=True)
        use_cuda = torch.cuda.is_available() if self.cuda is None else self.cuda
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
        if use_cuda and self.teardown_cupti and "TEARDOWN_CUPTI" not in os.environ and _cuda_at_least(12, 6):
            os.environ["TEARDOWN_CUPTI"] = "1"  # detach CUPTI when the window ends (module docstring)
            self._set_cupti = True
        if self.execution_trace:
            self._et = ExecutionTraceObserver().register_callback(str(self.et_file))
        self._prof = profile(
            activities=activities,
            schedule=schedule(wait=self.wait, warmup=self.warmup, active=self.active, repeat=1),
            on_trace_ready=self._export,
            record_shapes=self.record_shapes,
            execution_trace_observer=self._et,
        )
        self._prof.__enter__()
        if self.modules:
            self._module_hooks = ModuleRanges().register()
        self._f_last = minor_faults()
        self._t_last = time.perf_counter()
        return self

    def step(self) -> None:
        """Mark the end of one training iteration."""
        if self._prof is None:
            raise RuntimeError("Capture.step() called outside the 'with' block")
        t = time.perf_counter()
        f = minor_faults()
        if self._t_last is not None:
            self.wall_s.append(t - self._t_last)
            self.faults.append(f - self._f_last)
        self._prof.step()
        self.steps += 1
        if self._module_hooks is not None and self.steps >= self.wait + self.warmup + self.active:
            self._module_hooks.remove()  # the unprofiled iterations after the window run without hooks
            self._module_hooks = None
        self._f_last = minor_faults()
        self._t_last = time.perf_counter()

    def _window(self, k: int) -> str:
        if k < self.wait:
            return "wait"
        if k < self.wait + self.warmup:
            return "warmup"
        return "active" if k < self.wait + self.warmup + self.active else "after"

    def _write_steps(self) -> None:
        import torch

        path = steps_path(self.folder, self.rank)
        pf = page_fault_s()
        rows = [f"# torch_threads={torch.get_num_threads()}",
                f"# teardown_cupti={os.environ.get('TEARDOWN_CUPTI', 'unset')}"]
        rows += [f"# page_fault_s={pf:.4e}"] if pf is not None else []
        rows += ["step,wall_s,window,minor_faults"]
        rows += [f"{k},{w:.9f},{self._window(k)},{f}" for k, (w, f) in enumerate(zip(self.wall_s, self.faults, strict=True))]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("\n".join(rows) + "\n", encoding="utf-8")
        tmp.replace(path)
        self.written.append(path)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        prof, self._prof = self._prof, None
        if prof is None:
            return
        if self._module_hooks is not None:
            self._module_hooks.remove()
            self._module_hooks = None
        prof.__exit__(exc_type, exc, tb)
        if not self._exported and exc_type is None and self.steps > self.wait + self.warmup:
            self._export(prof)  # fewer steps than the window: keep what was recorded
        if self._et is not None:
            with contextlib.suppress(RuntimeError, AttributeError):  # already stopped by the profiler
                self._et.unregister_callback()
            if self.et_file.exists():
                self.written.append(self.et_file)
        if exc_type is None and self.wall_s:
            with contextlib.suppress(OSError):
                self._write_steps()
        if self._set_cupti:
            os.environ.pop("TEARDOWN_CUPTI", None)
            self._set_cupti = False


def capture(folder: str | Path, warmup: int = 2, active: int = 3, **kwargs) -> Capture:
    """Record ``active`` training iterations after ``warmup`` into ``folder`` (see :class:`Capture`)."""
    return Capture(folder, warmup=warmup, active=active, **kwargs)
