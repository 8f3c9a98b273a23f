"""OpEmitter: how one framework op becomes tasks of an ExecutionGraph, for every synthesiser.

Two execution modes, chosen by the platform kind:

``device`` (GPUs and other accelerators)
    the CPU thread pays T1 (gap since the previous op) and T2 (op start to first launch), then
    per kernel one runtime call T4 (T5 between launches) whose CPU_GPU edge releases the kernel
    on its stream, then T3; kernels run asynchronously on the compute or communication stream
    (Lin et al. 2022 overhead types; Lin et al. 2024 Algorithm 1). A kernel task standing for a
    batch of GEMMs issued one by one (``streams``: Transformer Engine's grouped linear, one cuBLAS
    call per expert) pays one launch per GEMM, the first releasing it.

``host`` (CPU platforms: PyTorch on CPU runs each op synchronously on the calling thread)
    the thread pays T1, then runs the op's kernels itself, one after another. Blocking
    collectives (gloo all-to-all) run on the calling thread too; collectives issued with
    ``async_op`` (DDP's gradient all-reduce) run on a separate communication thread that the
    next dependent op waits for (CPU_CPU edge).

Either way each call returns the task ids of the op's kernels, so a synthesiser can add data
dependencies (``after=``) without knowing the mode.

Device mode also emits the host work of an eager step that launches nothing (:meth:`OpEmitter.node`:
autograd's ``AccumulateGrad`` and view-backward nodes, views, ``zero_grad``; T1 + T3 each)
and, once per step, the framework work outside every op (:meth:`OpEmitter.step_framework`, overhead type
STEP). Host mode emits neither: the CPU's T's were measured with that work inside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from predictor.graph import Category, DepKind, GraphBuilder, Overhead, ProcKind

__all__ = ["OpEmitter", "Kernel", "gemm", "eltwise", "column_sum", "concat", "foreach", "ExecMode", "NODE_OVERHEADS",
           "MTA_CHUNK_ELEMENTS", "MTA_MAX_BLOCKS", "MTA_MAX_TENSORS"]

#: (name, op kind, category, params incl. optional "flops" and "bytes")
Kernel = tuple[str, str, Category, dict]
ExecMode = Literal["device", "host"]


def gemm(name: str, m: float, n: float, k: float, dt: int, batch: float = 1.0, *, op: str = "gemm",
         streams: int | None = None, k_strided: bool = False) -> Kernel:
    """A GEMM kernel: (batch x) [m x k] @ [k x n], ``dt`` bytes per element.

    ``op``: the task kind, ``"gemm"`` or the ATen op an eager program runs (``"addmm"``, ``"mm"``,
    ``"bmm"``); the calibrated GEMM models keep one network per op. ``streams``: the batch runs as
    separate GEMMs, that many at a time (None: one batched kernel). ``k_strided``: no operand is contiguous
    along ``k`` (a weight gradient ``grad.t() @ x`` reduces over the tokens, both operands contiguous along
    their features), so a ``k`` off a multiple of 16 bytes does not break tensor-core alignment.
    """
    params = {"m": m, "n": n, "k": k, "dtype_bytes": dt, "flops": 2.0 * m * n * k * batch}
    if k_strided:
        params["k_strided"] = 1.0
    if batch != 1.0:
        params["batch"] = batch
    if streams is not None:
        params["streams"] = float(streams)
    return (name, op, Category.COMPUTE, params)


def eltwise(name: str, kind: str, elements: float, dt: int, rw: float = 2.0) -> Kernel:
    """A bandwidth-bound kernel touching ``elements`` elements ``rw`` times (reads + writes)."""
    return (name, kind, Category.MEMORY, {"elements": elements, "dtype_bytes": dt, "bytes": rw * elements * dt})


def column_sum(name: str, rows: float, cols: float, dt: int) -> Kernel:
    """``x.sum(0)`` of a ``rows x cols`` tensor into ``cols`` elements (kind ``sum``): a linear layer's bias
    gradient, eager ``AddmmBackward0``'s reduction of the output gradient over its rows. Reads the input
    once and writes the ``cols`` sums; timed by the calibrated reduction model where the platform has one
    (:mod:`predictor.timing.calibration.reduction`), else by its roofline on these bytes."""
    elements = float(rows) * float(cols)
    return (name, "sum", Category.MEMORY, {"m": float(rows), "n": float(cols), "elements": elements,
                                           "dtype_bytes": dt, "bytes": (elements + float(cols)) * dt})


def concat(name: str, rows: float, width: float, parts: int, dt: int) -> Kernel:
    """A concatenation of ``parts`` tensors of ``rows`` rows along their last dim into ``rows x width``
    elements (``width`` = the sum of the inputs' widths): reads every input, writes the output."""
    elements = float(rows) * float(width)
    return (name, "concat", Category.MEMORY, {"elements": elements, "batch": float(rows), "parts": float(parts),
                                             "dtype_bytes": dt, "bytes": 2.0 * elements * dt})


#: ``multi_tensor_apply`` (ATen's foreach kernels on CUDA): elements per chunk (one thread block each),
#: chunks per launch, and tensors per launch by the number of tensor lists (1..5)
MTA_CHUNK_ELEMENTS = 65536
MTA_MAX_BLOCKS = 320
MTA_MAX_TENSORS = (110, 64, 48, 36, 30)


def foreach(name: str, kind: str, tensors: Sequence[float], dt: int, *, lists: int = 2, rw: float = 3.0) -> list[Kernel]:
    """The launches of one foreach op (``torch._foreach_add_`` and kin) over ``tensors`` (elements each)
    with ``lists`` tensor lists, as ``multi_tensor_apply`` packs them: a launch closes when it holds
    :data:`MTA_MAX_BLOCKS` chunks of :data:`MTA_CHUNK_ELEMENTS` elements or the tensor limit for ``lists``
    lists; a tensor whose chunks overflow a launch continues in the next. Each launch is one memory-bound
    kernel of ``kind`` over its chunks' elements, ``rw`` element accesses each (SGD's update: 3)."""
    max_tensors = MTA_MAX_TENSORS[min(max(lists, 1), len(MTA_MAX_TENSORS)) - 1]
    launches: list[float] = []
    elems, blocks, held = 0.0, 0, 0
    for n in tensors:
        n = float(n)
        if n <= 0:
            continue
        held += 1
        chunks = int(-(-n // MTA_CHUNK_ELEMENTS))
        for c in range(chunks):
            elems += min(MTA_CHUNK_ELEMENTS, n - c * MTA_CHUNK_ELEMENTS)
            blocks += 1
            last = c == chunks - 1
            if blocks == MTA_MAX_BLOCKS or (last and held == max_tensors):
                launches.append(elems)
                elems, blocks = 0.0, 0
                held = 0 if last else 1
    if blocks:
        launches.append(elems)
    return [eltwise(f"{name}[{i}]", kind, e, dt, rw=rw) for i, e in enumerate(launches)]


#: what a kernel-less host node costs in device mode (:meth:`OpEmitter.node`): the gap before it and an op's tail
#: (step host time on measured H100/H200 steps: 4-7 % geomean error, 13-16 % with T2 added).
NODE_OVERHEADS: tuple[Overhead, ...] = (Overhead.T1, Overhead.T3)


class OpEmitter:
    """Appends framework ops of one rank to a :class:`GraphBuilder`."""

    def __init__(self, b: GraphBuilder, rank: int, mode: ExecMode = "device") -> None:
        self.b = b
        self.rank = rank
        self.mode = mode
        self.cpu = b.processor(rank, ProcKind.CPU_THREAD, "cpu")
        if mode == "device":
            self.compute = b.processor(rank, ProcKind.GPU_STREAM, "stream compute")
            self.comm = b.processor(rank, ProcKind.GPU_STREAM, "stream comm")
        else:
            self.compute = self.cpu
            self.comm = b.processor(rank, ProcKind.CPU_THREAD, "comm thread")

    # ------------------------------------------------------------------ ops
    def op(
        self,
        name: str,
        kernels: Sequence[Kernel],
        *,
        comm: bool = False,
        async_op: bool = False,
        after: Sequence[int] = (),
        group: int = -1,
    ) -> list[int]:
        """One framework op running ``kernels``; returns their task ids.

        ``comm``: a collective (communication stream on devices). ``async_op``: in host mode,
        run it on the communication thread instead of blocking the calling thread.
        ``after``: tasks on another processor the first kernel must wait for.
        """
        if self.mode == "device":
            return self.device_op(name, kernels, stream=self.comm if comm else self.compute, after=after, group=group)
        return self._host_op(name, kernels, comm=comm, async_op=async_op, after=after, group=group)

    def node(self, name: str) -> None:
        """Device mode: host work that launches no kernel (an autograd ``AccumulateGrad`` or view-backward
        node, a view op, ``zero_grad``): the gap before it (T1) and an op's tail (T3) — no T2, which is an op's
        way from its start to its first launch (argument checks, output allocation, the kernel's setup).
        Host mode: nothing (see the module)."""
        if self.mode == "device":
            for o in NODE_OVERHEADS:
                self.b.task(self.cpu, "T1" if o == Overhead.T1 else name, "overhead" if o == Overhead.T1 else "cpu_op",
                            Category.CPU, overhead=o)

    def step_framework(self, name: str = "step.framework") -> None:
        """Device mode: the step's framework work outside every op (overhead type STEP, once per
        training step). Host mode: nothing."""
        if self.mode == "device":
            self.b.task(self.cpu, name, "overhead", Category.CPU, overhead=Overhead.STEP)

    def sparse_table(self, name: str) -> None:
        """Device mode: one embedding table's sparse-gradient host cost beyond its ops' T's (overhead type
        SPARSE_TABLE). Host mode: nothing."""
        if self.mode == "device":
            self.b.task(self.cpu, name, "overhead", Category.CPU, overhead=Overhead.SPARSE_TABLE)

    def device_op(self, name: str, kernels: Sequence[Kernel], *, stream: int, after: Sequence[int] = (),
                  group: int = -1) -> list[int]:
        """Device mode: one op whose kernels are launched onto ``stream`` (T1, T2, a T4 launch per kernel
        with T5 between launches, T3); returns the kernels' task ids."""
        b = self.b
        b.task(self.cpu, "T1", "overhead", Category.CPU, overhead=Overhead.T1)
        b.task(self.cpu, name, "cpu_op", Category.CPU, overhead=Overhead.T2)
        out = []
        for j, (kname, kind, cat, params) in enumerate(kernels):
            if j:
                b.task(self.cpu, "T5", "overhead", Category.CPU, overhead=Overhead.T5)
            launch = b.task(self.cpu, "cudaLaunchKernel", "launch", Category.CPU, overhead=Overhead.T4)
            for _ in range(int(params.get("batch", 1.0)) - 1 if "streams" in params else 0):  # one call per GEMM
                b.task(self.cpu, "T5", "overhead", Category.CPU, overhead=Overhead.T5)
                b.task(self.cpu, "cudaLaunchKernel", "launch", Category.CPU, overhead=Overhead.T4)
            k = self._kernel(stream, kname, kind, cat, params, group)
            b.edge(launch, k, DepKind.CPU_GPU)
            if j == 0:
                for a in after:
                    b.edge(a, k, DepKind.GPU_GPU)
            out.append(k)
        b.task(self.cpu, "T3", "overhead", Category.CPU, overhead=Overhead.T3)
        return out

    def _host_op(
        self, name: str, kernels: Sequence[Kernel], *, comm: bool, async_op: bool, after: Sequence[int], group: int
    ) -> list[int]:
        b = self.b
        gap = b.task(self.cpu, "T1", "overhead", Category.CPU, overhead=Overhead.T1)
        proc = self.comm if (comm and async_op) else self.cpu
        out = []
        for j, (kname, kind, cat, params) in enumerate(kernels):
            k = self._kernel(proc, kname, kind, cat, params, group)
            if j == 0:
                if proc != self.cpu:
                    b.edge(gap, k, DepKind.CPU_CPU)  # issued by the calling thread
                for a in after:
                    if a != k:
                        b.edge(a, k, DepKind.CPU_CPU)
            out.append(k)
        return out

    def _kernel(self, proc: int, name: str, kind: str, cat: Category, params: dict, group: int) -> int:
        params = dict(params)
        flops = params.pop("flops", float("nan"))
        nbytes = params.pop("bytes", float("nan"))
        return self.b.task(proc, name, kind, cat, flops=flops, bytes=nbytes, group=group, params=params)
