"""A catalog of common GPUs: memory, peak dense FLOP/s per precision, memory bandwidth, architecture.

Peak numbers are the vendor's *dense* figures (the datasheets print tensor-core numbers "with sparsity"
too; those are halved here). `memory_bytes` is the total NVML / nvidia-smi reports for the card (what
a process can ever see), not the marketing "80 GB". Every entry cites its datasheet or whitepaper.
A name is looked up tolerantly ("NVIDIA H100 80GB HBM3", "Tesla T4", "a100-sxm4-40gb", "rtx4090");
an unknown name is a GpuwiseError that suggests close matches.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from ..errors import GpuwiseError

TFLOPS = 1e12
GBPS = 1e9
MIB = 1024**2


@dataclass(frozen=True)
class GpuSpec:
    id: str
    name: str
    memory_bytes: int                       # NVML memory total
    flops: dict[str, float]                 # peak dense FLOP/s: fp32 (CUDA cores), tf32/bf16/fp16 (tensor cores)
    bandwidth_bytes_per_s: float
    arch: str                               # volta | turing | ampere | ada | hopper
    compute_capability: str
    source: str
    aliases: tuple[str, ...] = ()
    modelled: bool = True                   # False: numbers only; its allocator/context are not modelled
    listed: bool = True                     # False: a named configuration, not a product (`--gpu all` skips it)

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s for a gpuwise precision; bf16 on a GPU without bf16 tensor cores runs at fp32 rate."""
        key = {"bf16-pure": "bf16"}.get(precision, precision)
        return self.flops.get(key) or self.flops["fp32"]

    @property
    def slug(self) -> str:
        return self.id


def _spec(id, name, memory_mib, fp32, tf32, bf16, fp16, bw_gbps, arch, cc, source, aliases=(), modelled=True,
          listed=True):
    flops = {"fp32": fp32 * TFLOPS, "tf32": (tf32 or 0) * TFLOPS, "bf16": (bf16 or 0) * TFLOPS,
             "fp16": (fp16 or 0) * TFLOPS}
    return GpuSpec(id, name, int(memory_mib * MIB), flops, bw_gbps * GBPS, arch, cc, source, tuple(aliases), modelled,
                   listed)


def power_limited(low: float, low_w: float, high: float, high_w: float, limit_w: float) -> float:
    """Peak FLOP/s of a GPU run at a power limit between two datasheet SKUs of the same die and SM count:
    linear in the limit between the low-power SKU's peak (at its TDP) and the high-power one's. The
    datasheet peak is the clock NVIDIA rates a SKU at within its TDP, so a lower limit means a lower rated
    clock; linear interpolation between the two rated points is this model's assumption."""
    if not low_w <= limit_w <= high_w:
        raise ValueError(f"power limit {limit_w} W outside the datasheet range {low_w}-{high_w} W")
    return low + (high - low) * (limit_w - low_w) / (high_w - low_w)


# H100 SXM (700 W) and H100 NVL (400 W): the same GH100 die with 132 SMs. H100 NVL datasheet (NVIDIA H100
# Tensor Core GPU datasheet, NVL column): FP32 60, TF32 835*, BF16/FP16 1,671* (*sparsity), max TDP 350-400 W.
_H100_SXM_W, _H100_NVL_W = 700, 400
_H100_NVL = {"fp32": 60, "tf32": 417.5, "bf16": 835.5}
_H100_SXM = {"fp32": 67, "tf32": 494.5, "bf16": 989.5}


def _h100_at(limit_w: float) -> dict[str, float]:
    return {k: power_limited(_H100_NVL[k], _H100_NVL_W, _H100_SXM[k], _H100_SXM_W, limit_w) for k in _H100_SXM}


_GRAND_TETON = _h100_at(500)


# memory_mib: NVML/nvidia-smi totals as the cards report them. TF32/BF16/FP16: dense tensor-core TFLOPS.
CATALOG: dict[str, GpuSpec] = {s.id: s for s in [
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): FP32 67, TF32 989* / BF16 1979* / FP16 1979* (*sparsity),
    # 3.35 TB/s HBM3. https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
    _spec("h100-sxm", "NVIDIA H100 SXM5 80GB", 81559, 67, 494.5, 989.5, 989.5, 3350, "hopper", "9.0",
          "NVIDIA H100 Tensor Core GPU datasheet (SXM)", ["h100", "h100sxm", "h100sxm5", "h10080gbhbm3", "h100hbm3"]),
    # same datasheet, H100 PCIe: FP32 51, TF32 756*, BF16/FP16 1513* (*sparsity), 2.0 TB/s HBM2e
    _spec("h100-pcie", "NVIDIA H100 PCIe 80GB", 81559, 51, 378, 756.5, 756.5, 2000, "hopper", "9.0",
          "NVIDIA H100 Tensor Core GPU datasheet (PCIe)", ["h100pcie", "h10080gbpcie"]),
    # Meta's Grand Teton H100 (torchtitan benchmarks/llama3_h100_202412_torchtitan.md, "Hardware"): "96GB HBM2e
    # with 2.4 TB/sec peak memory bandwidth", "the default 500W power limit"; its footnote: "HBM2e-based SXM
    # H100 with lower TDP, the actual peak TFLOPs number is between SXM and NVL". Peaks: the H100 SXM / NVL
    # datasheet points at 500 W (`power_limited`), 887 bf16 TFLOPS. Memory: the stated 96 GB (not an NVML
    # total). A named configuration (the torchtitan published rows ran on it), not a product: `--gpu all`
    # skips it.
    _spec("h100-sxm-500w", "NVIDIA H100 SXM 96GB HBM2e at 500 W (Grand Teton)", 96e9 / MIB, _GRAND_TETON["fp32"],
          _GRAND_TETON["tf32"], _GRAND_TETON["bf16"], _GRAND_TETON["bf16"], 2400, "hopper", "9.0",
          "torchtitan llama3_h100_202412 hardware + NVIDIA H100 SXM/NVL datasheets at 500 W",
          ["h100sxm500w", "h100hbm2e500w", "grandteton"], listed=False),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): FP32 67, TF32 989*, BF16/FP16 1979* (*sparsity),
    # 141 GB HBM3e at 4.8 TB/s. https://www.nvidia.com/en-us/data-center/h200/  (NVML total 143771 MiB)
    _spec("h200", "NVIDIA H200", 143771, 67, 494.5, 989.5, 989.5, 4800, "hopper", "9.0",
          "NVIDIA H200 Tensor Core GPU datasheet (SXM)", ["h200", "h200sxm", "h200141gbhbm3e"]),
    # NVIDIA A100 datasheet: FP32 19.5, TF32 156, BF16/FP16 312 (dense), 40 GB HBM2 1,555 GB/s (SXM),
    # 80 GB HBM2e 2,039 GB/s (SXM). nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
    _spec("a100-40gb", "NVIDIA A100 40GB", 40960, 19.5, 156, 312, 312, 1555, "ampere", "8.0",
          "NVIDIA A100 Tensor Core GPU datasheet (40GB SXM)", ["a10040gb", "a100sxm440gb", "a100pcie40gb"]),
    _spec("a100-80gb", "NVIDIA A100 80GB", 81920, 19.5, 156, 312, 312, 2039, "ampere", "8.0",
          "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM)", ["a10080gb", "a100sxm480gb", "a10080gbpcie"]),
    # NVIDIA L4 datasheet: FP32 30.3, TF32 120*, BF16/FP16 242* (*sparsity), 24 GB GDDR6 300 GB/s
    _spec("l4", "NVIDIA L4", 23034, 30.3, 60, 121, 121, 300, "ada", "8.9",
          "NVIDIA L4 Tensor Core GPU datasheet", ["l4"]),
    # NVIDIA L40S datasheet: FP32 91.6, TF32 366*, BF16/FP16 733* (*sparsity), 48 GB GDDR6 864 GB/s
    _spec("l40s", "NVIDIA L40S", 46068, 91.6, 183, 366, 366, 864, "ada", "8.9",
          "NVIDIA L40S GPU datasheet", ["l40s"]),
    # NVIDIA A10 datasheet: FP32 31.2, TF32 125*, BF16/FP16 250* (*sparsity), 24 GB GDDR6 600 GB/s
    _spec("a10", "NVIDIA A10", 23028, 31.2, 62.5, 125, 125, 600, "ampere", "8.6",
          "NVIDIA A10 Tensor Core GPU datasheet", ["a10"]),
    # NVIDIA T4 datasheet: FP32 8.1, mixed FP16/FP32 65; no TF32/BF16 tensor cores; 16 GB GDDR6 320 GB/s
    _spec("t4", "Tesla T4", 15360, 8.1, None, None, 65, 320, "turing", "7.5",
          "NVIDIA T4 Tensor Core GPU datasheet", ["t4"]),
    # NVIDIA V100 datasheet (SXM2): FP32 15.7, tensor FP16 125; no TF32/BF16; HBM2 900 GB/s, 16 or 32 GB
    _spec("v100-16gb", "Tesla V100 16GB", 16160, 15.7, None, None, 125, 900, "volta", "7.0",
          "NVIDIA Tesla V100 GPU datasheet (SXM2 16GB)", ["v10016gb", "v100sxm216gb", "v100pcie16gb"]),
    _spec("v100-32gb", "Tesla V100 32GB", 32510, 15.7, None, None, 125, 900, "volta", "7.0",
          "NVIDIA Tesla V100 GPU datasheet (SXM2 32GB)", ["v10032gb", "v100sxm232gb", "v100pcie32gb"]),
    # NVIDIA Ampere GA102 GPU architecture whitepaper, RTX 3090: FP32 35.6; TF32 35.6; FP16/BF16 tensor with
    # FP32 accumulate 71 (dense); 24 GB GDDR6X 936 GB/s
    _spec("rtx-3090", "NVIDIA GeForce RTX 3090", 24576, 35.6, 35.6, 71, 71, 936, "ampere", "8.6",
          "NVIDIA Ampere GA102 GPU Architecture whitepaper (RTX 3090)", ["rtx3090", "3090"]),
    # NVIDIA Ada GPU architecture whitepaper, RTX 4090: FP32 82.6; TF32 82.6; FP16/BF16 tensor with FP32
    # accumulate 165.2 (dense); 24 GB GDDR6X 1008 GB/s
    _spec("rtx-4090", "NVIDIA GeForce RTX 4090", 24564, 82.6, 82.6, 165.2, 165.2, 1008, "ada", "8.9",
          "NVIDIA Ada GPU Architecture whitepaper (RTX 4090)", ["rtx4090", "4090"]),
    # NVIDIA RTX Blackwell GPU architecture whitepaper, RTX 5090: FP32 104.8; TF32 tensor 104.8 (dense);
    # FP16/BF16 tensor with FP32 accumulate 209.5 (dense); 32 GB GDDR7 1792 GB/s
    _spec("rtx-5090", "NVIDIA GeForce RTX 5090", 32607, 104.8, 104.8, 209.5, 209.5, 1792, "blackwell", "12.0",
          "NVIDIA RTX Blackwell GPU Architecture whitepaper (RTX 5090)", ["rtx5090", "5090"]),
    # NVIDIA Ampere GA102 GPU architecture whitepaper, RTX A6000: FP32 38.7; TF32 tensor 77.4 (dense);
    # FP16/BF16 tensor with FP32 accumulate 154.8 (dense); 48 GB GDDR6 768 GB/s
    _spec("rtx-a6000", "NVIDIA RTX A6000", 49140, 38.7, 77.4, 154.8, 154.8, 768, "ampere", "8.6",
          "NVIDIA Ampere GA102 GPU Architecture whitepaper (RTX A6000)", ["a6000", "rtxa6000"]),
    # NVIDIA RTX 6000 Ada Generation datasheet: FP32 91.1; TF32 tensor 182.1*, FP16/BF16 364.2* (*sparsity,
    # FP32 accumulate); 48 GB GDDR6 960 GB/s
    _spec("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", 49140, 91.1, 91.05, 182.1, 182.1, 960, "ada", "8.9",
          "NVIDIA RTX 6000 Ada Generation datasheet", ["rtx6000ada", "rtx6000adageneration", "6000ada"]),
    # NVIDIA A40 datasheet: FP32 37.4; TF32 74.8 (149.6*); BF16/FP16 149.7 (299.4*) (*sparsity);
    # 48 GB GDDR6 with ECC, 696 GB/s
    _spec("a40", "NVIDIA A40", 46068, 37.4, 74.8, 149.7, 149.7, 696, "ampere", "8.6",
          "NVIDIA A40 datasheet", ["a40"]),
    # NVIDIA L40 datasheet: FP32 90.5; TF32 90.5 (181*); BF16/FP16 181 (362*) (*sparsity); 48 GB GDDR6 864 GB/s
    _spec("l40", "NVIDIA L40", 46068, 90.5, 90.5, 181, 181, 864, "ada", "8.9",
          "NVIDIA L40 GPU datasheet", ["l40"]),
    # NVIDIA H20 (Hopper, China market) product brief: FP32 44; TF32 74; BF16/FP16 148 (dense);
    # 96 GB HBM3 4.0 TB/s
    _spec("h20", "NVIDIA H20", 97871, 44, 74, 148, 148, 4000, "hopper", "9.0",
          "NVIDIA H20 product brief", ["h20"]),
    # NVIDIA HGX B200 datasheet (8 GPUs: FP32 600 TF, TF32 18 PF*, BF16/FP16 36 PF* (*sparsity), 1.44 TB HBM3e,
    # 62 TB/s): per GPU FP32 75, TF32 1125, BF16/FP16 2250 dense, 180 GB at 7.7 TB/s
    _spec("b200", "NVIDIA B200", 183359, 75, 1125, 2250, 2250, 7700, "blackwell", "10.0",
          "NVIDIA HGX B200 datasheet (per GPU)", ["b200", "hgxb200", "dgxb200"]),
    # NVIDIA GB200 NVL72 datasheet (72 GPUs: FP32 5,760 TF, TF32 180 PF*, BF16/FP16 360 PF* (*sparsity),
    # 13.4 TB HBM3e at 576 TB/s): per GPU FP32 80, TF32 1250, BF16/FP16 2500 dense, 186 GB at 8 TB/s
    # (memory from the datasheet's GB, not an NVML total)
    _spec("gb200", "NVIDIA GB200 (per Blackwell GPU)", 186e9 / MIB, 80, 1250, 2500, 2500, 8000, "blackwell", "10.0",
          "NVIDIA GB200 NVL72 datasheet (per GPU)", ["gb200", "gb200nvl72"]),
    # AMD Instinct MI300X data sheet: FP32 163.4 (matrix); TF32 653.7; BF16/FP16 1307.4 (dense); 192 GB HBM3
    # 5.3 TB/s. Listed for its numbers: ROCm's allocator and context are not modelled.
    _spec("mi300x", "AMD Instinct MI300X", 192e9 / MIB, 163.4, 653.7, 1307.4, 1307.4, 5300, "cdna3", "gfx942",
          "AMD Instinct MI300X data sheet", ["mi300x", "instinctmi300x"], modelled=False),
]}

CUSTOM_ARCH = "hopper"  # `--gpu 48GiB`: the context and workspaces of a recent NVIDIA GPU are assumed


def custom(name: str) -> GpuSpec | None:
    """`48GiB`, `24 GB`, `80000MiB`: a GPU known only by its memory (no FLOP/s: no roofline). None when
    `name` is not a size."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(gib|gb|mib|mb|tib|tb)\s*", name.lower())
    if m is None:
        return None
    value, unit = float(m.group(1)), m.group(2)
    scale = {"gib": 2**30, "gb": 1e9, "mib": 2**20, "mb": 1e6, "tib": 2**40, "tb": 1e12}[unit]
    nbytes = int(value * scale)
    if nbytes <= 0:
        raise GpuwiseError(f"--gpu {name!r}: the memory must be positive")
    return GpuSpec(f"custom-{m.group(1)}{unit}", f"a GPU with {name.strip()} of memory", nbytes, {"fp32": 0.0}, 0.0,
                   CUSTOM_ARCH, "", "given on the command line")


def _compact(name: str) -> str:
    text = name.lower()
    for word in ("nvidia", "geforce", "tesla", "tensor core", "gpu"):
        text = text.replace(word, "")
    return re.sub(r"[^a-z0-9]", "", text)


def lookup(name: str) -> GpuSpec:
    """The catalog entry for a GPU name as NVML, nvidia-smi or a person writes it."""
    sized = custom(name)
    if sized is not None:
        return sized
    key = _compact(name)
    if not key:
        raise GpuwiseError(f"empty GPU name; known GPUs: {', '.join(CATALOG)}")
    family = sorted({s.id for s in CATALOG.values() for a in (_compact(s.id), *s.aliases)
                     if a.startswith(key) and a[len(key):][:1].isdigit() and s.memory_bytes}
                    if not any(key in (_compact(s.id), *s.aliases) for s in CATALOG.values()) else [])
    if len({CATALOG[i].memory_bytes for i in family}) > 1:  # "a100": 40 or 80 GB? the answer depends on it
        raise GpuwiseError(f"GPU {name!r} is ambiguous: choose one of {', '.join(family)} (or give its memory, "
                           f"e.g. --gpu 48GiB)")
    best: tuple[int, GpuSpec] | None = None
    for spec in CATALOG.values():
        for alias in (_compact(spec.id), *spec.aliases):
            if key == alias:
                return spec
            # a prefix counts only at a word boundary: "l40" is not an "l4", "a100" not an "a10"
            rest = key[len(alias):]
            if key.startswith(alias) and not rest[:1].isdigit() and (best is None or len(alias) > best[0]):
                best = (len(alias), spec)
    if best is not None:
        return best[1]
    choices = {spec.id: spec for spec in CATALOG.values()}
    names = list(choices) + [s.name for s in CATALOG.values()]
    close = difflib.get_close_matches(name.lower(), [n.lower() for n in names], n=3, cutoff=0.4)
    close_ids = []
    for c in close:
        for s in CATALOG.values():
            if c in (s.id, s.name.lower()) and s.id not in close_ids:
                close_ids.append(s.id)
    hint = f"did you mean {', '.join(close_ids)}? " if close_ids else ""
    raise GpuwiseError(f"unknown GPU {name!r}: {hint}known GPUs: {', '.join(CATALOG)}")


def gpu_slug(name: str) -> str:
    """File-name form of a GPU name, as used for benchmarks/truth/<slug>.jsonl: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# Compute capability by GPU name, for fake GPUs and external watches where torch did not report it,
# when the catalog does not list the GPU.
# Source: NVIDIA, "CUDA GPUs - Compute Capability", developer.nvidia.com/cuda-gpus. Longest match wins.
_CAPABILITY = {"V100": (7, 0), "T4": (7, 5), "RTX 20": (7, 5), "A100": (8, 0), "A30": (8, 0), "A10": (8, 6),
               "A40": (8, 6), "RTX 30": (8, 6), "A6000": (8, 6), "L4": (8, 9), "L40": (8, 9), "RTX 40": (8, 9),
               "H100": (9, 0), "H200": (9, 0), "GH200": (9, 0), "B100": (10, 0), "B200": (10, 0),
               "P100": (6, 0), "K80": (3, 7)}


def tensor_core_capability(name: str) -> tuple[int, int] | None:
    """Compute capability for a GPU name: the catalog above first, else the table above (the monitor's
    precision rule, doctor's guess at CUDA's device order)."""
    if not name:
        return None
    try:
        major, minor = lookup(name).compute_capability.split(".")[:2]
        return int(major), int(minor)
    except GpuwiseError:  # a GPU the catalog does not list
        pass
    hits = [(len(k), v) for k, v in _CAPABILITY.items() if k.lower() in name.lower()]
    return max(hits)[1] if hits else None


@dataclass(frozen=True)
class SpeedSpec:
    """What the step-time model (plan/speed/) needs beyond the datasheet peaks: SM count, the fraction of
    peak matmul FLOP/s a GEMM reaches at its best shape (MAMF) and, where published, the fraction a 16-bit
    one sustains (MSMF), the fraction of datasheet memory bandwidth a streaming kernel reaches, and the
    GPU-to-GPU link of a node (plan/speed/comm.py LINKS)."""

    sm_count: int
    matmul_efficiency: float
    memory_efficiency: float
    link: str
    matmul_source: str
    # the fraction of the 16-bit peak a bf16/fp16 GEMM sustains once the GPU is power-saturated (MSMF), where it is
    # published; None: such GEMMs take matmul_efficiency too
    sustained_efficiency: float | None = None

    def gemm_efficiency(self, itemsize: int) -> float:
        """The fraction of peak the speed model prices a GEMM of `itemsize`-byte operands at: the sustained one
        (MSMF) for 16-bit tensor-core GEMMs where published, else the best-shape one (MAMF)."""
        if itemsize <= 2 and self.sustained_efficiency is not None:
            return self.sustained_efficiency
        return self.matmul_efficiency


# Maximum Achievable Matmul FLOPS (BF16 matmul, best shape found), S. Bekman, ml-engineering,
# compute/accelerator/README.md "Maximum Achievable Matmul FLOPS comparison table": A100 SXM 267.9 of 312
# (85.9 %), A100 PCIe 82.2 %, GH200 821 of 989 (83.0 %), H100 SXM 792.1 of 989 (80.1 %), MI300X 60.1 %; the
# table's later MAMF & MSMF version (below): B200 SXM 1770.9 of 2250 (78.7 %), GB200 SXM 1822.0 of 2500 (72.9 %).
# GPUs without a published MAMF take H100 SXM's 80.1 % (marked "assumed" in matmul_source).
MAMF = {"a100-sxm": 0.859, "a100-pcie": 0.822, "gh200": 0.830, "h100-sxm": 0.801, "mi300x": 0.601, "b200": 0.787,
        "gb200": 0.729}
# Maximum Sustainable Matmul FLOPS: the best a BF16 matmul holds once the GPU is saturated at its TDP and the clock
# has settled, after a thermal soak (S. Bekman, ml-engineering, compute/accelerator/README.md, "MAMF & MSMF" table,
# branch fast-mamf, commit 082816f of 2026-08-10, torch 2.13.0+cu130): H200 SXM 708.5 of 989 (71.6 %, "~693 W @
# 1465 MHz"; MAMF 841.9, 85.1 %, "~176 W @ 1980 MHz"), B200 SXM 1456.3 of 2250 (64.7 %, "~994 W @ 1339 MHz"; MAMF
# 1770.9, 78.7 %). "MSMF ... is the number that matches sustained training throughput -- a dense training step keeps
# the SMs busy, draws full power, and lives at the settled clock, not the boost clock"; MAMF is "a short unsaturated
# burst". The same table gives GB200 SXM's MAMF, 1822.0 of 2500 (72.9 %). Only bf16 was measured, so only 16-bit
# tensor-core GEMMs take MSMF (`SpeedSpec.gemm_efficiency`); GH100 parts without a published MSMF (H100 SXM, its
# 500 W Grand Teton configuration, H100 PCIe) take the H200's (the same die and tensor cores; an assumption), and
# GB200 the B200's (the same Blackwell die; an assumption). Other GPUs have none published: they keep MAMF.
MSMF = {"h200": 0.716, "b200": 0.647}
# Streaming kernels reach ~90 % of datasheet bandwidth: 3.568 TB/s of 3.938 (90.6 %) for a 4 GiB copy
# on an H100 NVL, 91.4 % read-read-write (a published probe); BabelStream results on A100/H100 are in
# the same 85-92 % band (Deakin et al., BabelStream, github.com/UoB-HPC/BabelStream). 0.90 for all.
MEMORY_EFFICIENCY = 0.90
_ASSUMED = "H100 SXM MAMF assumed (none published)"

# SM counts: NVIDIA architecture whitepapers / datasheets (GV100 80, TU104 T4 40, GA100 A100 108,
# GA102 A10 72 / A40 84 / RTX A6000 84 / RTX 3090 82, AD104 L4 58, AD102 L40/L40S/RTX 6000 Ada 142 /
# RTX 4090 128, GH100 SXM 132 / PCIe 114, H20 78, GB202 RTX 5090 170, B200 148); MI300X 304 CUs.
SPEED: dict[str, SpeedSpec] = {
    "h100-sxm": SpeedSpec(132, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "nvlink4", "MAMF H100 SXM", MSMF["h200"]),
    "h100-pcie": SpeedSpec(114, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie5", _ASSUMED, MSMF["h200"]),
    # same die and SMs as the H100 SXM: its MAMF fraction, of the peak at 500 W
    "h100-sxm-500w": SpeedSpec(132, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "nvlink4", "MAMF H100 SXM (same die)",
                               MSMF["h200"]),
    "h200": SpeedSpec(132, MAMF["gh200"], MEMORY_EFFICIENCY, "nvlink4", "MAMF GH200 (same GH100 die)", MSMF["h200"]),
    "a100-40gb": SpeedSpec(108, MAMF["a100-sxm"], MEMORY_EFFICIENCY, "nvlink3", "MAMF A100 SXM"),
    "a100-80gb": SpeedSpec(108, MAMF["a100-sxm"], MEMORY_EFFICIENCY, "nvlink3", "MAMF A100 SXM"),
    "l4": SpeedSpec(58, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie4", _ASSUMED),
    "l40s": SpeedSpec(142, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie4", _ASSUMED),
    "a10": SpeedSpec(72, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie4", _ASSUMED),
    "t4": SpeedSpec(40, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie3", _ASSUMED),
    "v100-16gb": SpeedSpec(80, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "nvlink2", _ASSUMED),
    "v100-32gb": SpeedSpec(80, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "nvlink2", _ASSUMED),
    "rtx-3090": SpeedSpec(82, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie4", _ASSUMED),
    "rtx-4090": SpeedSpec(128, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie4", _ASSUMED),
    "rtx-5090": SpeedSpec(170, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie5", _ASSUMED),
    "rtx-a6000": SpeedSpec(84, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie4", _ASSUMED),
    "rtx-6000-ada": SpeedSpec(142, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie4", _ASSUMED),
    "a40": SpeedSpec(84, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie4", _ASSUMED),
    "l40": SpeedSpec(142, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie4", _ASSUMED),
    "h20": SpeedSpec(78, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "nvlink4", _ASSUMED),
    "b200": SpeedSpec(148, MAMF["b200"], MEMORY_EFFICIENCY, "nvlink5", "MAMF B200 SXM", MSMF["b200"]),
    "gb200": SpeedSpec(148, MAMF["gb200"], MEMORY_EFFICIENCY, "nvlink5", "MAMF GB200 SXM", MSMF["b200"]),
    "mi300x": SpeedSpec(304, MAMF["mi300x"], MEMORY_EFFICIENCY, "pcie5", "MAMF MI300X (ROCm 6.2)"),
}
DEFAULT_SPEED = SpeedSpec(108, MAMF["h100-sxm"], MEMORY_EFFICIENCY, "pcie4", _ASSUMED)


def speed_spec(gpu: GpuSpec) -> SpeedSpec:
    """The speed model's numbers for a catalog GPU (a GPU known only by its memory gets DEFAULT_SPEED)."""
    return SPEED.get(gpu.id, DEFAULT_SPEED)
