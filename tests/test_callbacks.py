"""The in-script integrations under the real libraries (CPU): gpuwise's Lightning callback in
`lightning.Trainer.fit` and its HF `TrainerCallback` in `transformers.Trainer.train`, each training a tiny
model a few steps on a Dataset that spends ~5 ms of CPU per sample with num_workers=0."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"user_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _one_thread():
    """As the user scripts do (torch.set_num_threads(1)): two intra-op threads on a shared 2-core machine
    spin against each other and make a 40 ms step take seconds."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def starvation(summary: dict) -> dict | None:
    return next((f for f in summary["findings"] if f["kind"] == "data_starvation"), None)


@pytest.mark.slow
def test_lightning_callback_in_a_real_fit(tmp_path):
    L = pytest.importorskip("lightning")
    from gpuwise.integrations.lightning import GpuwiseMonitor

    user = load("lightning_fit")
    cb = GpuwiseMonitor(report=str(tmp_path / "pl.html"), print_summary=False)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[cb])
    trainer.fit(user.Net(width=16, workers=0, batch_size=16, steps=6))
    s = cb.result
    assert s["steps"] == 6 and s["batch_size"] == 16 and s["loader"]["num_workers"] == 0
    assert s["data_wait_fraction"] > 0.4  # 16 x 5 ms of decoding against a ~30 ms step
    f = starvation(s)
    assert f is not None and re.search(r"num_workers=[1-9]", f["fix"])
    assert (tmp_path / "pl.html").read_text().count("data_starvation") >= 1


@pytest.mark.slow
def test_hf_trainer_callback_in_a_real_train(tmp_path):
    transformers = pytest.importorskip("transformers")
    import torch

    from gpuwise.integrations.hf import GpuwiseCallback

    user = load("hf_trainer")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64, num_labels=2)
    cb = GpuwiseCallback(report=str(tmp_path / "hf.html"), print_summary=False)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=16,
                                          max_steps=6, report_to=[], save_strategy="no", logging_strategy="no",
                                          use_cpu=True, disable_tqdm=True)
    transformers.Trainer(model=transformers.BertForSequenceClassification(config), args=args,
                         train_dataset=user.Tokenized(96, 0.005), callbacks=[cb]).train()
    s = cb.result
    assert s["steps"] == 6 and s["batch_size"] == 16 and s["loader"]["num_workers"] == 0
    assert s["framework"] == "transformers" and s["data_wait_fraction"] > 0.4
    f = starvation(s)
    assert f is not None and "TrainingArguments(dataloader_num_workers=" in f["fix"]
    assert (tmp_path / "hf.html").exists()
