"""Fused (flash) attention kernels timed from their published speeds, per implementation.

A fused attention kernel does not run at a GEMM's ceiling: its softmax, masking and (backward)
recomputed scores keep it well below, and how far below depends on the implementation. This
module holds the published speed of each implementation, in TFLOP/s under the FlashAttention
papers' FLOP accounting (forward ``4 s^2 d h``, halved with a causal mask; backward 2.5x the
forward), and times a kernel as ``flops / rate + kernel floor``.

Implementations (``TransformerSpec.attention``):

* ``flash2`` — FlashAttention-2's CUDA kernels (``flash-attn`` 2.x);
* ``flash_triton`` — FlashAttention written in Triton, as llm-foundry's ``attn_impl: triton`` ran it
  (a copy of ``flash_attn_triton.py`` on the pre-MLIR Triton compiler).
* ``cudnn`` — cuDNN's fused flash attention, which Transformer Engine's ``DotProductAttention``
  (Megatron-LM, NeMo) selects on Hopper: TE v1.7 and later disable FlashAttention there "to give
  FusedAttention preference on Hopper+ for performance reasons" (``transformer_engine/pytorch/attention.py``).
* ``te`` — what Transformer Engine's ``DotProductAttention`` runs on the chip: ``cudnn`` on Hopper,
  FlashAttention-2 (``flash2``) elsewhere when the ``flash-attn`` package is installed, as in NVIDIA's
  PyTorch containers (Megatron-LM's ``--attention-backend auto``, its default).
* ``flex`` — PyTorch's FlexAttention (torch.compile's Triton kernels; torchtitan's default on its main
  branch): FlashAttention-2's rate times 0.90 forward and 0.85 backward, the ratios the PyTorch team
  published for causal attention on an A100 ("FlexAttention: The Flexibility of PyTorch with the
  Performance of FlashAttention", pytorch.org blog, 2024-08-07), taken for the H100 too.

Sources (the numbers are read off the bar labels of the figures; nothing is fitted here):

* A100: Dao 2023, *FlashAttention-2*, figure "Attention forward + backward speed (A100 80GB SXM4)"
  (``assets/flash2_a100_fwd_bwd_benchmark.png`` of Dao-AILab/flash-attention): FlashAttention-2
  and "FlashAttention Triton", fp16, batch x seqlen = 16k, hidden 2048, head dim 64 / 128, with and
  without causal mask, seqlen 512-16k; forward + backward only, so both passes take that rate.
  Three FlashAttention-2 bars hidden under the legend (no causal mask, 1k at head dim 64, 512 and
  1k at 128) are left out.
* H100 (and H200, the same GH100 die): the same paper's "Attention forward + backward speed (H100
  80GB SXM5)" (``assets/flash2_h100_fwd_bwd_benchmark.png``) for FlashAttention-2, and the forward
  alone from Shah et al. 2024, *FlashAttention-3*, "Attention forward speed (H100 80GB SXM5)"
  (``assets/flash3_fp16_fwd.png``, its FlashAttention-2 bars); the backward rate follows from the
  two: ``2.5 / (3.5 / fwd_bwd - 1 / fwd)``. No figure times llm-foundry's pre-MLIR Triton kernel on
  an H100; that compiler emits no Hopper (wgmma) instructions, so ``flash_triton`` on an H100 takes
  the pre-Hopper FlashAttention (v1) bars of the H100 figure — on the A100 figure the two are level
  (68 vs 69 TFLOP/s, causal, head dim 128, seqlen 2k).
* cuDNN on the H100: FlashAttention-3's forward figure (``assets/flash3_fp16_fwd.png``, its cuDNN bars,
  with and without causal mask) and the same paper's backward figure (its cuDNN bars, BF16, head dim 64
  and 128, no causal mask; the figure is not among the repository's assets — its bars as transcribed).
  No causal backward is published: it takes the non-causal backward times the forward's causal /
  non-causal ratio at that length.

Rates are interpolated linearly in log2(seqlen) and in head dim, and held at the ends of the
measured range. A platform without figures (other vendors, fp32) is timed by the GEMM model's
path (:class:`~predictor.timing.kernels.gemm.AnalyticGemm`).
"""

from __future__ import annotations

import numpy as np

from predictor.timing.platforms.schema import Platform

__all__ = ["ATTENTION_IMPLS", "ATTENTION_KINDS", "attention_kind", "published_tflops", "chip_of", "attention_seconds"]

#: fused attention implementations priced from published speeds
ATTENTION_IMPLS = ("flash2", "flash_triton", "cudnn", "te", "flex")
#: sequence lengths of the published figures
SEQS = (512, 1024, 2048, 4096, 8192, 16384)

#: (chip, implementation, causal, head dim) -> TFLOP/s per sequence length of :data:`SEQS`, forward +
#: backward (None: bar not readable). See the module docstring for the figures.
FWD_BWD: dict[tuple[str, str, bool, int], tuple[float | None, ...]] = {
    ("a100", "flash2", True, 64): (88, 119, 140, 156, 165, 171),
    ("a100", "flash2", True, 128): (99, 133, 155, 173, 182, 189),
    ("a100", "flash2", False, 64): (132, None, 162, 171, 175, 176),
    ("a100", "flash2", False, 128): (None, None, 187, 196, 201, 203),
    ("a100", "flash_triton", True, 64): (59, 75, 79, 76, 79, 80),
    ("a100", "flash_triton", True, 128): (50, 61, 68, 74, 78, 80),
    ("a100", "flash_triton", False, 64): (90, 102, 98, 98, 100, 100),
    ("a100", "flash_triton", False, 128): (78, 85, 90, 93, 95, 95),
    ("h100", "flash2", True, 64): (141, 192, 232, 257, 273, 284),
    ("h100", "flash2", True, 128): (163, 221, 265, 294, 308, 328),
    ("h100", "flash2", False, 64): (215, 254, 274, 288, 294, 296),
    ("h100", "flash2", False, 128): (248, 294, 320, 326, 335, 338),
    # FlashAttention (v1) bars of the H100 figure, standing in for the pre-Hopper Triton kernel
    ("h100", "flash_triton", True, 64): (104, 123, 136, 138, 149, 156),
    ("h100", "flash_triton", True, 128): (98, 109, 108, 126, 135, 137),
    ("h100", "flash_triton", False, 64): (157, 159, 161, 161, 166, 168),
    ("h100", "flash_triton", False, 128): (127, 127, 128, 131, 137, 139),
}
#: forward alone, where published (FlashAttention-3 paper, its FlashAttention-2 and cuDNN bars on the H100)
FWD: dict[tuple[str, str, bool, int], tuple[float | None, ...]] = {
    ("h100", "flash2", True, 64): (180, 229, 262, 284, 295, 299),
    ("h100", "flash2", True, 128): (191, 260, 298, 319, 333, 335),
    ("h100", "flash2", False, 64): (282, 306, 318, 321, 322, 324),
    ("h100", "flash2", False, 128): (309, 350, 362, 366, 370, 370),
    ("h100", "cudnn", True, 64): (225, 288, 334, 363, 379, 388),
    ("h100", "cudnn", True, 128): (315, 410, 484, 518, 529, 539),
    ("h100", "cudnn", False, 64): (335, 373, 395, 408, 412, 413),
    ("h100", "cudnn", False, 128): (497, 574, 617, 609, 600, 595),
}
#: backward alone, where published (FlashAttention-3 paper, its cuDNN bars on the H100; no causal mask)
BWD: dict[tuple[str, str, bool, int], tuple[float | None, ...]] = {
    ("h100", "cudnn", False, 64): (266, 348, 395, 417, 432, 433),
    ("h100", "cudnn", False, 128): (305, 408, 465, 499, 518, 516),
}
#: FlexAttention's share of FlashAttention-2's rate, (forward, backward): the PyTorch blog's causal A100 figures
FLEX_OF_FLASH2 = (0.90, 0.85)
#: chip -> the implementation Transformer Engine runs there (``te``)
TE_CHOICE = {"h100": "cudnn", "a100": "flash2"}
#: catalog key prefix -> the chip whose figures time it
CHIPS = {"a100": "a100", "h100": "h100", "h200": "h100"}
#: backward FLOPs over forward FLOPs (the papers' accounting: the backward recomputes the scores)
BWD_FLOPS_RATIO = 2.5


def attention_kind(impl: str, backward: bool) -> str:
    """Op kind of a fused attention kernel of ``impl``, e.g. ``attn_flash2`` / ``attn_flash2_bwd``."""
    return f"attn_{impl}" + ("_bwd" if backward else "")


#: the op kinds this module times
ATTENTION_KINDS = tuple(attention_kind(i, b) for i in ATTENTION_IMPLS for b in (False, True))


def chip_of(platform: Platform) -> str | None:
    """The chip whose published figures time ``platform`` (None: no figures)."""
    return next((chip for prefix, chip in CHIPS.items() if platform.key.startswith(prefix)), None)


def _interp_seq(values: tuple[float | None, ...], seq: float) -> float:
    """TFLOP/s at ``seq`` from the readable bars, linear in log2(seqlen), held at the ends."""
    xs = [np.log2(s) for s, v in zip(SEQS, values, strict=True) if v is not None]
    ys = [v for v in values if v is not None]
    return float(np.interp(np.log2(max(seq, 1.0)), xs, ys))


def _rate(table: dict, chip: str, impl: str, causal: bool, head_dim: float, seq: float) -> float | None:
    """TFLOP/s of ``table`` interpolated in head dim (64..128, held outside) and sequence length."""
    lo, hi = table.get((chip, impl, causal, 64)), table.get((chip, impl, causal, 128))
    if lo is None or hi is None:
        return None
    w = float(np.clip((head_dim - 64.0) / 64.0, 0.0, 1.0))
    return (1.0 - w) * _interp_seq(lo, seq) + w * _interp_seq(hi, seq)


def published_tflops(chip: str, impl: str, causal: bool, head_dim: float, seq: float, backward: bool) -> float:
    """Published TFLOP/s of one pass of ``impl`` on ``chip``: the forward + backward rate, or where the
    forward is published alone, the forward and the backward that the two imply, or where both passes
    are published alone, each (a causal backward from the non-causal one, scaled as the forward);
    ``flex`` is FlashAttention-2's times :data:`FLEX_OF_FLASH2`."""
    if impl == "flex":
        return FLEX_OF_FLASH2[backward] * published_tflops(chip, "flash2", causal, head_dim, seq, backward)
    bwd_full = _rate(BWD, chip, impl, False, head_dim, seq)
    if bwd_full is not None:
        fwd, fwd_full = _rate(FWD, chip, impl, causal, head_dim, seq), _rate(FWD, chip, impl, False, head_dim, seq)
        if fwd is None or fwd_full is None:
            raise KeyError(f"no published forward speed for {impl} on {chip}")
        if not backward:
            return fwd
        return bwd_full * fwd / fwd_full  # a causal backward scales as the causal forward does
    both = _rate(FWD_BWD, chip, impl, causal, head_dim, seq)
    if both is None:
        raise KeyError(f"no published attention speed for {impl} on {chip}")
    fwd = _rate(FWD, chip, impl, causal, head_dim, seq)
    if fwd is None:
        return both
    if not backward:
        return fwd
    return BWD_FLOPS_RATIO / ((1.0 + BWD_FLOPS_RATIO) / both - 1.0 / fwd)


def attention_seconds(kind: str, seq: np.ndarray, head_dim: np.ndarray, heads: np.ndarray, flops: np.ndarray,
                      platform: Platform) -> np.ndarray | None:
    """Seconds of fused attention kernels of op kind ``kind`` (:data:`ATTENTION_KINDS`): ``seq`` tokens per
    sequence, ``head_dim``, ``heads`` = batch x heads, ``flops`` per kernel (causal when it is half of the full
    ``4 s^2 d`` x heads, x 2.5 backward); None when the platform has no published figures of that implementation."""
    chip = chip_of(platform)
    impl = next(i for i in ATTENTION_IMPLS if kind in (attention_kind(i, False), attention_kind(i, True)))
    if impl == "te":
        impl = TE_CHOICE.get(chip, "")
    tables = "flash2" if impl == "flex" else impl
    if chip is None or not any(k[:2] == (chip, tables) for k in (*FWD_BWD, *BWD)):
        return None
    backward = kind.endswith("_bwd")
    full = 4.0 * seq * seq * head_dim * heads * (BWD_FLOPS_RATIO if backward else 1.0)
    causal = flops < 0.75 * full
    out = np.empty(len(seq))
    for i in range(len(seq)):
        tf = published_tflops(chip, impl, bool(causal[i]), float(head_dim[i]), float(seq[i]), backward)
        out[i] = flops[i] / (tf * 1e12)
    return out + platform.kernel_floor_s
