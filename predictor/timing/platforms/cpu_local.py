"""The ``cpu-local`` platform: the running machine's CPU, measured in about two seconds.

Without a GPU the local CPU is a real platform (calibrate on it, run on it, compare). This
module times a few things with ``time.perf_counter`` and fills a :class:`Platform`:

- ``peak_flops`` fp32/fp64: best achieved FLOP/s (2*n^3 / t) of square ``torch.matmul`` for
  n in 256..2048 on torch's current thread count, within a time budget per dtype;
- memory: the last-level cache (size from ``/sys/devices/system/cpu/cpu0/cache``, else 32 MiB;
  bandwidth from copies that fit in it) then main memory (size from ``os.sysconf``; bandwidth
  from copying a 256 MB tensor, counting bytes read + written);
- interconnect: intra-node = one thread's ``memcpy`` rate of a large buffer (payload bytes/s), an
  upper bound for shared-memory transport between ranks on this host; inter-node = a
  conservative TCP-loopback figure (1 GB/s, 50 us), since gloo between processes goes through
  sockets. The calibration step replaces both with measured collectives;
- overheads t1..t5: a few microseconds, placeholders that the calibration step measures.

Because the peaks are achieved rather than datasheet numbers, ``gemm_efficiency_max`` and
``memory_efficiency`` are 1.0. The result is cached as JSON in ``$TUNER_CACHE_DIR/cpu-local.json``
(default ``~/.cache/tuner``), keyed by hostname + CPU model + torch thread count.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform as _platform
import re
import socket
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from predictor.timing.platforms.schema import Platform

__all__ = ["cache_path", "measure_cpu_local", "cpu_model", "cpu_signature", "describe_cpu", "signature_mismatch",
           "ISA_FLAGS", "SIGNATURE_KEYS", "same_cpu"]

_FALLBACK_LLC_BYTES = 32 * 1024 * 1024
_COPY_BYTES = 256 * 1024 * 1024
#: conservative gloo/TCP loopback figures for "inter-node" on one host (bytes/s, s)
_LOOPBACK_BANDWIDTH = 1.0e9
_LOOPBACK_LATENCY_S = 50e-6
#: shared-memory handoff latency between ranks on one host (s), order of magnitude
_SHM_LATENCY_S = 10e-6


def cache_path() -> Path:
    """JSON cache file: ``$TUNER_CACHE_DIR/cpu-local.json`` or ``~/.cache/tuner/cpu-local.json``."""
    root = os.environ.get("TUNER_CACHE_DIR") or Path.home() / ".cache" / "tuner"
    return Path(root) / "cpu-local.json"


def measure_cpu_local(cache: bool = True) -> Platform:
    """Measure (or load from the cache) the ``cpu-local`` platform; takes < 5 s when measuring.

    Args:
        cache: read a cached result for this host/CPU/thread count if present, and store a
            fresh measurement. ``False`` always measures and leaves the cache alone.
    """
    model = cpu_model()
    threads = torch.get_num_threads()
    host = socket.gethostname()
    cache_key = f"{host}|{model}|{threads}"
    path = cache_path()
    if cache:
        hit = _read_cache(path).get(cache_key)
        if hit is not None:
            try:
                return Platform.model_validate(hit)
            except ValueError:
                pass  # stale layout: measure again
    platform = _measure(host, model, threads)
    if cache:
        _write_cache(path, cache_key, platform)
    return platform


# ------------------------------------------------------------------ measurement
def _measure(host: str, model: str, threads: int) -> Platform:
    src = f"measured on {host} {_dt.date.today().isoformat()} by predictor.timing.platforms.cpu_local"
    fp32 = _best_matmul_flops(torch.float32, (256, 512, 1024, 2048), budget_s=1.2)
    fp64 = _best_matmul_flops(torch.float64, (256, 512, 1024, 2048), budget_s=0.8)
    llc = _llc_bytes()
    dram_bytes = float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    copy_bytes = int(min(_COPY_BYTES, dram_bytes / 16))
    dram_bw = _copy_bandwidth(copy_bytes, repeats=4)
    llc_bw = max(_copy_bandwidth(max(int(llc // 4), 64 * 1024), repeats=20), dram_bw)
    shm_bw = _memcpy_bandwidth(min(copy_bytes, 64 * 1024 * 1024), repeats=3)
    return Platform(
        key="cpu-local",
        name=f"Local CPU ({model}, {threads} threads)",
        vendor=_cpu_vendor(),
        kind="cpu",
        peak_flops={"fp32": fp32, "fp64": fp64},
        memory=[
            {"name": "llc", "capacity_bytes": llc, "bandwidth_bytes_per_s": llc_bw, "on_chip": True},
            {
                "name": "dram",
                "capacity_bytes": dram_bytes,
                "bandwidth_bytes_per_s": dram_bw,
                "on_chip": False,
            },
        ],
        interconnect={
            "name": "shared memory (intra) / TCP loopback (inter), one host",
            "intra_node_bandwidth_bytes_per_s": shm_bw,
            "intra_node_latency_s": _SHM_LATENCY_S,
            "inter_node_bandwidth_bytes_per_s": _LOOPBACK_BANDWIDTH,
            "inter_node_latency_s": _LOOPBACK_LATENCY_S,
        },
        devices_per_node=1,
        memory_policy="offchip_all",
        overheads={"t1_s": 5e-6, "t2_s": 2e-6, "t3_s": 2e-6, "t4_s": 1e-6, "t5_s": 1e-6},
        price_per_device_hour_usd=None,
        price_date=None,
        price_note="local machine: no price; set one in your own YAML if you want cost numbers",
        gemm_efficiency_max=1.0,
        memory_efficiency=1.0,
        sources={
            "peak_flops.fp32": f"{src} (best torch.matmul fp32, n<=2048)",
            "peak_flops.fp64": f"{src} (best torch.matmul fp64, n<=2048)",
            "memory.0.capacity_bytes": f"{src} (/sys/devices/system/cpu/cpu0/cache, fallback 32 MiB)",
            "memory.0.bandwidth_bytes_per_s": f"{src} (in-cache tensor copy, read+write bytes)",
            "memory.1.capacity_bytes": f"{src} (SC_PHYS_PAGES * SC_PAGE_SIZE)",
            "memory.1.bandwidth_bytes_per_s": f"{src} ({copy_bytes >> 20} MiB tensor copy, read+write bytes)",
            "interconnect.intra_node_bandwidth_bytes_per_s": f"{src} (single-thread memcpy, payload bytes)",
            "interconnect.intra_node_latency_s": "assumed order of magnitude; calibration measures collectives",
            "interconnect.inter_node_bandwidth_bytes_per_s": "conservative TCP loopback figure (gloo uses sockets)",
            "interconnect.inter_node_latency_s": "conservative TCP loopback figure (gloo uses sockets)",
            "overheads": "placeholders of a few microseconds; the calibration step measures them",
            "gemm_efficiency_max": "1.0: peak_flops is already the achieved rate",
            "memory_efficiency": "1.0: memory bandwidths are already achieved rates",
        },
        notes="Measured, not a datasheet: peaks are achieved rates on torch's current thread count.",
    )


def _best_matmul_flops(
    dtype: torch.dtype, sizes: tuple[int, ...], budget_s: float, repeats: int = 3
) -> float:
    """Best achieved FLOP/s of square matmuls, skipping sizes that would overrun ``budget_s``."""
    best = 0.0
    start = time.perf_counter()
    for n in sizes:
        remaining = budget_s - (time.perf_counter() - start)
        # a size costs warm-up + repeats; skip it if the best rate so far says it will not fit
        if best > 0 and (repeats + 1) * 2.0 * n**3 / best > remaining:
            break
        a = torch.randn(n, n, dtype=dtype)
        b = torch.randn(n, n, dtype=dtype)
        torch.matmul(a, b)  # warm-up (thread pool, packing buffers)
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            dt = time.perf_counter() - t0
            best = max(best, 2.0 * n**3 / max(dt, 1e-9))
    return best


def _copy_bandwidth(nbytes: int, repeats: int) -> float:
    """Best bytes/s (read + write) of ``dst.copy_(src)`` over float32 tensors of ``nbytes``."""
    n = max(nbytes // 4, 1)
    src = torch.ones(n, dtype=torch.float32)
    dst = torch.zeros(n, dtype=torch.float32)  # both touched: no page faults in the timed loop
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n * 4 / max(best, 1e-9)


def _memcpy_bandwidth(nbytes: int, repeats: int) -> float:
    """Best payload bytes/s of one thread's memcpy (numpy copyto) of ``nbytes``."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.zeros(nbytes, dtype=np.uint8)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / max(best, 1e-9)


# ------------------------------------------------------------------ machine facts
def _llc_bytes() -> float:
    """Largest data/unified cache of cpu0, bytes (fallback 32 MiB)."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            if (index / "type").read_text().strip() == "Instruction":
                continue
            best = max(best, _parse_size((index / "size").read_text()))
        except (OSError, ValueError):
            continue
    return float(best or _FALLBACK_LLC_BYTES)


def _parse_size(text: str) -> int:
    """'32768K' / '1M' / '512' -> bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"cannot parse cache size {text!r}")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    return int(m.group(1)) * scale


def _cpuinfo_field(field: str) -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                name, sep, value = line.partition(":")
                if sep and name.strip() == field:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``, else what :mod:`platform` says)."""
    return _cpuinfo_field("model name") or _platform.processor() or _platform.machine() or "unknown CPU"


#: instruction-set flags that change which kernels PyTorch runs on a CPU (oneDNN / MKL pick their
#: code paths by them): without ``avx512_bf16`` / ``amx_bf16`` a bf16 GEMM takes a slow reference
#: path (1-3 GFLOP/s on one Zen 3 core, 50-60 with AVX-512 BF16 on a Zen 4 VM)
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_signature() -> dict[str, str]:
    """What identifies this CPU for its kernel timings: vendor, model name, family / model / stepping
    (``/proc/cpuinfo``; a VM's model name may be as vague as "AMD EPYC"), PyTorch's CPU capability
    (``torch.backends.cpu.get_cpu_capability()``: the vector ISA ATen's kernels use) and which of
    :data:`ISA_FLAGS` the CPU has (space-separated)."""
    try:
        import torch

        capability = str(torch.backends.cpu.get_cpu_capability())
    except (ImportError, AttributeError, RuntimeError):
        capability = "unknown"
    flags = set((_cpuinfo_field("flags") or "").split())
    return {"vendor": _cpu_vendor(), "model_name": cpu_model(),
            "family": _cpuinfo_field("cpu family") or "", "model": _cpuinfo_field("model") or "",
            "stepping": _cpuinfo_field("stepping") or "", "torch_capability": capability,
            "isa": " ".join(f for f in ISA_FLAGS if f in flags)}


def describe_cpu(signature: dict) -> str:
    """One line for people: model name, family / model, PyTorch capability and ISA of a :func:`cpu_signature`."""
    s = signature
    return (f"{s.get('model_name') or '?'} (family {s.get('family') or '?'}, model {s.get('model') or '?'}), "
            f"PyTorch capability {s.get('torch_capability') or '?'}, ISA {s.get('isa') or '-'}")


def fp32_lanes(capability: str | None) -> int:
    """fp32 lanes of one vector register in PyTorch's CPU capability ``capability`` (a
    :func:`cpu_signature`'s ``torch_capability``): 16 for ``AVX512``, 8 for ``AVX2``, 4 otherwise; an
    unknown capability (None: older packs did not record it; all were calibrated on AVX-512 VMs) reads 16.
    oneDNN's fp32 convolutions block channels by this many (``nChw16c`` / ``nChw8c``)."""
    if capability is None:
        return 16
    cap = str(capability).upper()
    return 16 if cap.startswith("AVX512") else 8 if cap.startswith("AVX2") else 4


#: the fields of a :func:`cpu_signature` that must agree for two measurements to be of one CPU
SIGNATURE_KEYS = ("model_name", "family", "model", "torch_capability", "isa")


def signature_mismatch(recorded: dict | None, current: dict | None = None) -> str | None:
    """Why a pack measured on the CPU ``recorded`` (:func:`cpu_signature`, from its manifest ``cpu``)
    may not describe this one (``current``, default: this host): a one-line reason, or None when they
    agree. A pack without a record gets a reason too (its host cannot be checked)."""
    current = current or cpu_signature()
    if not recorded:
        return "the pack does not record its CPU (an older pack), so its host cannot be checked"
    diffs = [f"{k} {recorded.get(k) or '?'} vs {current.get(k) or '?'} here"
             for k in SIGNATURE_KEYS if recorded.get(k) != current.get(k)]
    return ("the pack was measured on another CPU: " + "; ".join(diffs)) if diffs else None


def same_cpu(a: dict | None, b: dict | None) -> bool:
    """Whether two recorded :func:`cpu_signature` s are of one CPU (:data:`SIGNATURE_KEYS` agree). Two
    missing records agree: the measurements from before CPUs were recorded all come from one host (an
    AVX-512 EPYC); a missing record never agrees with a present one."""
    if not a or not b:
        return not a and not b
    return all(a.get(k) == b.get(k) for k in SIGNATURE_KEYS)


def _cpu_vendor() -> str:
    vendor = _cpuinfo_field("vendor_id") or ""
    return {"GenuineIntel": "Intel", "AuthenticAMD": "AMD"}.get(
        vendor, vendor or _platform.machine() or "unknown"
    )


# ------------------------------------------------------------------ cache
def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_cache(path: Path, cache_key: str, platform: Platform) -> None:
    """Add/replace this machine's entry; best effort (a read-only home must not break prediction)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = _read_cache(path)
        data[cache_key] = platform.model_dump(mode="json")
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
