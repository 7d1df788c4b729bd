"""GPU catalog: tolerant name lookup, close-match suggestions, datasheet numbers per precision."""

from __future__ import annotations

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.plan.catalog import CATALOG, gpu_slug, lookup


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),      # the SXM card as NVML names it
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100 80GB PCIe", "a100-80gb"),
    ("Tesla T4", "t4"),
    ("Tesla V100-SXM2-32GB", "v100-32gb"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("rtx3090", "rtx-3090"),
    ("l40s", "l40s"),
    ("NVIDIA A10", "a10"),
    ("a100-40gb", "a100-40gb"),
])
def test_lookup_tolerates_vendor_names(name, expected):
    assert lookup(name).id == expected


def test_prefixes_respect_model_numbers():
    # "A100" must not resolve to the A10; "L40" is the L40, not the L4 or the L40S
    assert lookup("A100 80GB").id == "a100-80gb"
    assert lookup("L40").id == "l40" and lookup("L4").id == "l4" and lookup("NVIDIA L40S").id == "l40s"
    assert lookup("H20").id == "h20" and lookup("NVIDIA H200").id == "h200"


@pytest.mark.parametrize("name, choices", [("a100", "a100-40gb, a100-80gb"), ("V100", "v100-16gb, v100-32gb")])
def test_a_name_with_several_memory_sizes_asks_which(name, choices):
    with pytest.raises(GpuwiseError, match=f"ambiguous: choose one of {choices}") as info:
        lookup(name)
    assert "\n" not in str(info.value)


def test_unknown_name_suggests_close_matches():
    with pytest.raises(GpuwiseError) as info:
        lookup("H300")
    assert "did you mean" in str(info.value) and "h200" in str(info.value)
    with pytest.raises(GpuwiseError, match="known GPUs"):
        lookup("Radeon 7900")


@pytest.mark.parametrize("text, nbytes", [("48GiB", 48 * 2**30), ("24 GB", 24 * 10**9), ("81559MiB", 81559 * 2**20)])
def test_any_other_card_by_its_memory(text, nbytes):
    spec = lookup(text)
    assert spec.memory_bytes == nbytes and spec.modelled


@pytest.mark.parametrize("name, gid, memory_gib, bf16_tflops", [
    ("NVIDIA RTX A6000", "rtx-a6000", 48, 154.8), ("NVIDIA A40", "a40", 45, 149.7), ("NVIDIA L40", "l40", 45, 181),
    ("NVIDIA GeForce RTX 5090", "rtx-5090", 31.8, 209.5), ("NVIDIA H20", "h20", 95.5, 148),
    ("NVIDIA B200", "b200", 179, 2250), ("GB200", "gb200", 173, 2500), ("RTX 6000 Ada", "rtx-6000-ada", 48, 182.1),
])
def test_cards_people_rent_and_own(name, gid, memory_gib, bf16_tflops):
    spec = lookup(name)
    assert spec.id == gid and abs(spec.memory_bytes / 2**30 - memory_gib) < 0.5
    assert spec.peak_flops("bf16") == bf16_tflops * 1e12 and spec.source


def test_mi300x_is_listed_but_not_modelled():
    from gpuwise.plan.estimate import resolve_gpu

    assert lookup("MI300X").modelled is False
    with pytest.raises(GpuwiseError, match="not modelled: cannot tell"):
        resolve_gpu("MI300X")


def test_required_gpus_are_there_with_datasheet_numbers():
    for gid in ("h100-sxm", "h100-pcie", "h200", "a100-40gb", "a100-80gb", "l4", "l40s", "a10", "t4",
                "v100-16gb", "rtx-3090", "rtx-4090"):
        spec = CATALOG[gid]
        assert spec.memory_bytes > 10 * 1024**3 and spec.bandwidth_bytes_per_s > 1e11 and spec.source
        assert spec.flops["fp32"] > 1e12
    h100 = CATALOG["h100-sxm"]
    assert h100.peak_flops("bf16") == 989.5e12                # dense, half of the datasheet's 1979 with sparsity
    assert h100.peak_flops("bf16-pure") == h100.peak_flops("bf16")
    assert CATALOG["a100-80gb"].peak_flops("tf32") == 156e12
    assert CATALOG["h200"].memory_bytes == 143771 * 1024**2    # NVML total of the H200
    # a T4 has no bf16 / tf32 tensor cores: those run at the fp32 rate
    t4 = CATALOG["t4"]
    assert t4.peak_flops("bf16") == t4.peak_flops("tf32") == 8.1e12 and t4.peak_flops("fp16") == 65e12


def test_slug_for_truth_files():
    assert gpu_slug("NVIDIA H200") == "nvidia-h200"
    assert gpu_slug("NVIDIA A100-SXM4-40GB") == "nvidia-a100-sxm4-40gb"
