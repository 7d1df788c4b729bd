"""The cases of benchmarks/plan_zoo.py: every `transformers` architecture the registry lists, built offline
from its default config, plus plain-PyTorch families no registry covers.

A case is a name and a `Workload` (gpuwise.workload) built on demand; nothing here downloads anything.

transformers: for each `model_type` the first task mapping that lists it, in this order, gives the
model class and the batch: causal LM, seq2seq LM, masked LM, image classification, CTC, audio
classification. The config is the family's default (`AutoConfig.for_model`, i.e. its base widths),
with depth cut to `LAYERS` blocks per stack and the vocabulary capped at `VOCAB_CAP`; when the model
is still over `PARAM_BUDGET` parameters (a 7B family's widths on two shared cores), hidden and
intermediate widths are halved (head size kept) until it is not, and the case's name says so.
"""

from __future__ import annotations

import torch

from gpuwise.workload import Workload

LAYERS = 2
VOCAB_CAP = 32_000
PARAM_BUDGET = 60_000_000
SEQ = 32
TASKS = (  # (mapping, task): the first that lists a model_type is used
    ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "causal_lm"),
    ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "seq2seq"),
    ("MODEL_FOR_MASKED_LM_MAPPING_NAMES", "masked_lm"),
    ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "image_cls"),
    ("MODEL_FOR_CTC_MAPPING_NAMES", "ctc"),
    ("MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES", "audio_cls"),
)
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "encoder_layers", "decoder_layers",
              "num_decoder_layers", "num_encoder_layers", "depth", "num_blocks")
LIST_DEPTH_KEYS = ("depths", "num_layers_list", "block_repeats")  # per-stage depths (Swin, ConvNeXt, ResNet...)
WIDTH_KEYS = ("hidden_size", "n_embd", "d_model", "intermediate_size", "n_inner", "d_ff", "ffn_dim",
              "encoder_ffn_dim", "decoder_ffn_dim", "moe_intermediate_size", "shared_expert_intermediate_size",
              "embed_dim", "dim", "hidden_dim", "ffn_hidden_size")
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads", "decoder_attention_heads",
             "num_key_value_heads")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
MAX_EXPERTS = 8


def hf_registry() -> list[tuple[str, str, str]]:
    """(model_type, task, class name) for every model_type some task mapping lists."""
    from transformers.models.auto import modeling_auto as ma

    seen: dict[str, tuple[str, str, str]] = {}
    for mapping, task in TASKS:
        for model_type, cls in getattr(ma, mapping).items():
            if model_type not in seen and isinstance(cls, str):
                seen[model_type] = (model_type, task, cls)
    return sorted(seen.values())


def _sub_configs(cfg):
    yield cfg
    for key in ("text_config", "vision_config", "audio_config", "encoder", "decoder", "encoder_config",
                "decoder_config"):
        sub = getattr(cfg, key, None)
        if sub is not None and hasattr(sub, "to_dict") and sub is not cfg:
            yield from _sub_configs(sub)


def _cut(cfg) -> None:
    for c in _sub_configs(cfg):
        for key in DEPTH_KEYS:
            v = getattr(c, key, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > LAYERS:
                setattr(c, key, LAYERS)
        for key in LIST_DEPTH_KEYS:
            v = getattr(c, key, None)
            if isinstance(v, (list, tuple)) and v and all(isinstance(x, int) for x in v):
                setattr(c, key, [min(x, LAYERS) for x in v])
        for key in EXPERT_KEYS:
            v = getattr(c, key, None)
            if isinstance(v, int) and v > MAX_EXPERTS:
                setattr(c, key, MAX_EXPERTS)
        if isinstance(getattr(c, "num_experts_per_tok", None), int):
            c.num_experts_per_tok = min(c.num_experts_per_tok, 2)
        for key in ("layer_types", "layers_block_type", "block_types", "hybrid_override_pattern"):
            v = getattr(c, key, None)
            if isinstance(v, (list, tuple)) and len(v) > LAYERS:
                try:
                    setattr(c, key, list(v)[:LAYERS])
                except Exception:  # noqa: BLE001
                    pass
        v = getattr(c, "vocab_size", None)
        if isinstance(v, int) and v > VOCAB_CAP:
            c.vocab_size = VOCAB_CAP
        for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            v = getattr(c, key, None)
            if isinstance(v, int) and isinstance(getattr(c, "vocab_size", None), int) and v >= c.vocab_size:
                setattr(c, key, 1)
        if getattr(c, "pad_token_id", 0) is None and hasattr(c, "vocab_size"):
            c.pad_token_id = 1


def _halve(cfg) -> bool:
    changed = False
    for c in _sub_configs(cfg):
        heads = {k: getattr(c, k) for k in HEAD_KEYS if isinstance(getattr(c, k, None), int)}
        for key in WIDTH_KEYS:
            v = getattr(c, key, None)
            if isinstance(v, int) and not isinstance(v, bool) and v >= 128:
                setattr(c, key, v // 2)
                changed = True
        for key, v in heads.items():  # same head size: half the heads
            if v >= 2:
                setattr(c, key, v // 2)
    return changed


def _param_count_meta(cls, cfg) -> int:
    with torch.device("meta"):
        m = cls(cfg)
    return sum(p.numel() for p in m.parameters())


def hf_config(model_type: str, cls_name: str):
    """The default config, cut (depth, vocab, experts) and halved to the parameter budget; (config, halvings)."""
    import transformers
    from transformers import AutoConfig

    cls = getattr(transformers, cls_name)
    cfg = AutoConfig.for_model(model_type)
    _cut(cfg)
    halvings = 0
    while _param_count_meta(cls, cfg) > PARAM_BUDGET and halvings < 4:
        if not _halve(cfg):
            break
        halvings += 1
    return cls, cfg, halvings


def _ids(batch_size: int, seq: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(batch_size + seed)
    hi = max(min(vocab, 1000), 6)
    return torch.randint(5, hi, (batch_size, seq), generator=g)


def hf_batch(task: str, cfg, batch_size: int):
    """A batch with labels, so that `model(**batch).loss` is the task's loss."""
    text = getattr(cfg, "text_config", None) or cfg
    vocab = getattr(text, "vocab_size", None) or 1000
    if task in ("causal_lm", "masked_lm"):
        ids = _ids(batch_size, SEQ, vocab)
        return {"input_ids": ids, "labels": ids.clone()}
    if task == "seq2seq":
        return {"input_ids": _ids(batch_size, SEQ, vocab), "labels": _ids(batch_size, SEQ // 2, vocab, 1)}
    g = torch.Generator().manual_seed(batch_size)
    if task == "image_cls":
        c = getattr(cfg, "vision_config", None) or cfg
        size = getattr(c, "image_size", 224)
        size = size[0] if isinstance(size, (list, tuple)) else (size if isinstance(size, int) else 224)
        channels = getattr(c, "num_channels", 3) or 3
        labels = torch.randint(0, max(getattr(cfg, "num_labels", 2), 1), (batch_size,), generator=g)
        return {"pixel_values": torch.rand(batch_size, channels, size, size, generator=g), "labels": labels}
    if task == "ctc":
        return {"input_values": torch.rand(batch_size, 16000, generator=g) - 0.5,
                "labels": torch.randint(1, max(vocab, 3), (batch_size, 12), generator=g)}
    if task == "audio_cls":
        labels = torch.randint(0, max(getattr(cfg, "num_labels", 2), 1), (batch_size,), generator=g)
        return {"input_values": torch.rand(batch_size, 16000, generator=g) - 0.5, "labels": labels}
    raise ValueError(task)


BATCH = {"causal_lm": 2, "masked_lm": 2, "seq2seq": 2, "image_cls": 2, "ctc": 1, "audio_cls": 1}


def _no_layer_drop(cfg):
    """A copy of `cfg` with every LayerDrop probability at 0: the truth's step runs every block."""
    import copy

    cfg = copy.deepcopy(cfg)
    for c in _sub_configs(cfg):
        for key, v in list(vars(c).items()):
            if "layerdrop" in key and isinstance(v, float) and v > 0:
                setattr(c, key, 0.0)
    return cfg


def hf_workload(model_type: str, task: str, cls_name: str) -> tuple[Workload, Workload, int, str]:
    """(workload, truth workload, batch size, note). The truth's model has LayerDrop off: a real step
    with layer drop skips blocks at random (one profiled step is one draw, off by a block's memory
    either way), and the step a training run's peak comes from is the one that runs every block. The
    planner is given the model as configured (it turns layer drop off itself: plan/tracing/stochastic.py)."""
    cls, cfg, halvings = hf_config(model_type, cls_name)
    if task == "audio_cls" or task == "ctc":
        for key in ("mask_time_prob", "mask_feature_prob"):
            if hasattr(cfg, key):
                setattr(cfg, key, 0.0)  # SpecAugment masks are random: truth and trace would differ
    if task == "ctc":
        cfg.ctc_loss_reduction = "mean"
    width = getattr(cfg, "hidden_size", None) or getattr(cfg, "d_model", None) or getattr(cfg, "n_embd", None)
    note = f"{LAYERS} blocks, width {width}" + (f" (halved x{halvings})" if halvings else "")

    truth_cfg = _no_layer_drop(cfg)

    def model(c=cfg):
        torch.manual_seed(0)
        return cls(c)

    def batch(b):
        return hf_batch(task, cfg, b)

    return (Workload(f"hf:{model_type}", model, batch), Workload(f"hf:{model_type}", lambda: model(truth_cfg), batch),
            BATCH[task], note)


# -- plain PyTorch families -------------------------------------------------------------------------------

nn = torch.nn


def _ce(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


class ConvNet(nn.Module):
    """A small conv stack of one kind, pooled to a classifier."""

    def __init__(self, kind: str, width: int = 64):
        super().__init__()
        w = width
        if kind == "depthwise":  # MobileNet-style separable blocks
            layers = [nn.Conv2d(3, w, 3, 2, 1), nn.ReLU()]
            for _ in range(2):
                layers += [nn.Conv2d(w, w, 3, 1, 1, groups=w), nn.BatchNorm2d(w), nn.ReLU(), nn.Conv2d(w, 2 * w, 1),
                           nn.BatchNorm2d(2 * w), nn.ReLU()]
                w *= 2
        elif kind == "grouped":  # ResNeXt-style
            layers = [nn.Conv2d(3, w, 3, 2, 1), nn.ReLU(), nn.Conv2d(w, w, 3, 1, 1, groups=8), nn.ReLU(),
                      nn.Conv2d(w, 2 * w, 3, 1, 1, groups=4), nn.ReLU()]
            w *= 2
        elif kind == "dilated":
            layers = [nn.Conv2d(3, w, 3, 1, 1), nn.ReLU(), nn.Conv2d(w, w, 3, 1, 2, dilation=2), nn.ReLU(),
                      nn.Conv2d(w, w, 3, 1, 4, dilation=4), nn.ReLU()]
        elif kind == "transposed":  # decoder / GAN generator
            layers = [nn.Conv2d(3, w, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(w, w // 2, 4, 2, 1), nn.ReLU(),
                      nn.ConvTranspose2d(w // 2, w // 4, 4, 2, 1), nn.ReLU()]
            w //= 4
        elif kind == "conv1d":
            layers = [nn.Conv1d(3, w, 5, padding=2), nn.ReLU(), nn.Conv1d(w, w, 5, padding=4, dilation=2), nn.ReLU()]
        elif kind == "conv3d":
            layers = [nn.Conv3d(3, w // 2, 3, padding=1), nn.ReLU(), nn.Conv3d(w // 2, w, 3, padding=1), nn.ReLU()]
        elif kind == "vgg":  # published widths: VGG-style 64-128-256 at 224 px
            layers = []
            c = 3
            for out in (64, 64, "M", 128, 128, "M", 256, 256, "M"):
                if out == "M":
                    layers.append(nn.MaxPool2d(2))
                else:
                    layers += [nn.Conv2d(c, out, 3, padding=1), nn.ReLU(inplace=True)]
                    c = out
            w = c
        else:
            raise ValueError(kind)
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(w, 10)

    def forward(self, x):
        h = self.features(x)
        return self.head(h.flatten(2).mean(-1))


class NormNet(nn.Module):
    def __init__(self, kind: str, width: int = 64):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.norm = {"batch": lambda: nn.BatchNorm2d(width), "group": lambda: nn.GroupNorm(8, width),
                     "instance": lambda: nn.InstanceNorm2d(width, affine=True),
                     "layer": lambda: nn.LayerNorm([width, 32, 32]), "local": lambda: nn.LocalResponseNorm(5),
                     "rms": lambda: nn.RMSNorm([width, 32, 32])}[kind]()
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        h = torch.relu(self.norm(self.conv(x)))
        return self.head(torch.relu(self.conv2(h)).mean((2, 3)))


class SeqNorm(nn.Module):
    def __init__(self, kind: str, width: int = 256):
        super().__init__()
        self.emb = nn.Embedding(1000, width)
        self.norm = nn.LayerNorm(width) if kind == "layer" else nn.RMSNorm(width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, 1000)

    def forward(self, x):
        h = self.emb(x)
        return self.head(h + self.ff(self.norm(h)))


class RNNNet(nn.Module):
    def __init__(self, kind: str, hidden: int = 256, bidirectional: bool = False):
        super().__init__()
        cls = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[kind]
        self.rnn = cls(64, hidden, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(hidden * (2 if bidirectional else 1), 10)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


class CellLoop(nn.Module):
    def __init__(self, hidden: int = 256):
        super().__init__()
        self.cell = nn.LSTMCell(64, hidden)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):
        h = c = x.new_zeros(x.shape[0], self.cell.hidden_size)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return self.head(h)


class BagNet(nn.Module):
    def __init__(self, mode: str = "mean"):
        super().__init__()
        self.bag = nn.EmbeddingBag(50_000, 128, mode=mode)
        self.mlp = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x):
        return self.mlp(self.bag(x))


class GNN(nn.Module):
    """Message passing over a fixed random graph: gather along edges, reduce at the destination."""

    def __init__(self, reduce: str, nodes: int = 2000, edges: int = 20000, width: int = 128):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.register_buffer("src", torch.randint(0, nodes, (edges,), generator=g))
        self.register_buffer("dst", torch.randint(0, nodes, (edges,), generator=g))
        self.reduce = reduce
        self.inp = nn.Linear(32, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(2))
        self.head = nn.Linear(width, 7)

    def forward(self, x):
        h = torch.relu(self.inp(x))
        for lin in self.layers:
            msg = lin(h)[self.src]
            if self.reduce == "index_add":
                agg = torch.zeros_like(h).index_add_(0, self.dst, msg)
            elif self.reduce == "scatter_add":
                agg = torch.zeros_like(h).scatter_add_(0, self.dst[:, None].expand_as(msg), msg)
            else:
                agg = torch.zeros_like(h).scatter_reduce_(0, self.dst[:, None].expand_as(msg), msg, self.reduce,
                                                          include_self=False)
            h = torch.relu(h + agg)
        return self.head(h)


class MaskedNet(nn.Module):
    """Data-dependent shapes: only the rows above a threshold go through the second layer."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.a = nn.Linear(256, 512)
        self.b = nn.Linear(512, 512)
        self.head = nn.Linear(512, 10)

    def forward(self, x):
        h = torch.relu(self.a(x))
        keep = h.mean(1) > h.mean()
        if self.kind == "masked_select":
            sel = h[keep]
            out = torch.zeros_like(h)
            out[keep] = self.b(sel)
        else:
            idx = keep.nonzero().squeeze(1)
            out = h.index_put((idx,), self.b(h[idx]), accumulate=True)
        return self.head(out)


class UnusedHead(nn.Module):
    def __init__(self, frozen: bool = False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU())
        self.head = nn.Linear(1024, 10)
        self.aux_head = nn.Linear(1024, 4096)  # defined, never used by the loss
        if frozen:
            for p in self.body[0].parameters():
                p.requires_grad_(False)

    def forward(self, x):
        return self.head(self.body(x))


class FrozenBackbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU())
        self.backbone.requires_grad_(False)
        self.head = nn.Linear(1024, 10)

    def forward(self, x):
        return self.head(self.backbone(x))


class TiedLM(nn.Module):
    def __init__(self, vocab: int = 8000, width: int = 256):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.block = nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True)
        self.out = nn.Linear(width, vocab, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x):
        return self.out(self.block(self.emb(x)))


def _lm_loss(model, batch):
    x = batch
    logits = model(x)
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten())


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10))

    def forward(self, x):
        return self.net(x)


def _images(size=32, channels=3, classes=10):
    def batch(b):
        g = torch.Generator().manual_seed(b)
        return torch.rand(b, channels, size, size, generator=g), torch.randint(0, classes, (b,), generator=g)
    return batch


def _vectors(dim, classes=10, shape=None):
    def batch(b):
        g = torch.Generator().manual_seed(b)
        x = torch.rand(b, *(shape or (dim,)), generator=g)
        return x, torch.randint(0, classes, (b,), generator=g)
    return batch


def _tokens(seq, vocab):
    def batch(b):
        g = torch.Generator().manual_seed(b)
        return torch.randint(0, vocab, (b, seq), generator=g)
    return batch


def _seq_lm_loss(model, x):
    logits = model(x)
    return nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten())


def _gnn_batch(b):
    """One graph of 2000 nodes per sample (the graph is the model's buffer; b graphs share it)."""
    g = torch.Generator().manual_seed(b)
    return torch.rand(2000, 32, generator=g), torch.randint(0, 7, (2000,), generator=g)


def _compiled(build):
    def model():
        m = build()
        m.compile(backend="inductor")
        return m
    return model


def torch_cases() -> dict[str, tuple[Workload, int, str]]:
    """name -> (workload, batch size, note)."""
    cases: dict[str, tuple] = {}

    def add(name, model, batch, b, loss=_ce, note=""):
        cases[name] = (Workload(f"torch:{name}", model, batch, loss), b, note)

    for kind in ("depthwise", "grouped", "dilated", "transposed"):
        add(f"conv-{kind}", lambda k=kind: ConvNet(k), _images(64), 4)
    add("conv1d-dilated", lambda: ConvNet("conv1d"), _vectors(0, shape=(3, 512)), 8)
    add("conv3d", lambda: ConvNet("conv3d"), _vectors(0, shape=(3, 8, 32, 32)), 2)
    add("vgg-224", lambda: ConvNet("vgg"), _images(224), 2, note="VGG widths 64-128-256 at 224 px")
    for kind in ("batch", "group", "instance", "layer", "local", "rms"):
        add(f"norm-{kind}2d", lambda k=kind: NormNet(k), _images(32), 8)
    for kind in ("layer", "rms"):
        add(f"norm-{kind}-seq", lambda k=kind: SeqNorm(k), _tokens(64, 1000), 8, loss=_seq_lm_loss)
    for kind in ("lstm", "gru", "rnn"):
        add(f"rnn-{kind}", lambda k=kind: RNNNet(k), _vectors(0, shape=(32, 64)), 16)
    add("rnn-lstm-bidirectional", lambda: RNNNet("lstm", bidirectional=True), _vectors(0, shape=(32, 64)), 16)
    add("rnn-lstmcell-loop", CellLoop, _vectors(0, shape=(16, 64)), 16)
    for mode in ("mean", "sum", "max"):
        add(f"embeddingbag-{mode}", lambda m=mode: BagNet(m), lambda b: (torch.randint(0, 50_000, (b, 40)),
                                                                          torch.randint(0, 10, (b,))), 64)
    for reduce in ("index_add", "scatter_add", "sum", "mean", "amax"):
        add(f"gnn-{reduce}", lambda r=reduce: GNN(r), _gnn_batch, 1)
    for kind in ("masked_select", "nonzero"):
        add(f"datadep-{kind}", lambda k=kind: MaskedNet(k), _vectors(256), 64)
    add("unused-head", UnusedHead, _vectors(256), 64, note="a head the loss never uses")
    add("unused-head-frozen-layer", lambda: UnusedHead(frozen=True), _vectors(256), 64)
    add("frozen-backbone", FrozenBackbone, _vectors(256), 64)
    add("tied-embedding-lm", TiedLM, _tokens(64, 8000), 4, loss=_seq_lm_loss)
    add("mlp", MLP, _vectors(256), 64)
    add("compiled-mlp", _compiled(MLP), _vectors(256), 64, note="Module.compile (inductor)")
    add("compiled-conv", _compiled(lambda: NormNet("batch")), _images(32), 8, note="Module.compile (inductor)")
    return cases


# variants: (optimizer, precision, checkpointing); the first is every case's baseline
VARIANTS = [(None, "fp32", False), ("sgd", "fp32", False), ("momentum", "fp32", False), ("adam", "bf16", False),
            ("adagrad", "fp32", False), ("rmsprop", "fp32", False), (None, "fp32", True), ("sgd", "bf16-pure", False)]


def variant_label(v) -> str:
    opt, prec, ckpt = v
    return f"{opt or 'adamw'}/{prec}" + ("/ckpt" if ckpt else "")
