"""Inputs people have: a Hugging Face model id, a local config.json, or a model object in the process.

    hf:ORG/NAME        only `config.json` is fetched (huggingface_hub.hf_hub_download); offline: one line
    path/config.json   a local config (or a folder holding one)
    a model object     `gpuwise.estimate(model=..., batch=..., loss=...)`

The model is built from its config with random weights by `transformers`' Auto classes. gpuwise builds
it inside FakeTensorMode (plan/tracing/trace.py), so a 7B or 70B model allocates nothing; outside a trace the
build is refused above `REAL_BUILD_MAX_PARAMS` so that nothing allocates real multi-GB weights by mistake.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .contract import Workload, check_batch
from .errors import GpuwiseError, first_line

HF_PREFIX = "hf:"
DEFAULT_SEQ_LEN = 512
# task -> transformers Auto class. A causal LM's labels are its input ids (the loss shifts them); a sequence-to-
# sequence LM's (T5, BART, Marian, Pegasus ...) are a target sequence, which the model shifts right into its
# decoder's inputs. A config's default task: `default_task`.
TASKS = {
    "causal-lm": "AutoModelForCausalLM",
    "seq2seq-lm": "AutoModelForSeq2SeqLM",
    "seq-cls": "AutoModelForSequenceClassification",
    "masked-lm": "AutoModelForMaskedLM",
    "image-cls": "AutoModelForImageClassification",
    "base": "AutoModel",
}
# An image classifier (ViT, ConvNeXt, Swin, ResNet ...) takes a batch of images of its config's `image_size` (224
# where the config has none, as ResNet's) and `num_channels`, and a class label each: no tokens, no --seq-len.
DEFAULT_IMAGE_SIZE = 224
NUM_LABELS = 2
REAL_BUILD_MAX_PARAMS = 2_000_000_000  # outside fake tensors, refuse to build more than this for real


def is_config_source(spec: Any) -> bool:
    """Whether a workload spec names a model config (hf:ID, a .json file, a folder with config.json)."""
    if not isinstance(spec, str):
        return False
    if spec.startswith(HF_PREFIX) or spec.endswith(".json"):
        return True
    p = Path(spec)
    return p.is_dir() and (p / "config.json").is_file()


def fetch_config(repo_id: str) -> dict[str, Any]:
    """config.json of a Hub model, and nothing else of it (no weights). Offline / unknown: one line."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:  # pragma: no cover - huggingface_hub comes with transformers
        raise GpuwiseError("hf: inputs need huggingface_hub (pip install huggingface_hub)") from exc
    try:
        try:  # a cached copy answers offline, with no network call
            path = hf_hub_download(repo_id, "config.json", local_files_only=True)
        except Exception:  # noqa: BLE001 - not cached: ask the Hub, if it can be reached at all
            _check_hub_reachable()
            with _quiet_hub_logs():
                path = hf_hub_download(repo_id, "config.json")
    except Exception as exc:  # noqa: BLE001 - offline, gated, not found: all one line
        kind = type(exc).__name__
        hint = ("offline or the Hub is unreachable: download config.json and pass its path"
                if "Offline" in kind or "Connect" in kind or "LocalEntryNotFound" in kind or "Timeout" in kind
                or "Unreachable" in kind
                else "check the id (and access, for gated models), or pass a local config.json")
        raise GpuwiseError(f"hf:{repo_id}: cannot fetch config.json ({kind}): {hint}") from exc
    return _read_json(Path(path), f"hf:{repo_id}")


class HubUnreachable(ConnectionError):
    """The Hub's host does not resolve: offline (the name says so, for the one-line message)."""


def _check_hub_reachable() -> None:
    """Fail at once when the Hub's host name does not resolve: huggingface_hub would otherwise retry
    five times with backoff (~20 s) and log a warning line per retry before giving up."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return  # huggingface_hub itself refuses at once, with its offline error
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.getaddrinfo(host, 443)
    except OSError as exc:
        raise HubUnreachable(f"cannot resolve {host}: {exc}") from exc


@contextlib.contextmanager
def _quiet_hub_logs():
    """huggingface_hub logs each HTTP retry as a warning; gpuwise reports the outcome in one line."""
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _read_json(path: Path, label: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise GpuwiseError(f"{label}: cannot read {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise GpuwiseError(f"{label}: not valid JSON (line {exc.lineno}): {exc.msg}") from exc
    if not isinstance(data, dict) or "model_type" not in data:
        raise GpuwiseError(f"{label}: not a transformers config.json (no model_type)")
    return data


def read_config_dict(source: str) -> dict[str, Any]:
    """The config dict of `hf:ORG/NAME`, a config.json path, or a folder holding config.json."""
    if source.startswith(HF_PREFIX):
        repo_id = source[len(HF_PREFIX):].strip()
        if repo_id.count("/") > 1 or not repo_id:
            raise GpuwiseError(f"{source!r}: expected hf:ORG/NAME")
        return fetch_config(repo_id)
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise GpuwiseError(f"no config file {str(path)!r}")
    return _read_json(path, str(source))


def decoded_floats(data: dict[str, Any]) -> dict[str, Any]:
    """A config dict as transformers reads it from JSON: transformers >= 5 writes the floats JSON has no
    literal for (inf, nan) as {"__float__": "Infinity"} (`to_json_string`, `save_pretrained`) and decodes them
    when it reads a config.json (configuration_utils.py `_dict_from_json_file`); older versions have neither."""
    from transformers import PretrainedConfig

    decode = getattr(PretrainedConfig, "_decode_special_floats", None)
    return data if decode is None else decode(data)


def _known_model_types() -> set[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return set(CONFIG_MAPPING_NAMES)


def load_config(source: str, num_layers: int | None = None):
    """A transformers config object, optionally with its number of layers changed."""
    from transformers import AutoConfig

    data = decoded_floats(dict(read_config_dict(source)))
    data.pop("quantization_config", None)  # weights are random: a checkpoint's quantization does not apply
    for key in ("torch_dtype", "dtype", "_source"):  # the storage dtype is --precision's (fp32 master weights)
        data.pop(key, None)
    if data.get("architectures") is None:  # transformers' Auto classes iterate it (a config saved fresh writes null)
        data["architectures"] = []
    model_type = data.pop("model_type")
    try:
        cfg = AutoConfig.for_model(model_type, **data)
    except Exception as exc:  # noqa: BLE001 - an unknown model_type, or a field transformers rejects (>= 5: strictly)
        if not isinstance(exc, (ValueError, KeyError, TypeError)) \
                and type(exc).__name__ != "StrictDataclassFieldValidationError":
            raise
        if model_type not in _known_model_types():
            raise GpuwiseError(f"{source}: transformers does not know model_type {model_type!r}") from exc
        raise GpuwiseError(f"{source}: transformers rejects the config: {type(exc).__name__}: "
                           f"{first_line(exc)[:200]}") from exc
    if num_layers is not None:
        set_num_layers(cfg, num_layers)
    return cfg


LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
DECODER_LAYER_KEYS = ("num_decoder_layers", "decoder_layers")  # an encoder-decoder's second stack (T5; BART, Marian)


def _own_depth(cfg) -> int | None:
    for key in LAYER_KEYS:
        value = getattr(cfg, key, None)
        if isinstance(value, int):
            return value
    return None


def stack_config(cfg):
    """The config that says how many blocks the model has: `cfg`, or where `cfg` says none itself, a composite
    (vision-language) config's text model's (`get_text_config`: Gemma 3's, PaliGemma's, LLaVA's), whose
    decoder blocks are the deep stack; the vision tower keeps its depth (its blocks do not run in a text step)."""
    if _own_depth(cfg) is not None:
        return cfg
    try:
        text = cfg.get_text_config()
    except Exception:  # noqa: BLE001 - a config without sub-configs, or one that cannot say
        return cfg
    return text if text is not None and text is not cfg and _own_depth(text) is not None else cfg


def num_layers_of(cfg) -> int | None:
    """The model's blocks: its config's layer count, or its text model's (`stack_config`)."""
    return _own_depth(stack_config(cfg))


def set_num_layers(cfg, n: int) -> None:
    """`cfg` with `n` blocks (a composite config: its text model with `n`, `stack_config`). An encoder-decoder
    whose decoder is as deep as its encoder (T5's num_decoder_layers, BART's decoder_layers) gets `n` decoder
    blocks too: its block i is both stacks' i-th (the rebuild's unit, plan/tracing/repeat.py); a decoder of
    another depth keeps it."""
    cfg = stack_config(cfg)
    depth = _own_depth(cfg)
    decoder = [key for key in DECODER_LAYER_KEYS if isinstance(getattr(cfg, key, None), int)
               and getattr(cfg, key) == depth]
    for key in LAYER_KEYS + tuple(decoder):
        if isinstance(getattr(cfg, key, None), int):
            setattr(cfg, key, n)
    for key in ("layer_types",):  # per-layer lists (Qwen2 sliding window, Gemma) follow the count
        if isinstance(getattr(type(cfg), key, None), property):
            continue  # derived from the count by the config itself (Mamba-2's, read-only)
        value = getattr(cfg, key, None)
        if isinstance(value, list) and value:
            setattr(cfg, key, (value * (n // len(value) + 1))[:n])


def vocab_size_of(cfg) -> int:
    return int(getattr(cfg, "vocab_size", 0) or 32000)


def default_task(cfg) -> str:
    """The head a config is trained with when no --task is given: an encoder-decoder's sequence-to-sequence LM (a
    text one: its model_type has that head; Whisper's speech model has not), an image model's classifier (its
    model_type has an image-classification head and no causal-LM one), else a causal LM."""
    try:
        from transformers.models.auto import modeling_auto as auto
    except ImportError:  # pragma: no cover - transformers builds every config model
        return "causal-lm"
    seq2seq = getattr(auto, "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", {})
    if getattr(cfg, "is_encoder_decoder", False) and cfg.model_type in seq2seq:
        return "seq2seq-lm"
    image = getattr(auto, "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", {})
    causal = getattr(auto, "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", {})
    return "image-cls" if cfg.model_type in image and cfg.model_type not in causal else "causal-lm"


def image_shape(cfg) -> tuple[int, int, int]:
    """(channels, height, width) of an image model's input, from its config."""
    size = getattr(cfg, "image_size", None) or DEFAULT_IMAGE_SIZE
    h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[-1]))
    return int(getattr(cfg, "num_channels", None) or 3), h, w


def hf_workload(source: str, seq_len: int | None = None, task: str | None = None,
                num_layers: int | None = None, target_len: int | None = None) -> Workload:
    """A workload from a model config: random weights, token batches of `seq_len` (default DEFAULT_SEQ_LEN; a
    sequence-to-sequence LM's targets of `target_len`, by default as long as its inputs; an image classifier's
    images of its config's size instead), the model's own loss. `task` None: the config's `default_task`."""
    if task is not None and task not in TASKS:
        raise GpuwiseError(f"unknown task {task!r}; choose from: {', '.join(TASKS)}")
    for flag, n in (("--seq-len", seq_len), ("--target-len", target_len)):
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise GpuwiseError(f"{flag} must be a positive integer, got {n!r}")
    cfg = load_config(source, num_layers)
    task = task or default_task(cfg)
    if task == "image-cls":
        if seq_len is not None:
            raise GpuwiseError(f"--seq-len is a token model's; {source} is an image classifier, whose inputs are its "
                               f"config's image_size ({'x'.join(map(str, image_shape(cfg)[1:]))})")
    elif seq_len is None:
        seq_len = DEFAULT_SEQ_LEN
    if target_len is not None and task != "seq2seq-lm":
        raise GpuwiseError(f"--target-len is a sequence-to-sequence LM's (an encoder-decoder such as T5 or BART); "
                           f"{source} is trained as {task}")
    if task == "seq-cls":
        cfg.num_labels = NUM_LABELS
        if getattr(cfg, "pad_token_id", None) is None:
            cfg.pad_token_id = 0  # sequence classification needs one to find the last token
    if task == "seq2seq-lm":
        if not getattr(cfg, "is_encoder_decoder", False):
            raise GpuwiseError(f"{source}: --task seq2seq-lm needs an encoder-decoder model (T5, BART ...); "
                               f"{cfg.model_type} is not one (is_encoder_decoder is false)")
        for key in ("pad_token_id", "decoder_start_token_id"):  # the labels' right shift into decoder inputs needs them
            if getattr(cfg, key, None) is None:
                setattr(cfg, key, 0)
    vocab = vocab_size_of(cfg)
    targets = (target_len or seq_len) if task == "seq2seq-lm" else None
    max_pos = getattr(cfg, "max_position_embeddings", None)
    if isinstance(max_pos, int) and seq_len is not None and seq_len > max_pos and task != "causal-lm":
        raise GpuwiseError(f"{source}: --seq-len {seq_len} exceeds max_position_embeddings {max_pos}")

    def model():
        import transformers

        auto = getattr(transformers, TASKS[task])
        if not _under_fake_tensors():
            _refuse_big_real_build(cfg, source)
        return auto.from_config(cfg)

    def batch(batch_size: int):
        import torch

        if task == "image-cls":
            gen = torch.Generator().manual_seed(batch_size)
            return {"pixel_values": torch.randn(batch_size, *image_shape(cfg), generator=gen),
                    "labels": torch.randint(0, max(int(getattr(cfg, "num_labels", 2) or 2), 1), (batch_size,),
                                            generator=gen)}
        ids = torch.randint(0, vocab, (batch_size, seq_len), generator=torch.Generator().manual_seed(batch_size))
        if task == "causal-lm" or task == "masked-lm":
            return {"input_ids": ids, "labels": ids}
        if task == "seq2seq-lm":  # the targets: decoder inputs (shifted right by the model) and labels
            return {"input_ids": ids, "labels": torch.randint(0, vocab, (batch_size, targets),
                                                              generator=torch.Generator().manual_seed(batch_size + 1))}
        if task == "seq-cls":
            return {"input_ids": ids, "labels": torch.zeros(batch_size, dtype=torch.long)}
        return {"input_ids": ids}

    loss = _mean_hidden_loss if task == "base" else None
    label = source if num_layers is None else f"{source} ({num_layers} layers)"
    wl = Workload(spec=label, model_fn=model, batch_fn=batch, loss_fn=loss, source=source)
    wl.hf_config = cfg  # type: ignore[attr-defined]  - read by layer extrapolation and inference
    wl.seq_len = seq_len  # type: ignore[attr-defined]  - None for an image classifier
    wl.task = task  # type: ignore[attr-defined]
    wl.target_len = targets  # type: ignore[attr-defined]  - a sequence-to-sequence LM's target tokens, else None
    return wl


def with_layers(wl: Workload, layers: int) -> Workload:
    """A model config's workload (`hf_workload`'s) rebuilt with `layers` blocks, every other input as it was."""
    return hf_workload(wl.source, wl.seq_len, wl.task, num_layers=layers,  # type: ignore[attr-defined]
                       target_len=getattr(wl, "target_len", None))  # a wrapper may not carry it


def _mean_hidden_loss(model, batch):
    out = model(**batch)
    return out.last_hidden_state.float().mean()


def _under_fake_tensors() -> bool:
    """Under fake tensors, or on the meta device (FSDP's units are sized from a meta build): no memory."""
    import torch
    from torch._guards import detect_fake_mode

    return detect_fake_mode() is not None or torch.get_default_device().type == "meta"


def _refuse_big_real_build(cfg, source: str) -> None:
    n = approx_params(cfg)
    if n > REAL_BUILD_MAX_PARAMS:
        raise GpuwiseError(f"{source}: about {n / 1e9:.1f}B parameters: gpuwise builds it only under fake "
                           "tensors (estimate / fit), never with real weights")


def approx_params(cfg) -> int:
    """Parameters of a decoder config, from its widths (embeddings + layers), for guards and labels (a composite
    config: its text model's, `stack_config`)."""
    cfg = stack_config(cfg)
    h = int(getattr(cfg, "hidden_size", 0) or getattr(cfg, "n_embd", 0) or 0)
    inter = int(getattr(cfg, "intermediate_size", 0) or 4 * h)
    layers = _own_depth(cfg) or 0
    vocab = vocab_size_of(cfg)
    heads = int(getattr(cfg, "num_attention_heads", 0) or 1)
    head_dim = int(getattr(cfg, "head_dim", 0) or h // heads)
    kv = int(getattr(cfg, "num_key_value_heads", 0) or heads) * head_dim
    embeddings = vocab * h * (1 if getattr(cfg, "tie_word_embeddings", False) else 2)
    return embeddings + layers * (2 * h * heads * head_dim + 2 * h * kv + 3 * h * inter)


# -- a model object in the process ------------------------------------------------------------------

def model_workload(model, batch: Any, loss: Callable | None = None, name: str = "model") -> tuple[Workload, int | None]:
    """A workload around a model object: `batch` is a function batch(batch_size) or one example batch
    (tensor / tuple / dict; its first dimension is the batch size). The model may live on the meta
    device. Under a trace the model is copied into fake tensors: the caller's weights are never touched."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise GpuwiseError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if callable(batch):
        batch_fn, size = batch, None
    else:
        check_batch(batch, "batch")
        size = _leading_dim(batch)
        example = batch

        def batch_fn(batch_size: int):
            if batch_size == size:
                return example
            return _resize(example, batch_size)

    def model_fn():
        return fake_copy(model)

    return Workload(spec=name, model_fn=model_fn, batch_fn=batch_fn, loss_fn=loss), size


def fake_copy(model):
    """`model` in the active fake mode's tensors (a meta model gets empty fake CPU storage); outside a
    trace, the model itself."""
    import copy

    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeCopyMode

    fake_mode = detect_fake_mode()
    if fake_mode is None:
        return model
    on_meta = any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])
    if on_meta:
        return _meta_to_fake(copy.deepcopy(model))
    with FakeCopyMode(fake_mode):
        return copy.deepcopy(model)


def _meta_to_fake(model):
    """Give a meta model empty (fake) CPU storage by hand: `to_empty` swaps parameters, which fake tensors
    refuse; tied parameters stay tied."""
    import torch

    memo: dict[int, torch.Tensor] = {}
    for m in model.modules():
        for slots, is_param in ((m._parameters, True), (m._buffers, False)):
            for k, t in slots.items():
                if t is None or t.device.type != "meta":
                    continue
                if id(t) not in memo:
                    new = torch.empty_like(t, device="cpu")
                    memo[id(t)] = torch.nn.Parameter(new, requires_grad=t.requires_grad) if is_param else new
                slots[k] = memo[id(t)]
    return model


def _leading_dim(batch) -> int | None:
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    values = batch.values() if isinstance(batch, dict) else batch
    for v in values:
        if isinstance(v, torch.Tensor) and v.dim():
            return int(v.shape[0])
    return None


def _resize(batch, n: int):
    import torch

    if isinstance(batch, torch.Tensor):
        reps = [-(-n // batch.shape[0])] + [1] * (batch.dim() - 1)
        return batch.repeat(*reps)[:n]
    if isinstance(batch, dict):
        return {k: _resize(v, n) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_resize(v, n) for v in batch)
    return batch


def module_matches(name: str, patterns: list[str]) -> bool:
    """Whether a module's full name is one of transformers' module patterns (quantizers_utils.should_convert_module:
    from the start up to a module boundary, as a regex with that boundary, or as a suffix)."""
    boundary = r"(?:(?<=\.)|(?=\.|$))"
    return any(re.match(rf"(?:{key}){boundary}", name) or name.endswith(key) for key in patterns)
