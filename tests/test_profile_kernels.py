"""benchmarks/truth/profile_kernels.py: GPU user annotations are spans over kernels, not kernels."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("profile_kernels", ROOT / "benchmarks" / "truth" / "profile_kernels.py")
profile_kernels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(profile_kernels)


def test_user_annotations_are_not_counted_as_kernels():
    # torch's FunctionEvent says so when it can; else the record_function names ('#', no kernel signature)
    assert profile_kernels.is_annotation(SimpleNamespace(name="anything", is_user_annotation=True))
    assert not profile_kernels.is_annotation(SimpleNamespace(name="Optimizer.step#AdamW.step", is_user_annotation=False))
    for name in ("Optimizer.step#AdamW.step", "ProfilerStep#4"):
        assert profile_kernels.is_annotation(SimpleNamespace(name=name))
    for name in ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)",
                 "nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT", "Memcpy HtoD (Pageable -> Device)"):
        assert not profile_kernels.is_annotation(SimpleNamespace(name=name))
    assert profile_kernels.kernel_class("nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_TNT") == "matmul"
