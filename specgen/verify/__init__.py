"""`specgen verify`: prove on the user's own pair that speculation leaves the target's output
unchanged. Returns data; never prints (the CLI renders it).

Two checks (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding", Theorem 1 / Appendix A.1; Chen et al. 2023, Theorem 1):

- the greedy check (`greedy`): speculative output equals ordinary output token for token;
- the sampling check (`sampling`): speculative samples follow the target's exact law, by
  chi-square tests (`stats`).

`config` holds the settings (`VerifyConfig`); `report` runs the checks they select (`verify`)
and returns what they found (`VerifyReport`); `runs` drives the loop for both checks.
"""
