"""Runs the vendored llama.cpp convert_hf_to_gguf.py on a model from
make_model.py, which has weights but no tokenizer files.

    python convert_random.py LLAMA_CPP_DIR MODEL_DIR --outfile F.gguf --outtype f32|f16|bf16

Two adjustments, neither touching how tensors are converted:
- the vocabulary is the converter's own built-in one (models/ggml-vocab-
  llama-spm.gguf, 32000 tokens, through its _set_vocab_builtin), since a
  random model has no tokenizer and the benchmark feeds token ids;
- torch builds older than the converter expects lack the float8 dtypes its
  lazy-tensor table names at import time: placeholders stand in for them
  (the random model is float32, so no tensor has those types).
"""
import pathlib
import sys


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    llama_cpp = pathlib.Path(sys.argv[1]).resolve()
    sys.path[:0] = [str(llama_cpp), str(llama_cpp / "gguf-py")]

    import torch
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
        if not hasattr(torch, name):
            setattr(torch, name, type(name, (), {})())
    for name in ("uint16", "uint32", "uint64"):
        if not hasattr(torch, name):
            setattr(torch, name, type(name, (), {})())

    import convert_hf_to_gguf as conv
    from conversion.llama import LlamaModel

    def builtin_vocab(self):
        self._set_vocab_builtin("llama-spm", self.hparams["vocab_size"])

    LlamaModel.set_vocab = builtin_vocab
    # The converter finds models/ through sys.path[0].
    sys.path[0] = str(llama_cpp)
    sys.argv = [str(llama_cpp / "convert_hf_to_gguf.py")] + sys.argv[2:]
    conv.main()


if __name__ == "__main__":
    main()
