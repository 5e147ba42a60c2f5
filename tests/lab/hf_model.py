#!/usr/bin/env python
"""A small real Hugging Face model repository, for tests and the lab only.

Builds ``<mirrors>/models/<org>/<name>``: a non-bare git repository in the layout olah serves offline
(``[accessibility] offline = true``, ``mirrors-path = [<mirrors>]``). The files are real formats, made
deterministically from a seed:

    config.json                       a tiny Llama config
    tokenizer.json                    a word-level tokenizers file
    tokenizer_config.json
    model.safetensors.index.json      weight_map of both shards
    model-00001-of-00002.safetensors  real safetensors (8-byte little-endian header length, JSON header
    model-00002-of-00002.safetensors  with dtype/shape/data_offsets, raw little-endian bytes)
    original/consolidated.00.pth      what the default ignore pattern ``original/**`` must skip
    .gitattributes

With ``lfs=True`` (default) the shards and the .pth are committed as Git LFS pointer files and their
bytes stored under ``.git/lfs/objects/<aa>/<bb>/<sha256>``, written by hand (the git-lfs program is not
needed): olah then reports ``lfs {oid, size}`` for them, as huggingface.co does for weights, and plain
git blob ids (``oid`` = sha1 of ``blob <size>\\0<content>``) for the small files. With ``lfs=False``
everything is a plain git blob and olah reports no LFS data at all.

Commits have fixed authors and dates, so their ids are the same on every machine.

    tests/lab/hf_model.py MIRRORS [--repo org/name] [--no-lfs]   build, print {"sha", "path", "files"}
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys

DEFAULT_REPO = "ttfleet-lab/Tiny-Llama-2L"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
LFS_SUFFIXES = (".safetensors", ".pth")
DATE = "2026-11-30T12:00:00Z"


def _tensor_bytes(rng, count, width):
    return rng.randbytes(count * width)


def safetensors_blob(tensors, metadata=None):
    """Serialize ``{name: (dtype, shape, raw bytes)}`` in the safetensors format."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    payload = []
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        payload.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    # The format allows trailing spaces; aligning the data to 8 bytes is what the reference writer does.
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(payload)


def model_files(seed=20261130, hidden=256, layers=2, vocab=512):
    """Return ``{path: bytes}`` of the whole model (a few MB)."""
    rng = random.Random(seed)
    shard_tensors = ({}, {})
    shard_tensors[0]["model.embed_tokens.weight"] = ("BF16", (vocab, hidden), _tensor_bytes(rng, vocab * hidden, 2))
    for layer in range(layers):
        target = shard_tensors[layer * 2 // layers]
        prefix = f"model.layers.{layer}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            target[f"{prefix}.self_attn.{proj}.weight"] = ("BF16", (hidden, hidden), _tensor_bytes(rng, hidden**2, 2))
        for proj, shape in (("gate_proj", (hidden * 2, hidden)), ("up_proj", (hidden * 2, hidden))):
            target[f"{prefix}.mlp.{proj}.weight"] = ("BF16", shape, _tensor_bytes(rng, shape[0] * shape[1], 2))
        target[f"{prefix}.mlp.down_proj.weight"] = ("BF16", (hidden, hidden * 2), _tensor_bytes(rng, hidden**2 * 2, 2))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            target[f"{prefix}.{norm}.weight"] = ("F32", (hidden,), _tensor_bytes(rng, hidden, 4))
    shard_tensors[1]["model.norm.weight"] = ("F32", (hidden,), _tensor_bytes(rng, hidden, 4))
    shard_tensors[1]["lm_head.weight"] = ("BF16", (vocab, hidden), _tensor_bytes(rng, vocab * hidden, 2))

    files = {}
    weight_map = {}
    total = 0
    for name, tensors in zip(SHARDS, shard_tensors, strict=True):
        files[name] = safetensors_blob(tensors, {"format": "pt"})
        for tensor, (_dtype, _shape, raw) in tensors.items():
            weight_map[tensor] = name
            total += len(raw)
    files["model.safetensors.index.json"] = _json({"metadata": {"total_size": total}, "weight_map": weight_map})
    files["config.json"] = _json(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": hidden,
            "intermediate_size": hidden * 2,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "vocab_size": vocab,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5,
            "torch_dtype": "bfloat16",
            "tie_word_embeddings": False,
        }
    )
    words = ["<unk>", "<s>", "</s>"] + [f"w{index}" for index in range(vocab - 3)]
    files["tokenizer.json"] = _json(
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {
                    "id": index,
                    "content": word,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": True,
                }
                for index, word in enumerate(words[:3])
            ],
            "normalizer": None,
            "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": None,
            "decoder": None,
            "model": {
                "type": "WordLevel",
                "vocab": {word: index for index, word in enumerate(words)},
                "unk_token": "<unk>",
            },
        }
    )
    files["tokenizer_config.json"] = _json(
        {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "unk_token": "<unk>",
            "model_max_length": 2048,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
    )
    # Meta's original checkpoint beside the HF one, as in meta-llama repos: bytes only, never loaded.
    files["original/consolidated.00.pth"] = b"PK\x03\x04" + rng.randbytes(256 * 1024)
    files[".gitattributes"] = b"".join(
        b"*%s filter=lfs diff=lfs merge=lfs -text\n" % suffix.encode() for suffix in LFS_SUFFIXES
    )
    return files


def _json(data):
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def git_blob_sha1(content):
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _git(*args, cwd):
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "ttfleet lab",
        "GIT_AUTHOR_EMAIL": "lab@ttfleet.invalid",
        "GIT_COMMITTER_NAME": "ttfleet lab",
        "GIT_COMMITTER_EMAIL": "lab@ttfleet.invalid",
        "GIT_AUTHOR_DATE": DATE,
        "GIT_COMMITTER_DATE": DATE,
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def build(mirrors, repo_id=DEFAULT_REPO, lfs=True, seed=20261130, hidden=256):
    """Build (or rebuild) the repository; return ``{"sha", "path", "files"}``.

    ``files`` maps each path to ``{size, sha256, blob_sha1, lfs}`` of the real content.
    """
    path = os.path.join(mirrors, "models", *repo_id.split("/"))
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    _git("init", "-q", "-b", "main", cwd=path)
    files = model_files(seed=seed, hidden=hidden)
    info = {}
    for name, content in sorted(files.items()):
        target = os.path.join(path, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        sha256 = hashlib.sha256(content).hexdigest()
        as_lfs = lfs and name.endswith(LFS_SUFFIXES)
        if as_lfs:
            obj = os.path.join(path, ".git", "lfs", "objects", sha256[:2], sha256[2:4], sha256)
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            with open(obj, "wb") as handle:
                handle.write(content)
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(content)}\n"
            with open(target, "w") as handle:
                handle.write(pointer)
        else:
            with open(target, "wb") as handle:
                handle.write(content)
        info[name] = {"size": len(content), "sha256": sha256, "blob_sha1": git_blob_sha1(content), "lfs": as_lfs}
    _git("add", "-A", cwd=path)
    _git("commit", "-q", "-m", "Add Tiny-Llama-2L (lab model)", cwd=path)
    sha = _git("rev-parse", "HEAD", cwd=path)
    _git("tag", "v1.0", cwd=path)
    return {"sha": sha, "path": path, "files": info, "content": files}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("mirrors")
    parser.add_argument("--repo", default=DEFAULT_REPO)
    parser.add_argument("--no-lfs", action="store_true")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size: 256 is ~2 MB of weights, 1024 ~42 MB")
    args = parser.parse_args(argv)
    result = build(args.mirrors, args.repo, lfs=not args.no_lfs, hidden=args.hidden)
    result.pop("content")
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
