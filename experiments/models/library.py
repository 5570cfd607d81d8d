"""Models from real model libraries, random weights: their code, kernellab's kernels.

    kernellab optimize experiments.models.library:timm_resnet --inputs experiments.models.library:timm_resnet_inputs
    kernellab optimize experiments.models.library:hf_bert --inputs experiments.models.library:hf_bert_inputs
    PYTHONPATH=. python experiments/bench_optimize.py --models experiments.models.library:timm_resnet,...

Each factory and inputs function takes ``small``: full size on a GPU (``small=False``), a small variant
the Triton interpreter gets through on a CPU (``small=True``); None picks by ``torch.cuda.is_available()``
(``kernellab.wholemodel.load_model_spec`` passes its own choice). The libraries are imported inside the
functions: kernellab imports without them, and a missing one is a one-line error.

- ``timm_resnet``: ``timm.create_model("resnet18")`` (``resnet10t``, timm's smallest ResNet, at 32x32 on
  a CPU), in eval mode, on 8x3x224x224 images.
- ``hf_bert``: ``transformers.BertModel`` built from a ``BertConfig`` at bert-base sizes (12 layers, 768
  wide; a 2-layer 32-wide one on a CPU), in eval mode, on ``input_ids`` and an ``attention_mask`` with
  padding (8x128 tokens). It returns the library's own ``ModelOutput`` (last hidden state and pooled
  output), which optimize compares tensor by tensor: no wrapper.

Both are in eval mode, as a library model is for inference (``from_pretrained`` gives eval too): in
training mode their dropout draws random numbers no kernel reproduces, and the end-to-end check would put
those subgraphs back to PyTorch.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch
from torch import nn

# bert-base-uncased's sizes, and a tiny configuration of the same code for the interpreter
BERT_BASE = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072, "max_position_embeddings": 512}
BERT_SMALL = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "intermediate_size": 64, "max_position_embeddings": 32}


def _small(small: bool | None) -> bool:
    return not torch.cuda.is_available() if small is None else bool(small)


def _library(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise RuntimeError(f"{name} is not importable here ({exc}); pip install {name}") from None


def timm_resnet(small: bool | None = None) -> nn.Module:
    timm = _library("timm")
    torch.manual_seed(0)
    if _small(small):
        return timm.create_model("resnet10t", pretrained=False, num_classes=10).eval()
    return timm.create_model("resnet18", pretrained=False).eval()


def timm_resnet_inputs(small: bool | None = None) -> list[torch.Tensor]:
    return [torch.randn(2, 3, 32, 32)] if _small(small) else [torch.randn(8, 3, 224, 224)]


def hf_bert(small: bool | None = None) -> nn.Module:
    transformers = _library("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(**(BERT_SMALL if _small(small) else BERT_BASE))
    return transformers.BertModel(config).eval()


def hf_bert_inputs(small: bool | None = None) -> list[torch.Tensor]:
    batch, seq = (2, 8) if _small(small) else (8, 128)
    vocab = (BERT_SMALL if _small(small) else BERT_BASE)["vocab_size"]
    ids = torch.randint(0, vocab, (batch, seq))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[batch // 2:, seq - seq // 4:] = 0  # half the batch padded: the attention takes a real mask
    return [ids, mask]
