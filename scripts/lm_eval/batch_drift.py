"""How much a prompt token's log-probability moves with the size of the decodes that
evaluate the prompt, with llama.cpp's flash attention on and off (llama-cpp-python, logits
for every row): the float error a scored prompt carries, whatever serves it.

    python batch_drift.py MODEL.gguf TEXT_FILE [N_TOKENS]

Prints, per (n_batch, flash attention), the largest and mean |difference| in nats from
n_batch 512 with flash attention off.
"""

from __future__ import annotations

import sys

import numpy as np
from llama_cpp import Llama


def prompt_logprobs(path: str, ids: list[int], n_batch: int, flash_attn: bool) -> np.ndarray:
    llm = Llama(
        model_path=path, n_ctx=2048, n_batch=n_batch, n_ubatch=n_batch, logits_all=True,
        flash_attn=flash_attn, verbose=False,
    )  # fmt: skip
    llm.eval(ids)
    rows = np.array(llm.scores[: len(ids)], dtype=np.float64)
    m = rows.max(1, keepdims=True)
    lsm = rows - m - np.log(np.exp(rows - m).sum(1, keepdims=True))
    return np.array([lsm[i][ids[i + 1]] for i in range(len(ids) - 1)])


def main(path: str, text_file: str, n: int = 1200) -> None:
    text = open(text_file, encoding="utf-8").read()
    probe = Llama(model_path=path, n_ctx=2048, verbose=False, vocab_only=True)
    ids = probe.tokenize(text.encode(), add_bos=False)[:n]
    ref = prompt_logprobs(path, ids, 512, False)
    for n_batch, fa in ((512, True), (256, True), (128, True), (64, True), (32, True), (32, False)):
        d = np.abs(prompt_logprobs(path, ids, n_batch, fa) - ref)
        print(f"{len(ids)} tokens, n_batch {n_batch:3d}, flash attention {'on ' if fa else 'off'}:"
              f" largest {d.max():.4f} nats, mean {d.mean():.5f}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:]))
