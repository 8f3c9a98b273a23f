"""CPU packs record the CPU they measured; a mismatch with this host is named."""

from __future__ import annotations

from predictor.timing.platforms.cpu_local import ISA_FLAGS, cpu_signature, signature_mismatch


def test_signature_names_the_cpu_and_its_vector_isa():
    s = cpu_signature()
    assert set(s) == {"vendor", "model_name", "family", "model", "stepping", "torch_capability", "isa"}
    assert s["torch_capability"] and all(f in ISA_FLAGS for f in s["isa"].split())


def test_mismatch_names_what_differs():
    here = {"model_name": "AMD EPYC", "family": "25", "model": "1", "torch_capability": "AVX2", "isa": "avx2 fma"}
    assert signature_mismatch(dict(here), here) is None
    other = {**here, "model": "17", "torch_capability": "AVX512", "isa": "avx2 fma avx512f avx512_bf16"}
    why = signature_mismatch(other, here)
    assert why.startswith("the pack was measured on another CPU") and "AVX512 vs AVX2" in why and "model 17" in why
    assert "does not record its CPU" in signature_mismatch(None, here)


def test_a_fresh_cpu_calibration_records_its_cpu(tmp_path):
    from predictor.timing.calibrate import CalibrationOptions, calibrate, refit

    pack = calibrate(CalibrationOptions("cpu", out=tmp_path / "p", tiny=True, threads=1, families=["elementwise"]), register=False, log=lambda s: None)
    assert pack.manifest["cpu"] == cpu_signature()
    again = refit(tmp_path / "p", tmp_path / "q", log=lambda s: None, register=False)
    assert again.manifest["cpu"] == pack.manifest["cpu"]  # a refit keeps the measuring host's record
