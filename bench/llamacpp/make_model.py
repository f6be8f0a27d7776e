"""Saves a randomly initialised Llama-3-shaped LlamaForCausalLM with
transformers' save_pretrained (safetensors, float32): the weights that
model_compare.sh gives to both attn generate and llama.cpp.

    python make_model.py OUT_DIR [--layers 8] [--hidden 2048] [--heads 32]
        [--kv-heads 8] [--intermediate 8192] [--vocab 32000] [--context 17408]
        [--seed 0]

No rope_scaling (plain RoPE, theta 500000), untied lm_head, RMSNorm eps 1e-5:
a config that both loaders read the same way. The weights are transformers'
own initialisation (normal, std 0.02) under torch.manual_seed(seed).
"""
import argparse
import json
import pathlib

import torch
import transformers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--intermediate", type=int, default=8192)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--context", type=int, default=17408)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()

    cfg = transformers.LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=a.layers, num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads, max_position_embeddings=a.context,
        rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=None,
        tie_word_embeddings=False, attention_bias=False, bos_token_id=1, eos_token_id=2,
        torch_dtype="float32")
    torch.manual_seed(a.seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    out = pathlib.Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="100GB")
    n = sum(t.numel() for t in model.parameters())
    print(json.dumps({"dir": str(out), "parameters": n, "transformers": transformers.__version__,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
