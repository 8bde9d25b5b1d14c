"""Each loglikelihood lm-evaluation-harness got from `specgen serve` against the target's own
rows: the text lm-eval scored (context + continuation, split as its `_encode_pair` splits
it) decoded in one ordinary pass, the continuation's log-softmax summed.

    python check.py TARGET.gguf SAMPLES.jsonl

Prints each choice's two values and exits 1 when one differs by more than 1e-3 nats.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from specgen.llamacpp import EngineConfig, LlamaEngine


def main(target_path: str, samples_path: str) -> int:
    docs = [json.loads(line) for line in open(samples_path, encoding="utf-8")]
    worst, n = 0.0, 0
    with LlamaEngine(target_path, EngineConfig(n_ctx=512)) as target:
        for d in docs:
            for i, resp in enumerate(d["resps"]):
                args = d["arguments"][f"gen_args_{i}"]
                context, continuation = args["arg_0"], args["arg_1"]
                whole = target.tokenize((context + continuation).encode(), add_special=False)
                n_ctx = len(target.tokenize(context.encode(), add_special=False))
                target.truncate(0)
                rows = np.array(target.decode(whole, all_logits=True), dtype=np.float64)
                m = rows.max(1, keepdims=True)
                lsm = rows - m - np.log(np.exp(rows - m).sum(1, keepdims=True))
                ref = sum(lsm[j - 1][whole[j]] for j in range(n_ctx, len(whole)))
                got = float(resp[0][0])
                worst, n = max(worst, abs(got - ref)), n + 1
                print(f"{context!r:45} {continuation!r:16} served {got:9.4f} target {ref:9.4f}")
    print(f"{n} choices, largest difference {worst:.2e} nats")
    return 0 if worst <= 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
