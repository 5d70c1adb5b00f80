"""A cell's figures from its ranks' records, and the best of its repeated rounds."""

from __future__ import annotations

import statistics

from pactrain_hvd.core.accounting import ring_allreduce_bytes

# What a TensorFlow rank adds to its record (tf_worker.py): per rank 0, carried into the cell as they are.
_TF_FIGURES = ("framework", "phases_in_graph", "compute_s", "pack_unpack_s", "traces_first_call", "traces",
               "reduction_traces", "warmup_step_s")


def summarize_cell(ranks: list[dict], link: dict, bound: dict) -> dict:
    """The figures of one cell, from the ranks' records (see the README for each column)."""
    size, batch = ranks[0]["size"], ranks[0]["batch_size"]
    steps = len(ranks[0]["steps"])
    step_s = [max(r["steps"][i]["total"] for r in ranks) for i in range(steps)]  # a step ends when the last rank's does
    median_step = statistics.median(step_s)
    phases = {phase: statistics.mean(statistics.median(s[phase] for s in r["steps"]) for r in ranks)
              for phase in ("compute", "compress", "comm_wait", "update")}
    payload = ranks[0]["payload"]
    ideal_bytes = ring_allreduce_bytes(payload["allreduce_bytes"], size) + (size - 1) * payload["allgather_bytes"]
    tx = statistics.mean(r["nic"]["tx_bytes"] for r in ranks) / steps
    control_tx = statistics.mean(r["control_tx_bytes_per_s"] for r in ranks) * statistics.mean(step_s)
    rx = statistics.mean(r["nic"]["rx_bytes"] for r in ranks) / steps
    rate_bytes = link["mbit_per_s"] * 1e6 / 8
    samples = size * batch / median_step
    return {
        "samples_per_s": samples, "step_s": median_step, "step_s_all": step_s, "phases_s": phases,
        "payload": payload, "ideal_ring_bytes_per_worker": ideal_bytes, "ideal_wire_s": ideal_bytes / rate_bytes,
        "wire_tx_bytes_per_step": tx, "wire_rx_bytes_per_step": rx,
        "wire_tx_bytes_per_rank": [r["nic"]["tx_bytes"] / steps for r in ranks],
        "wire_over_ideal": tx / ideal_bytes if ideal_bytes else None,
        "control_tx_bytes_per_step": control_tx, "data_over_ideal": (tx - control_tx) / ideal_bytes if ideal_bytes else None,
        "counter_wire_s": tx / rate_bytes,
        "bound_samples_per_s": bound["samples_per_s"], "ratio_to_bound": samples / bound["samples_per_s"],
        "loss_first": ranks[0]["losses"][0], "loss_last": ranks[0]["losses"][-1],
        "pactrain_stats": ranks[0].get("pactrain_stats"), "comm_in_backward": ranks[0].get("comm_in_backward", False),
        **{key: ranks[0][key] for key in _TF_FIGURES if key in ranks[0]},
    }


def best_round(tries: list[dict], bound: dict) -> dict:
    """The try with the highest throughput (or the last failure), against the best bound."""
    ran = [cell for cell in tries if "error" not in cell]
    if not ran:
        return tries[-1]
    best = dict(max(ran, key=lambda cell: cell["samples_per_s"]))
    best.update(rounds=[cell.get("samples_per_s") for cell in tries], bound_samples_per_s=bound["samples_per_s"],
                ratio_to_bound=best["samples_per_s"] / bound["samples_per_s"])
    return best
