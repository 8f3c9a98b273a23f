"""``tuner search SPACE.yaml``: evaluate a search space in parallel and rank its candidates.

The output folder is locked for the run; an existing one continues the same space (finished
evaluations come from the study) and refuses another space unless ``--overwrite``. Bad input is
one ``error:`` line with exit code 2; a storage outage or a lost Ray cluster is one line naming
the command that resumes (exit 1); Ctrl-C is one line and that command (exit 130).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.commands.common import (
    EXIT_INTERRUPTED,
    EXIT_RUNTIME,
    console,
    divert_native_stderr,
    err_console,
    fail,
    stop,
)

#: most CPUs a local Ray is started with (a larger cluster is joined with --address)
MAX_WORKERS = 4096


def _resume_command(space: Path, out: Path, storage: str | None, address: str | None) -> str:
    """The command that continues this search (the storage shown masked)."""
    from tuner.search.study import display_storage

    parts = ["tuner", "search", str(space), "--out", str(out), "--resume"]
    if storage:
        parts += ["--storage", display_storage(storage)]
    if address:
        parts += ["--address", address]
    return " ".join(shlex.quote(p) for p in parts)


def _parse_workers(text: str) -> int:
    """``--workers``: ``auto`` (:data:`tuner.search.core.AUTO`) or a CPU count 0 .. :data:`MAX_WORKERS`."""
    from tuner.search.core import AUTO

    if text.strip().lower() == "auto":
        return AUTO
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_WORKERS:
        fail(f"--workers must be auto or 0 .. {MAX_WORKERS} (0 evaluates in this process), got {text}")
    return n


def search(
    space: Annotated[Path, typer.Argument(help="search-space YAML, e.g. search_spaces/sharding.yaml")],
    out: Annotated[Path, typer.Option("--out", help="output folder (locked while the search runs)")] = Path("out/search"),
    workers: Annotated[str, typer.Option("--workers", help="CPUs of the local Ray, 0 .. 4096 (0: evaluate in this process; an existing cluster is used whole), or auto: in this process unless the work left pays for a local Ray's start")] = "auto",
    address: Annotated[str | None, typer.Option("--address", help="address of an existing Ray cluster, host:port or ray://host:port (default: RAY_ADDRESS, else a local Ray)")] = None,
    storage: Annotated[
        str | None, typer.Option("--storage", help="Optuna storage URL (default: sqlite:///OUT/study.db)")
    ] = None,
    resume: Annotated[bool | None, typer.Option("--resume/--no-resume", help="continue the study, skipping finished evaluations (default: continue when OUT holds this space)")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace the outputs of an earlier search in OUT")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no table, no progress bar")] = False,
    all_traces: Annotated[bool, typer.Option("--all-traces", help="charts and Perfetto traces of every task and batch size's best option (default: each task's best plan only)")] = False,
) -> None:
    """Evaluate a search space and rank its candidates."""
    from tuner.search.executor import ClusterError, ClusterLost
    from tuner.search.outdir import OutputError, clear_outputs, decide_resume, hold, write_marker
    from tuner.search.registry import load_space
    from tuner.search.schema import SpaceError
    from tuner.search.study import StorageError, display_storage, fingerprint

    try:
        spec = load_space(space)
    except SpaceError as exc:
        fail(str(exc))
    except RecursionError:  # YAML nested deeper than Python's recursion limit
        fail(f"{space}: nested too deeply to be a space file")
    n_workers = _parse_workers(workers)
    if out.exists() and not out.is_dir():
        fail(f"--out {out}: exists and is not a folder")
    if storage is not None and not storage.strip():
        fail("--storage is empty (omit it for sqlite:///OUT/study.db)")
    plugin = _search_space(space, spec)  # an input the plug-in refuses leaves OUT untouched
    space_id = fingerprint(spec.model_dump(mode="json"))
    storage_id = "default" if storage is None else display_storage(storage)
    again = _resume_command(space, out, storage, address)
    t0 = time.perf_counter()
    try:
        with hold(out):
            go_on = decide_resume(out, space_id, storage_id, resume, overwrite)
            # a study in a named storage may be refused (another search is evaluating it), so OUT's files
            # are replaced only once it is open; the default study lives in OUT, which this run holds
            deferred = overwrite and storage is not None
            if not deferred:
                if overwrite:
                    clear_outputs(out, default_storage=True)
                write_marker(out, space_id, storage_id, str(space))

            def on_open() -> None:
                if deferred:
                    clear_outputs(out, default_storage=False)
                    write_marker(out, space_id, storage_id, str(space))
                if n_workers != 0 or address or os.environ.get("RAY_ADDRESS"):  # Ray's C++ log lines go to a file
                    divert_native_stderr(out / "ray.log")

            summary = _run(space, spec, out, storage, n_workers, address, go_on, quiet, all_traces, on_open, plugin)
            _drop_empty_ray_log(out / "ray.log")
    except OutputError as exc:
        fail(str(exc))
    except (ClusterLost, StorageError) as exc:  # the cluster or the storage went away mid-run
        stop(f"{exc}; finished evaluations are kept, continue with: {again}", EXIT_RUNTIME)
    except ClusterError as exc:  # Ray could not start, or the cluster could not be joined
        fail(str(exc))
    except SpaceError as exc:
        fail(f"{space}: {exc}")
    except ValueError as exc:  # infeasible settings, bad storage URL, ...
        fail(f"{space}: {exc}")
    except OSError as exc:  # an input file named by the space is missing, or --out became unwritable / full
        name = str(exc.filename or "")
        if name and not Path(name).resolve().is_relative_to(out.resolve()):
            fail(f"{space}: {name}: {exc.strerror or exc}")
        stop(f"--out {out}: {exc.strerror or exc}; continue with: {again}", EXIT_RUNTIME)
    except KeyboardInterrupt:
        stop(f"interrupted; finished evaluations are kept, continue with: {again}", EXIT_INTERRUPTED)
    except SystemExit as exc:  # a user's model module called sys.exit while it was imported or run
        fail(f"{space}: a model module called sys.exit({exc.code!r}) during the search")
    console.print(f"{summary} ({time.perf_counter() - t0:.1f} s)", highlight=False)


def _drop_empty_ray_log(log: Path) -> None:
    """Remove ``log`` when it is empty and no Ray started in this process (``--workers auto`` that
    stayed in this process): nothing native can write to it any more."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return
    try:
        if log.is_file() and log.stat().st_size == 0:
            log.unlink()
    except OSError:
        pass


def _search_space(space: Path, spec):
    """The space's search plug-in (its tasks, candidates, resolved platforms); one ``error:`` line for an input
    it refuses (a platform, a catalog or model file, a precision a chip has no peak for)."""
    from tuner.search.registry import space_plugin
    from tuner.search.schema import SpaceError

    try:
        return space_plugin(spec.space)(spec)
    except (SpaceError, ValueError) as exc:
        fail(f"{space}: {exc}")
    except OSError as exc:  # an input file named by the space is missing
        fail(f"{space}: " + (f"{exc.filename}: " if exc.filename else "") + f"{exc.strerror or exc}")
    except SystemExit as exc:  # a user's model module called sys.exit while it was imported
        fail(f"{space}: a model module called sys.exit({exc.code!r}) during the search")


def _run(space: Path, spec, out: Path, storage: str | None, workers: int, address: str | None, resume: bool,
         quiet: bool, all_traces: bool = False, on_open: Callable[[], None] | None = None, plugin=None) -> str:
    """Run the search with a progress bar on stderr; returns the summary line."""
    from tuner.search.registry import SearchRequest, run_request
    from tuner.search.study import default_storage

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet or not err_console.is_terminal,  # a bar in a log file or a pipe is noise
        transient=False,
    ) as bar:
        job = bar.add_task("evaluating", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(job, completed=done, total=total)

        request = SearchRequest(
            space_path=space,
            spec=spec,
            out=out,
            storage=storage or default_storage(out),
            workers=workers,
            address=address,
            resume=resume,
            quiet=quiet,
            console=console,
            progress=progress,
            all_traces=all_traces,
            on_open=on_open,
            search=plugin,
        )
        return run_request(request)
