"""The PNG: latency percentiles at fixed rates, max throughput against the no-op floor, latency by
container count, and keep-alive against a new connection per request."""

from __future__ import annotations

from pathlib import Path

COLORS = {"noop": "#9e9e9e", "validate": "#1f77b4", "mutate": "#d62728"}
ENDPOINTS = ("noop", "validate", "mutate")


def plot(summary: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    width = 0.26

    # 1. Latency percentiles at the fixed rates.
    ax = axes[0][0]
    groups = [(rate, q) for rate in summary["fixed_rate"] for q in ("p50", "p99", "p99.9")]
    for i, e in enumerate(ENDPOINTS):
        values = [summary["fixed_rate"][rate][e]["latency_ms"][q] for rate, q in groups]
        xs = [g + (i - 1) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=f"/{e}", color=COLORS[e])
    ax.set_xticks(range(len(groups)), [f"{q}\n@{rate} rps" for rate, q in groups])
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms, log)")
    ax.axhline(5, color="black", lw=0.8, ls=":")
    ax.text(len(groups) - 0.5, 5, "5 ms", va="bottom", ha="right", fontsize=8)
    ax.set_title("Latency at fixed rates (seed pod, keep-alive)")
    ax.legend(fontsize=8)

    # 2. Max throughput, keep-alive and new connection per request, with the no-op floor.
    ax = axes[0][1]
    modes = [("keep-alive", summary["max_throughput"]), ("new connection", summary["new_connection"]["max"])]
    for i, e in enumerate(ENDPOINTS):
        values = [m[e]["throughput_rps"]["median"] for _, m in modes]
        lows = [m[e]["throughput_rps"]["median"] - m[e]["throughput_rps"]["min"] for _, m in modes]
        highs = [m[e]["throughput_rps"]["max"] - m[e]["throughput_rps"]["median"] for _, m in modes]
        xs = [g + (i - 1) * width for g in range(len(modes))]
        bars = ax.bar(xs, values, width, yerr=[lows, highs], capsize=3, label=f"/{e}", color=COLORS[e])
        if e != "noop":
            ratio = summary["max_throughput"][e]["ratio_to_noop"]["median"]
            top = summary["max_throughput"][e]["throughput_rps"]["max"]
            ax.text(bars[0].get_x() + width / 2, top, f"{ratio:.2f}x", ha="center", va="bottom", fontsize=8)
    floor = summary["max_throughput"]["noop"]["throughput_rps"]["median"]
    ax.axhline(floor, color=COLORS["noop"], ls="--", lw=1)
    ax.text(-0.45, floor, " no-op floor", va="bottom", fontsize=8, color="#555555")
    ax.set_xticks(range(len(modes)), [m for m, _ in modes])
    ax.set_ylabel("requests/s (median of rounds, range as bars)")
    ax.set_title(f"Max throughput, 1 worker (x{summary['loadgen']['max_mode_workers']} concurrent)")
    ax.legend(fontsize=8)

    # 3. Latency by container count.
    ax = axes[1][0]
    sweep = summary["sweep"]["by_endpoint"]
    points = [(1, "seed"), (10, "pod10"), (50, "pod50")]
    for e in ENDPOINTS:
        if not all(b in sweep[e] for _, b in points):
            continue
        xs = [n for n, _ in points]
        ax.plot(xs, [sweep[e][b]["latency_ms"]["p50"] for _, b in points], "o-", color=COLORS[e], label=f"/{e} p50")
        ax.plot(xs, [sweep[e][b]["latency_ms"]["p99"] for _, b in points], "s:", color=COLORS[e], label=f"/{e} p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([1, 10, 50], ["1", "10", "50"])
    ax.set_xlabel("containers in the pod")
    ax.set_ylabel("latency (ms, log)")
    ax.set_title(f"Latency by pod size at {summary['sweep']['rate']} rps")
    ax.legend(fontsize=7, ncol=3)

    # 4. Keep-alive against a new connection per request, same rate.
    ax = axes[1][1]
    rate = str(summary["new_connection"]["rate"])
    if rate in summary["fixed_rate"]:
        cases = [("keep-alive", summary["fixed_rate"][rate]), ("new conn", summary["new_connection"]["fixed"])]
        labels = [f"{c} {q}" for c, _ in cases for q in ("p50", "p99")]
        for i, e in enumerate(ENDPOINTS):
            values = [m[e]["latency_ms"][q] for _, m in cases for q in ("p50", "p99")]
            xs = [g + (i - 1) * width for g in range(len(labels))]
            ax.bar(xs, values, width, label=f"/{e}", color=COLORS[e])
        ax.set_xticks(range(len(labels)), labels)
        ax.set_ylabel("latency (ms)")
        ax.set_title(f"TLS handshake per request at {rate} rps")
        ax.legend(fontsize=8)
    else:
        ax.axis("off")

    m = summary["machine"]
    fig.suptitle(
        f"gpu-webhook {summary['code']['commit']}{' (+uncommitted)' if summary['code']['webhook_dirty'] else ''}"
        f"  {summary['started']}  {m['nproc']} x {m['cpu_model']}, Python {m['python']}  ({m['pinning']})",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
