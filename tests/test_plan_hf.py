"""Inputs: hf:ORG/NAME (config.json only, offline message), a local config.json, an in-process model."""

import json
import subprocess
import sys

import pytest
import torch

import gpuwise
from gpuwise import hf
from gpuwise.errors import GpuwiseError

TINY = "tests/data/configs/tiny-llama.json"


def test_local_config_estimate_with_seq_len():
    short = gpuwise.estimate(TINY, 2, target="cpu", seq_len=16)
    long = gpuwise.estimate(TINY, 2, target="cpu", seq_len=32)
    assert short.peak_allocated_bytes < long.peak_allocated_bytes
    assert short.workload == TINY


def test_hf_id_fetches_only_config_json(monkeypatch, tmp_path):
    asked = []

    def fake_download(repo_id, filename, **kw):
        asked.append((repo_id, filename))
        path = tmp_path / "config.json"
        path.write_text(open(TINY).read())
        return str(path)

    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    est = gpuwise.estimate("hf:org/tiny", 1, target="cpu", seq_len=8)
    assert asked == [("org/tiny", "config.json")]
    assert est.peak_allocated_bytes > 0


def test_hf_id_offline_is_one_line_exit_2(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path), "PYTHONPATH": "src", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "gpuwise", "estimate", "hf:Qwen/Qwen2.5-7B", "-b", "1"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "config.json" in lines[0], proc.stderr


def test_hf_id_with_the_hub_unreachable_is_one_line_at_once(tmp_path):
    """No HF_HUB_OFFLINE, but no network to the Hub (here: a host under .invalid, which never resolves,
    RFC 2606): one line and exit 2, not huggingface_hub's five logged retries with backoff."""
    env = {"HF_ENDPOINT": "https://hub.gpuwise-test.invalid", "HF_HOME": str(tmp_path), "PYTHONPATH": "src",
           "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "gpuwise", "estimate", "hf:Qwen/Qwen2.5-7B", "-b", "1"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "offline or the Hub is unreachable" in lines[0], proc.stderr


def test_bad_config_is_one_line(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({"hidden_size": 4}))
    with pytest.raises(GpuwiseError, match="model_type"):
        gpuwise.estimate(str(bad), 1, target="cpu")


def test_a_config_saved_by_transformers_5_with_an_infinite_float_loads(tmp_path):
    """transformers >= 5 saves inf as {"__float__": "Infinity"} (Mamba-2's time_step_limit); it reads it back
    as a float, and so does gpuwise, in the config and in the blocks' comparison (which round-trips it)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba2", "num_hidden_layers": 6, "hidden_size": 64, "num_heads": 8,
                                "head_dim": 16, "expand": 2, "vocab_size": 128,
                                "time_step_limit": [0.0, {"__float__": "Infinity"}]}))
    cfg = hf.load_config(str(path))
    assert cfg.time_step_limit[1] == float("inf")
    from gpuwise.plan.tracing.repeat import blocks_alike

    assert blocks_alike(cfg, "causal-lm", 6) is None


def test_a_config_transformers_rejects_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mamba2", "time_step_limit": "soon"}))
    with pytest.raises(GpuwiseError, match="transformers rejects the config: .*time_step_limit"):
        hf.load_config(str(path))


def test_in_process_model_on_meta_and_real_agree():
    def make():
        return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))

    def loss(model, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    batch = (torch.randn(8, 64), torch.randint(0, 10, (8,)))
    real = make()
    before = [p.clone() for p in real.parameters()]
    a = gpuwise.estimate(model=real, batch=batch, loss=loss, target="cpu")
    with torch.device("meta"):
        meta = make()
    b = gpuwise.estimate(model=meta, batch=batch, loss=loss, target="cpu")
    assert a.batch_size == b.batch_size == 8
    assert a.peak_allocated_bytes == b.peak_allocated_bytes > 0
    assert all(torch.equal(x, y) for x, y in zip(before, real.parameters()))  # weights untouched


def test_big_config_is_never_built_for_real():
    wl = hf.hf_workload("examples/configs/llama-2-7b.json", seq_len=16)
    with pytest.raises(GpuwiseError, match="fake"):
        wl.build_model()


def test_layer_count_changes():
    cfg = hf.load_config("examples/configs/qwen2.5-7b.json", num_layers=2)
    assert cfg.num_hidden_layers == 2
    assert 7.0e9 < hf.approx_params(hf.load_config("examples/configs/qwen2.5-7b.json")) < 8.0e9


def test_estimate_batch_size_defaults_to_one_sequence_for_a_config_only(capsys):
    """`gpuwise estimate hf:ORG/NAME --seq-len 2048` (the issue's command) needs no -b: a model config's
    batch defaults to 1 sequence; a workload file still needs -b (one line, exit 2)."""
    from gpuwise.cli import main

    assert main(["estimate", "tests/data/configs/tiny-llama.json", "--target", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["batch_size"] == 1
    assert main(["estimate", "examples:mlp", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "-b/--batch-size is required" in err[0]
