"""Choosing the block size K from costs and acceptance measured online.

One job per module: `acceptance` and `costs` estimate (acceptance by block position; seconds
of a decode by its size), `goodput` predicts and optimizes the tokens per second of a round
or of a batch's step, and the policies decide: `single` for one sequence (`Controller`,
`--draft-max auto`), `batch` for the server's slots (`BatchController`). The ordinary-pass
baseline every speedup is measured against is `specgen.measure.Baseline`.

Pure: numpy only.
"""
