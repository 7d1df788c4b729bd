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
    from gpuwise.plan.tracing.alike import blocks_alike

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


# t5-small's and bart-base's published widths (google-t5/t5-small, facebook/bart-base config.json)
T5_SMALL = {"model_type": "t5", "d_model": 512, "d_kv": 64, "d_ff": 2048, "num_layers": 6, "num_decoder_layers": 6,
            "num_heads": 8, "vocab_size": 32128, "relative_attention_num_buckets": 32, "dropout_rate": 0.1,
            "feed_forward_proj": "relu", "is_encoder_decoder": True, "pad_token_id": 0, "eos_token_id": 1,
            "decoder_start_token_id": 0}
BART_BASE = {"model_type": "bart", "d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
             "encoder_attention_heads": 12, "decoder_attention_heads": 12, "encoder_ffn_dim": 3072,
             "decoder_ffn_dim": 3072, "vocab_size": 50265, "max_position_embeddings": 1024, "is_encoder_decoder": True,
             "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2, "decoder_start_token_id": 2}


@pytest.mark.parametrize("config", [T5_SMALL, BART_BASE], ids=["t5-small", "bart-base"])
def test_an_encoder_decoder_config_trains_as_a_sequence_to_sequence_lm(tmp_path, config, capsys):
    """A T5 or BART config.json (no --task) is the sequence-to-sequence LM it is fine-tuned as: its targets, as
    long as the inputs, shifted right into the decoder; the CPU trace is the real step's peak within 1 %. It was
    refused (AutoModelForCausalLM has no T5, and AutoModel's forward needs decoder inputs)."""
    from gpuwise.cli import main
    from gpuwise.plan.tracing.cpu_truth import measure_cpu_peak

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    wl = hf.hf_workload(str(path), seq_len=64)
    assert wl.task == "seq2seq-lm"
    batch = wl.build_batch(2)
    assert batch["input_ids"].shape == batch["labels"].shape == (2, 64)
    e = gpuwise.estimate(str(path), 2, target="cpu", seq_len=64)
    truth = measure_cpu_peak(wl, 2)
    assert abs(e.peak_allocated_bytes - truth) <= 0.01 * truth, (e.peak_allocated_bytes, truth)
    assert main(["estimate", str(path), "-b", "2", "--seq-len", "64", "--target", "cpu",
                             "--task", "seq2seq-lm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["peak_allocated_bytes"] == e.peak_allocated_bytes
    # summarisation's shape: short targets (--target-len), measured so too
    short = hf.hf_workload(str(path), seq_len=64, target_len=16)
    assert short.build_batch(2)["labels"].shape == (2, 16)
    s = gpuwise.estimate(str(path), 2, target="cpu", seq_len=64, target_len=16)
    truth = measure_cpu_peak(short, 2)
    assert abs(s.peak_allocated_bytes - truth) <= 0.01 * truth


def test_short_targets_hold_less_of_the_decoder_on_a_gpu(tmp_path):
    """t5-small at 256 input tokens, batch 8, bf16 on an A10G: the step peaks in backward, and 32-token targets
    hold well under half the activations 256-token ones do (the decoder's self- and cross-attention and its
    feed-forward run over the targets)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(T5_SMALL))
    same, short = (gpuwise.estimate(str(path), 8, seq_len=256, target_len=n, precision="bf16", gpu="A10G",
                                    search_max_batch=False) for n in (None, 32))
    assert same.peak_phase == short.peak_phase == "backward"
    assert short.by_category["activations"] < 0.5 * same.by_category["activations"]
    assert short.peak_allocated_bytes < 0.7 * same.peak_allocated_bytes


def test_a_sequence_to_sequence_task_for_a_decoder_only_model_is_one_line(capsys):
    from gpuwise.cli import main

    assert main(["estimate", TINY, "-b", "1", "--task", "seq2seq-lm", "--target", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "encoder-decoder" in err and len(err.splitlines()) == 1
    assert main(["estimate", TINY, "-b", "1", "--target-len", "8", "--target", "cpu"]) == 2  # a decoder has no targets
    err = capsys.readouterr().err.strip()
    assert "--target-len" in err and "causal-lm" in err and len(err.splitlines()) == 1
    assert main(["estimate", "examples:mlp", "-b", "1", "--target-len", "8", "--target", "cpu"]) == 2
    assert "config.json inputs only" in capsys.readouterr().err


def test_a_sequence_to_sequence_option_reproduces_and_trains_with_its_targets(tmp_path, capsys):
    """fit's commands for a T5 option name its head and target length: estimate_cmd and train_cmd parse, and
    `gpuwise train` runs the model (2 CPU ranks, DDP) on targets of that length."""
    import shlex

    from gpuwise.cli import build_parser, main
    from gpuwise.plan.fit_options import Variant, source_args, train_args
    from gpuwise.plan.memory.split import Split
    from gpuwise.plan.tracing.modes import TrainingModes
    from gpuwise.step import StepConfig

    path = tmp_path / "config.json"
    path.write_text(json.dumps(T5_SMALL))
    source = source_args(str(path), hf.hf_workload(str(path), seq_len=32, target_len=8))
    assert source == [str(path), "--seq-len", "32", "--task", "seq2seq-lm", "--target-len", "8"]
    args = train_args(source, Variant("x", StepConfig("adamw", "fp32"), TrainingModes(), Split("ddp", 2), ()), 2, 1)
    ns = build_parser().parse_args(args[1:])
    assert (ns.seq_len, ns.target_len, ns.batch_size) == (32, 8, 2)
    assert main([*args[1:], "--steps", "2", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"] == "ddp" and out["final_loss"] > 0
    est = build_parser().parse_args(shlex.split(f"estimate {shlex.join(source)} -b 2 --target cpu"))
    assert (est.task, est.target_len) == ("seq2seq-lm", 8)


# vit-base-patch16-224's and convnext-tiny-224's published widths (google/..., facebook/... config.json)
VIT_BASE = {"model_type": "vit", "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
            "intermediate_size": 3072, "image_size": 224, "patch_size": 16, "num_channels": 3,
            "id2label": {str(i): str(i) for i in range(1000)}}
CONVNEXT_TINY = {"model_type": "convnext", "depths": [3, 3, 9, 3], "hidden_sizes": [96, 192, 384, 768],
                 "num_channels": 3, "image_size": 224, "patch_size": 4, "drop_path_rate": 0.0,
                 "id2label": {str(i): str(i) for i in range(1000)}}


@pytest.mark.parametrize("config", [VIT_BASE, CONVNEXT_TINY], ids=["vit-base", "convnext-tiny"])
def test_an_image_model_config_trains_as_an_image_classifier(tmp_path, config, capsys):
    """A ViT or ConvNeXt config.json (no --task) is the image classifier it is fine-tuned as: a batch of images of
    its config's size and a label each; the CPU trace is the real step's peak within 1 %. It was refused (no
    causal-LM head). --seq-len means nothing there: one line, exit 2; fit's commands leave it out."""
    from gpuwise.cli import main
    from gpuwise.plan.fit_options import source_args
    from gpuwise.plan.tracing.cpu_truth import measure_cpu_peak

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    wl = hf.hf_workload(str(path))
    assert wl.task == "image-cls" and wl.seq_len is None
    batch = wl.build_batch(2)
    assert batch["pixel_values"].shape == (2, 3, 224, 224) and int(batch["labels"].max()) < 1000
    e = gpuwise.estimate(str(path), 2, target="cpu")
    truth = measure_cpu_peak(wl, 2)
    assert abs(e.peak_allocated_bytes - truth) <= 0.01 * truth, (e.peak_allocated_bytes, truth)
    assert source_args(str(path), wl) == [str(path), "--task", "image-cls"]
    assert main(["estimate", str(path), "-b", "2", "--seq-len", "64", "--target", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert "image classifier" in err and "224x224" in err and len(err.splitlines()) == 1


def test_inference_on_an_encoder_decoder_says_its_generation_is_not_modelled(tmp_path):
    """--inference runs a causal LM's prefill and decode steps; an encoder-decoder gets one no-grad forward, and
    its new tokens are said not to be modelled (they read '+16 tokens' with a 0 B KV cache and no word)."""
    from gpuwise.plan.inference import estimate_inference

    path = tmp_path / "config.json"
    path.write_text(json.dumps(T5_SMALL))
    est = estimate_inference(str(path), 2, 32, 16, "bf16", "cuda", "A10G")
    assert any(n.startswith("cannot tell generation: T5ForConditionalGeneration is not a causal LM") for n in est.notes)
    causal = estimate_inference(TINY, 1, 16, 4, "bf16", "cuda", "A10G")
    assert causal.kv_cache_bytes > 0 and not any(n.startswith("cannot tell generation") for n in causal.notes)


def test_a_speech_encoder_decoder_config_keeps_its_causal_lm_head():
    """Whisper is an encoder-decoder whose model_type has no sequence-to-sequence LM head (its encoder reads audio
    features): made a seq2seq-lm by default, every Whisper config failed ("Unrecognized configuration class ... for
    this kind of AutoModel"); it is the causal LM (its decoder) it was before, and a text one stays a seq2seq-lm."""
    from transformers import AutoConfig

    assert hf.default_task(AutoConfig.for_model("whisper")) == "causal-lm"
    assert hf.default_task(AutoConfig.for_model("t5")) == hf.default_task(AutoConfig.for_model("bart")) == "seq2seq-lm"


def test_a_config_saved_with_null_architectures_builds(tmp_path):
    """A config saved from a fresh transformers config writes "architectures": null; an Auto class whose model_type
    has several heads (DeiT's image classifier: with and without a teacher) iterated it and raised TypeError."""
    from transformers import AutoConfig

    path = tmp_path / "config.json"
    path.write_text(json.dumps(AutoConfig.for_model("deit").to_dict()))
    assert json.loads(path.read_text())["architectures"] is None
    wl = hf.hf_workload(str(path))
    assert wl.task == "image-cls" and type(wl.build_model()).__name__ == "DeiTForImageClassification"
