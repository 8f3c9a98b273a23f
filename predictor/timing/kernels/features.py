"""Input features of the learned kernel models: derived columns (embedding lookups and distinct rows, shape
alignment, the CPU library's code path) computed from a task's parameters (:func:`feature_matrix`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from predictor.timing.kernels.embedding import RF_COLUMNS, RF_COUNTS

__all__ = ["ALIGN16_FEATURES", "ALIGN_FINE_FEATURES", "CONV_ALIGN_FEATURES", "CONV_PATH_FEATURES",
           "DERIVED_FEATURES", "GEMM_SHAPE_FEATURES", "ONEDNN_FEATURES", "ONEDNN_MIN_PRODUCT", "ROUTE_FEATURES",
           "SHORT_ROW_FEATURES", "VECTOR_BYTES", "conv_align_features", "conv_native", "feature_matrix",
           "route_columns", "uniform_reuse_factors"]


def uniform_reuse_factors(lookups: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Expected lookup-weighted 17-bin reuse histogram of ``lookups`` uniform draws from ``rows``.

    A lookup's row is hit ``1 + Poisson(lambda)`` times in total with ``lambda = lookups /
    rows`` (size-biased Poisson), so bin ``j`` gets ``P(1 + Poisson(lambda) in bin j)``.
    Used when a task carries no measured reuse factors. Shape ``(n, 17)``.
    """
    lam = np.asarray(lookups, dtype=np.float64) / np.maximum(np.asarray(rows, dtype=np.float64), 1.0)
    lam = np.maximum(lam, 0.0)
    out = np.zeros((lam.size, len(RF_COLUMNS)))
    from scipy.special import pdtr  # Poisson CDF, a vectorised ufunc

    cdf_prev = np.zeros(lam.size)  # P(Poisson <= lo - 2) for the current bin
    for j in range(len(RF_COLUMNS)):
        hi = 1 if j == 0 else 2**j
        # c in [lo, hi]  <=>  Poisson in [lo - 1, hi - 1]
        cdf = pdtr(hi - 1, lam) if j < len(RF_COLUMNS) - 1 else np.ones(lam.size)
        out[:, j] = np.maximum(cdf - cdf_prev, 0.0)
        cdf_prev = cdf
    s = out.sum(axis=1, keepdims=True)
    return out / np.where(s > 0, s, 1.0)


#: embedding-lookup features computed from B, L, E, D and the reuse factors (log2-transformed):
#: ``lookups = B L``; ``distinct_rows = lookups * sum_j rf_j / c_j`` (rows touched, ``c_j`` the
#: representative access count of bin ``j``); ``distinct_bytes`` and ``table_bytes`` their bytes.
#: GEMMs on a GPU: ``ld_aligned`` (1 when the rows of n and k are 16-byte multiples, else 0; not logged).
#: GEMMs on a CPU: ``m_al16``, ``n_al16``, ``k_al16`` (1 when that dimension is a multiple of 16
#: elements, else 0; not logged): BLAS micro-kernels work on register tiles of 8-16 fp32 lanes,
#: and a ragged edge costs a masked or scalar tail.
ALIGN16_FEATURES = ("m_al16", "n_al16", "k_al16")
#: finer steps of the vector dimension of a CPU GEMM (not logged): ``n_al8`` / ``n_al4`` = 1 when ``n`` (the
#: columns of the result, the dimension BLAS vectorises for row-major operands) is a multiple of 8 / 4 elements.
#: A ragged ``n`` costs a masked tail in proportion to what is left over: on a Zen 4 VM the fp32 net with the
#: 16-element flags alone over-predicted bmm samples with ``n`` = 8 mod 16 by a median 18 % (1321 unseen samples)
ALIGN_FINE_FEATURES = ("n_al8", "n_al4")
#: PyTorch's CPU convolution path (columns ``m = H W``, ``k``, ``dim = kh``, ``batch``): 1 when an fp32
#: convolution runs ATen's own kernel (im2col + GEMM, ``Slow2d``), 0 when it goes to oneDNN. ATen's
#: ``use_mkldnn`` rule: a 1x1 filter on fewer than 16 images stays native on one thread
#: (``conv_native``; with more threads, ``conv_native_mt``, oneDNN takes it), and so does a filter of at
#: most 3x3 on a single image of at most 20480 input elements (strided and dilated convolutions always
#: go to oneDNN; graph tasks do not carry the stride and read as stride 1). An MLP on log sizes did not
#: place that edge from a few hundred samples: with the indicator the held-out conv2d GMAE of five stored
#: calibrations fell from 8.6-12.0 % to 7.1-8.2 %
CONV_PATH_FEATURES = ("conv_native", "conv_native_mt")
#: A convolution's channel counts on a vector boundary (columns ``n`` = ``C_out``, ``k`` = ``C_in kh kw``,
#: ``dim`` = ``kh``; not logged): ``cout_alV`` / ``cin_alV`` = 1 when ``C_out`` / ``C_in`` is a multiple of ``V``,
#: else 0, for ``V`` = 8 or 16 fp32 lanes. oneDNN's fp32 convolutions block channels by the vector width
#: (``nChw16c`` with AVX-512); on a Zen 4 VM held-out samples over 1 ms with ``C_out`` a multiple of 16 ran a
#: median 7-14 % under the net's prediction without them. The spec takes the 16-lane pair on AVX-512 CPUs only
#: (:func:`conv_align_features`); the 8-lane pair is there to try
CONV_ALIGN_FEATURES = ("cout_al8", "cin_al8", "cout_al16", "cin_al16")


def conv_align_features(lanes: int) -> tuple[str, ...]:
    """The channel-alignment inputs of a CPU convolution net on a CPU with ``lanes`` fp32 lanes: the 16-lane pair
    of :data:`CONV_ALIGN_FEATURES` with AVX-512 (``lanes`` >= 16), none with fewer: on the AVX2 VM's stored
    calibration the 8-lane (and 16-lane) inputs cost 0.6-1.4 points of held-out GMAE."""
    return ("cout_al16", "cin_al16") if lanes >= 16 else ()


#: GEMM and convolution shape features (``gemm_bytes`` and ``conv_bytes`` are not in any spec: their held-out
#: gains did not hold over other splits; the CPU fp32 GEMM net takes ``bmm_naive`` and ``bmm_intensity``, see
#: :mod:`predictor.timing.calibration.gemm`).
#: ``gemm_bytes`` = ``dtype_bytes x batch x (m k + k n + m n)``, the operands' and result's bytes (log2);
#: ``bmm_naive`` = 1 when ``m n k < 400`` (not logged; in a net pooled over the GEMM ops, only on ``is_bmm``
#: rows): ATen's CPU ``bmm`` runs its own per-entry loop below that product instead of a BLAS batch;
#: ``bmm_intensity`` = log2 of ``2 m n k / (dtype_bytes (m k + k n + m n))`` on bmm rows, 0 on others (not
#: logged): a bmm with a small k streams its result and runs at memory speed;
#: ``conv_bytes`` = a "same"-padded convolution's input,
#: weight and output bytes, ``dtype_bytes x (batch m k / kh^2 + n k + batch n m)`` (log2; the columns
#: :func:`conv_native` reads)
GEMM_SHAPE_FEATURES = ("gemm_bytes", "bmm_naive", "conv_bytes", "bmm_intensity")
#: PyTorch's CPU path for a bf16 GEMM (not logged): ``onednn_gemm`` = 1 when ``batch x m x n x k`` exceeds
#: 16^3 = 4096, the size from which ATen hands a bf16 ``addmm`` / ``mm`` / ``bmm`` to oneDNN
#: (``checksize`` in ``aten/src/ATen/native/mkldnn/Matmul.cpp``; on a CPU with AVX-512 BF16), else 0 (its own
#: blocked kernel). On a Zen 4 VM the step costs a fixed ~20 us: products of 1k-4k ran a median 6-8 us, of
#: 4k-16k 27-35 us (all three bf16 ops; fp32 GEMMs have no such edge)
ONEDNN_FEATURES = ("onednn_gemm",)
ONEDNN_MIN_PRODUCT = 16.0**3
#: rows shorter than one 512-bit vector (not logged): ``short_rows`` = 1 when ``n x dtype_bytes`` < 64. ATen's
#: vectorised row kernels (softmax and its backwards) take a scalar / masked path for such rows: on the Zen 4 VM
#: they cost ~10x per element (softmax 18-19 ns at n < 16 fp32 against 1.6 ns at n = 16)
SHORT_ROW_FEATURES = ("short_rows",)
VECTOR_BYTES = 64.0
#: route inputs of a net pooled over several GEMM kernels (``ModelSpec.pool``; not logged): 1 when the task's
#: route (``"{op}/{dtype}"``, :meth:`~predictor.timing.kernels.learned.MLPKernelModel.predict`) is an ``addmm`` / a ``bmm``, else 0; ``mm`` is
#: both 0. Taken from the route, not the task's columns: in training from the benchmark row's kernel, in
#: prediction from the router's key, so a ``linear`` task times as the ``addmm`` it runs
ROUTE_FEATURES = ("is_addmm", "is_bmm")


def route_columns(route: str, n: int) -> dict[str, np.ndarray]:
    """The :data:`ROUTE_FEATURES` columns of ``n`` tasks on ``route`` (``"addmm/fp32"`` ...)."""
    op = route.split("/", 1)[0]
    return {f: np.full(n, float(f == f"is_{op}")) for f in ROUTE_FEATURES}


DERIVED_FEATURES = ("lookups", "distinct_rows", "distinct_bytes", "table_bytes", "ld_aligned", *ALIGN16_FEATURES,
                    *ALIGN_FINE_FEATURES,
                    *CONV_PATH_FEATURES, *CONV_ALIGN_FEATURES, *GEMM_SHAPE_FEATURES, *ONEDNN_FEATURES, *SHORT_ROW_FEATURES)


def _kernel_height(columns: Mapping[str, np.ndarray]) -> np.ndarray:
    """A convolution's filter height ``kh`` (column ``dim``; NaN or below 1: 1)."""
    return np.maximum(np.nan_to_num(np.asarray(columns["dim"], dtype=np.float64), nan=1.0), 1.0)


def conv_native(columns: Mapping[str, np.ndarray], single_thread: bool = True) -> np.ndarray:
    """Whether PyTorch runs each stride-1 fp32 convolution on the CPU with its own kernel rather than
    oneDNN (bool array; :data:`CONV_PATH_FEATURES`), from columns ``m`` (output pixels per image, = H W
    with "same" padding), ``k`` (``C_in kh kw``), ``dim`` (``kh``, square filters) and ``batch`` (images)."""
    kh = _kernel_height(columns)
    k = np.asarray(columns["k"], dtype=np.float64)
    images = np.asarray(columns["batch"], dtype=np.float64)
    in_elements = k / (kh * kh) * np.asarray(columns["m"], dtype=np.float64)  # C_in H W of one image
    one_by_one = (kh == 1) & (images < 16) if single_thread else np.zeros(len(k), dtype=bool)
    return one_by_one | ((kh <= 3) & (images <= 1) & (in_elements <= 20480))


def _dtype_bytes(columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """Bytes per element of each of ``n`` rows (column ``dtype_bytes``; missing or NaN: 4, fp32)."""
    return np.nan_to_num(np.asarray(columns.get("dtype_bytes", np.full(n, 4.0)), dtype=np.float64), nan=4.0)


def _batch(columns: Mapping[str, np.ndarray], n: int) -> np.ndarray:
    """Batch entries of each of ``n`` GEMM rows (column ``batch``; missing, NaN or below 1: 1, an unbatched op)."""
    return np.maximum(np.nan_to_num(np.asarray(columns.get("batch", np.ones(n)), dtype=np.float64), nan=1.0), 1.0)


def feature_matrix(columns: Mapping[str, np.ndarray], features: Sequence[str], n: int) -> np.ndarray:
    """The (n, f) raw feature matrix of ``features`` from ``columns`` (derived ones computed)."""
    out = []
    for f in features:
        if f == "ld_aligned":
            # GEMM operands whose rows are 16-byte multiples (n and k): the GPU's fast (vectorised,
            # TMA) kernels need them; a ragged n or k runs ~5x slower on an H100 at the same FLOPs
            dt = _dtype_bytes(columns, n)
            rows_n = np.asarray(columns["n"], dtype=np.float64) * dt
            rows_k = np.asarray(columns["k"], dtype=np.float64) * dt
            out.append(((np.mod(rows_n, 16) == 0) & (np.mod(rows_k, 16) == 0)).astype(np.float64))
        elif f in ALIGN16_FEATURES or f in ALIGN_FINE_FEATURES:
            step = float(f.rsplit("al", 1)[1])
            out.append((np.mod(np.asarray(columns[f[0]], dtype=np.float64), step) == 0).astype(np.float64))
        elif f in CONV_PATH_FEATURES:
            out.append(conv_native(columns, single_thread=f == "conv_native").astype(np.float64))
        elif f in CONV_ALIGN_FEATURES:
            if f.startswith("cout_"):
                channels = np.asarray(columns["n"], dtype=np.float64)
            else:
                kh = _kernel_height(columns)
                channels = np.asarray(columns["k"], dtype=np.float64) / (kh * kh)
            out.append((np.mod(np.round(channels), float(f.rsplit("al", 1)[1])) == 0).astype(np.float64))
        elif f in SHORT_ROW_FEATURES:
            out.append((np.asarray(columns["n"], dtype=np.float64) * _dtype_bytes(columns, n) < VECTOR_BYTES)
                       .astype(np.float64))
        elif f in ONEDNN_FEATURES:
            product = np.prod([np.asarray(columns[c], dtype=np.float64) for c in ("m", "n", "k")], axis=0)
            b = _batch(columns, n)
            out.append((b * product > ONEDNN_MIN_PRODUCT).astype(np.float64))
        elif f in GEMM_SHAPE_FEATURES:
            m, nn, k = (np.asarray(columns[c], dtype=np.float64) for c in ("m", "n", "k"))
            b = _batch(columns, n)
            dt = _dtype_bytes(columns, n)
            gate = np.asarray(columns["is_bmm"], dtype=np.float64) if "is_bmm" in columns else 1.0
            if f == "bmm_naive":  # in a net pooled over addmm / mm / bmm, only the bmm rows (route input)
                out.append((m * nn * k < 400.0) * gate)
            elif f == "bmm_intensity":  # log2 of FLOPs per operand / result byte, bmm rows only
                out.append(np.log2(2.0 * m * nn * k / (dt * (m * k + k * nn + m * nn))) * gate)
            elif f == "conv_bytes":
                kh = _kernel_height(columns)
                out.append(dt * (b * m * k / (kh * kh) + nn * k + b * nn * m))
            else:
                out.append(dt * b * (m * k + k * nn + m * nn))
        elif f in DERIVED_FEATURES:
            b = np.asarray(columns["batch"], dtype=np.float64)
            L = np.asarray(columns["pooling"], dtype=np.float64)
            d = np.asarray(columns["dim"], dtype=np.float64)
            dt = _dtype_bytes(columns, n)
            lookups = np.maximum(b * L, 1.0)
            if f == "lookups":
                out.append(lookups)
            elif f == "table_bytes":
                out.append(np.asarray(columns["rows"], dtype=np.float64) * d * dt)
            else:
                rf = np.stack([np.asarray(columns[c], dtype=np.float64) for c in RF_COLUMNS], axis=1)
                distinct = np.maximum(lookups * (rf / RF_COUNTS).sum(axis=1), 1.0)
                out.append(distinct if f == "distinct_rows" else distinct * d * dt)
        else:
            out.append(np.asarray(columns[f], dtype=np.float64))
    return np.stack(out, axis=1) if out else np.zeros((n, 0))
