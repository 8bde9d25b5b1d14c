"""Choosing the block size K from costs and acceptance measured online.

One job per module: `acceptance` and `costs` estimate (acceptance by block position; seconds
of a decode by its size), `goodput` predicts and optimizes the tokens per second of a round
or of a batch's step, `latency` holds a choice within the operator's latency targets, and
`batch` is the policy (`BatchController`: the server's N slots, and the single stream as
its one-slot case). The ordinary-pass baseline every speedup is measured against is
`specgen.measure.Baseline`.

Pure: numpy only.
"""
