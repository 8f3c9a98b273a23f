"""experiments/insitu_gpu.py: kernel classes of traced and synthesised GPU steps, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments import insitu_gpu

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("name", "cls"), [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nt_align1>(x)", "gemm"),
    ("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, float>", "softmax"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda",
     "copy"),
    ("Memset (Device)", "copy"),
    ("void at::native::(anonymous namespace)::EmbeddingBag_updateOutputKernel_sum_mean<float, long>", "embedding"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "pointwise and reductions"),
])
def test_trace_kernels_fall_in_their_class(name: str, cls: str) -> None:
    assert insitu_gpu.trace_class(name) == cls


def test_every_synthesised_kind_has_a_known_class() -> None:
    assert set(insitu_gpu.KIND_CLASS.values()) <= set(insitu_gpu.CLASSES)


def test_one_trace_against_its_synthesised_step(tmp_path: Path) -> None:
    src = REPO / "benchmarks" / "traces" / "h200-s39" / "traces-mlp-b4096.tar.gz"
    (tmp_path / src.name).symlink_to(src)
    insitu_gpu.main(["--traces", str(tmp_path), "--packs", "h200-cal", "--out", str(tmp_path / "r")])
    import json

    rows = json.loads((tmp_path / "r.json").read_text())["rows"]
    assert {r["class"] for r in rows} == set(insitu_gpu.CLASSES)
    gemm = next(r for r in rows if r["class"] == "gemm")
    # the MLP's step is its GEMMs: the trace and the synthesised graph hold the same 11 of them
    assert gemm["traced_kernels"] == gemm["synthesised_kernels"] == 11
    assert 0.5 < gemm["predicted_s[h200-cal]"] / gemm["traced_s"] < 2.0
    assert "| **all** |" in (tmp_path / "r.md").read_text()


def test_a_folder_without_traces_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        insitu_gpu.main(["--traces", str(tmp_path), "--packs", "h200-cal", "--out", str(tmp_path / "r")])
    assert e.value.code == 2
    assert "no traces-MODEL-bBATCH.tar.gz" in capsys.readouterr().err
