"""A base install (no peft, no bitsandbytes): `estimate` and `fit` still answer. 8-bit AdamW's state and
LoRA's adapters are sized from their layouts (gpuwise/optional_libs.py), byte for byte what the real
libraries give; QLoRA is listed with what to install."""

import json
import os
import subprocess
import sys

import pytest

from gpuwise import optional_libs
from gpuwise.plan.estimate import estimate

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)
HIDE = os.path.join(HERE, "scripts", "hide_packages")
LLAMA = os.path.join(HERE, "workloads", "hf_llama.py")


def _hidden(monkeypatch, *names):
    real = optional_libs.available
    monkeypatch.setattr(optional_libs, "available", lambda n: n not in names and real(n))


@pytest.mark.parametrize("kw", [
    dict(optimizer="adamw8bit", target="cuda"),
    dict(lora=16, precision="bf16", checkpointing=True, target="cuda"),
    dict(lora=8, precision="fp32", target="cpu"),
])
def test_stand_ins_size_what_the_real_libraries_do(monkeypatch, kw):
    pytest.importorskip("peft")
    pytest.importorskip("bitsandbytes")
    real = estimate(LLAMA, 2, **kw)
    _hidden(monkeypatch, "peft", "bitsandbytes")
    stand_in = estimate(LLAMA, 2, **kw)
    assert any("pip install" in n for n in stand_in.notes) and not any("pip install" in n for n in real.notes)
    assert stand_in.by_category["optimizer_state"] == real.by_category["optimizer_state"]
    assert stand_in.by_category["parameters"] == real.by_category["parameters"]
    assert stand_in.by_category["gradients"] == real.by_category["gradients"]
    # bitsandbytes moves its two 256-entry fp32 quantization maps to the device (2 * 256 * 4 B = 2 KiB);
    # the stand-in holds them too, but where the trace files them may differ: at most those bytes apart
    assert abs(stand_in.peak_allocated_bytes - real.peak_allocated_bytes) <= 2 * 256 * 4


def test_a_real_step_still_asks_for_bitsandbytes(monkeypatch):
    import torch

    from gpuwise.errors import GpuwiseError
    from gpuwise.step import make_optimizer

    _hidden(monkeypatch, "bitsandbytes")
    with pytest.raises(GpuwiseError, match="pip install bitsandbytes"):
        make_optimizer("adamw8bit", [torch.nn.Parameter(torch.zeros(4))])


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HIDE, os.path.join(ROOT, "src")]),
           "GPUWISE_TEST_HIDE": "peft,bitsandbytes"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)


def test_the_packages_are_really_hidden_in_the_child():
    out = _cli("-c", "import importlib.util as u; print(u.find_spec('peft'), u.find_spec('bitsandbytes'))")
    assert out.stdout.split() == ["None", "None"], out.stderr
    assert "ModuleNotFoundError" in _cli("-c", "import peft").stderr


def test_fit_without_peft_and_bitsandbytes_ranks_options_and_some_fit():
    out = _cli("-m", "gpuwise", "fit", "examples/configs/llama-2-7b.json", "--gpu", "rtx4090", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    options = {o["name"].split(" + accumulation")[0]: o for o in d["options"]}
    assert any(o["fits"] for o in d["options"])
    assert options["LoRA r16 (bf16) + checkpointing"]["fits"]  # 7B in bf16 (13.5 GB) + fp32 adapters
    assert options["LoRA r16 (bf16) + checkpointing"]["needs"] == "pip install peft"
    assert options["bf16 + checkpointing + 8-bit AdamW"]["needs"] == "pip install bitsandbytes"
    assert options["bf16 + checkpointing + 8-bit AdamW"]["sized"] is True
    qlora = options["QLoRA r16 (bf16) + checkpointing"]
    assert qlora["sized"] is False and qlora["fits"] is False and "peft" in qlora["needs"]
    assert "needs" not in options["as given"]  # what needs nothing says nothing
    fits = [o["fits"] for o in d["options"]]
    assert fits == sorted(fits, reverse=True)


def test_estimate_without_bitsandbytes_answers_with_a_note():
    out = _cli("-m", "gpuwise", "estimate", "examples:mlp", "-b", "8", "--optimizer", "adamw8bit", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    # nn.Linear(32, 16): weight 512 and bias 16 elements, under bitsandbytes' 4096-element 8-bit threshold:
    # fp32 state1 + state2 each, in the CUDA allocator's 512-byte blocks: 2 * (2048 + 512) = 5120 B
    assert d["target"] == "cuda" and d["by_category"]["optimizer_state"] == 2 * (2048 + 512)
    assert any("pip install bitsandbytes" in n for n in d["notes"])
