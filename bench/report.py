"""Markdown tables from a result, and the results section of bench/README.md kept up to date."""

from __future__ import annotations

from pathlib import Path

ENDPOINTS = ("noop", "validate", "mutate")
START, END = "<!-- bench:results:start -->", "<!-- bench:results:end -->"


def _lat(block: dict) -> str:
    lat = block["latency_ms"]
    return f"{lat['p50']:.2f} / {lat['p99']:.2f} / {lat['p99.9']:.2f}"


def _rps(block: dict) -> str:
    t = block["throughput_rps"]
    return f"{t['median']:.0f} ({t['min']:.0f}–{t['max']:.0f})"


def machine_line(s: dict) -> str:
    m = s["machine"]
    load = ", ".join(f"{x:.2f}" for x in m.get("loadavg_start", []))
    noise = ""
    if "interference" in m:
        steal, others = m["interference"]["server_core_steal"], m["interference"]["server_core_others"]
        noise = (f" On the server's core during runs: hypervisor steal {steal['median']:.0%} median "
                 f"({steal['max']:.0%} max), other processes {others['median']:.0%} ({others['max']:.0%} max).")
    return (
        f"{m['nproc']} cores, {m['cpu_model']}, Python {m['python']}, Linux {m['kernel']}; {m['pinning']}; "
        f"load average at start {load}.{noise} Code: {s['code']['commit']}"
        f"{' with uncommitted webhook/ changes' if s['code']['webhook_dirty'] else ''}, {s['code']['source']}. "
        f"Run {s['started']}, {s['seconds']:.0f} s, {s['requests']} requests, "
        f"{'every one a 200 with a correct AdmissionReview' if s['all_ok'] else 'NOT ALL OK'}."
    )


def main_table(s: dict) -> str:
    rates = list(s["fixed_rate"])
    head = ["endpoint", "max rps (range)", "× no-op (range)"]
    head += [f"p50 / p99 / p99.9 ms @{r} rps" for r in rates]
    head += [f"CPU µs/req @{rates[-1]} rps", "max rps, new conn"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in ENDPOINTS:
        ratio = s["max_throughput"][e]["ratio_to_noop"]
        cells = [f"/{e}", _rps(s["max_throughput"][e]),
                 "1 (floor)" if e == "noop" else f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f})"]
        cells += [_lat(s["fixed_rate"][r][e]) for r in rates]
        cells += [f"{s['fixed_rate'][rates[-1]][e]['server_cpu_us_per_request']['median']:.0f}",
                  _rps(s["new_connection"]["max"][e])]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def sweep_table(s: dict) -> str:
    sweep = s["sweep"]["by_endpoint"]
    names = list(next(iter(sweep.values())))
    size = {n: s["bodies"][n]["bytes"] for n in names}
    head = ["endpoint"] + [f"{n} ({size[n] / 1024:.1f} KB)" for n in names] + ["50 ÷ 1 container (p50, p99)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in ENDPOINTS:
        g = s["sweep"]["growth_1_to_50"].get(e, {})
        cells = [f"/{e}"] + [f"{sweep[e][n]['latency_ms']['p50']:.2f} / {sweep[e][n]['latency_ms']['p99']:.2f}"
                             for n in names]
        cells.append(f"{g.get('p50', float('nan')):.2f}× / {g.get('p99', float('nan')):.2f}×")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def other_lines(s: dict) -> str:
    mem = s["memory_mb"]
    w, start, master = mem["worker_end"], mem["worker_start"], mem["master_end"]
    nc = s["new_connection"]
    hs = nc["handshake_cost"]
    gen = s["generator"]
    handshake = "; ".join(
        f"/{e} +{hs[e]['p50_ms_added']:.2f} ms p50, +{hs[e]['server_cpu_us_added']:.0f} µs server CPU"
        for e in ENDPOINTS if e in hs
    )
    lines = [
        f"- **Memory**: worker VmRSS {w.get('VmRSS')} MB after the run (peak {w.get('VmHWM')}, "
        f"{start.get('VmRSS')} at start; Pss {w.get('Pss')} MB), master {master.get('VmRSS')} MB.",
        f"- **New connection per request** at {nc['rate']} rps (TLS 1.3 handshake, ECDSA P-256): "
        + (f"{handshake} per request over keep-alive at the same rate." if handshake
           else "no keep-alive run at the same rate to compare with."),
        f"- **Load generator**: in max-throughput runs vegeta, pinned to its own core, used at most "
        f"{gen['loadgen_cpu_util_max']:.0%} of it ({gen['loadgen_cpu_us_per_request_median']:.0f} µs per request), "
        f"while the server's core was {gen['server_core_busy_median']:.0%} busy (median; the server itself "
        f"{gen['server_cpu_util_median']:.0%}, the rest steal and other processes): "
        + ("the server is the bottleneck." if gen["not_the_bottleneck"] else "**check: the generator may limit**."),
    ]
    gc = s.get("full_gc")
    if gc:
        lines.append(f"- **Full garbage collections** in the worker over the run: {gc['count']}, "
                     f"each stopping it for {gc['mean_ms']} ms on average, {gc['max_ms']} ms at most.")
    probe = s.get("idle_connection_probe")
    if probe:
        lines.append(
            f"- **Idle TLS connections** ({probe['idle_connections']} handshaken, no request, as Go's pool keeps "
            f"them): the next request got {probe['status']} in {probe['ms']:.0f} ms"
            + (" — **the worker stalls**." if probe["stalled"] else " — no stall.")
        )
    return "\n".join(lines)


def targets_table(s: dict) -> str:
    rows = ["| target | measured | met |", "|---|---|---|"]
    for t in s["targets"]:
        rows.append(f"| {t['target']} | {t['value']:.2f} {t['unit']} | {'yes' if t['met'] else '**no**'} |")
    return "\n".join(rows)


def section(s: dict, png: str | None) -> str:
    parts = [
        f"Machine: {machine_line(s)}",
        "",
        "Seed pod, one worker (its event loop; 8 threads for bodies over 256 KiB), keep-alive unless noted; "
        "latencies from vegeta (client side, "
        "TLS included), pooled over rounds; ranges are over rounds, endpoints interleaved.",
        "",
        main_table(s),
        "",
        f"Latency p50 / p99 (ms) by body at {s['sweep']['rate']} rps:",
        "",
        sweep_table(s),
        "",
        other_lines(s),
        "",
        targets_table(s),
    ]
    if png:
        parts += ["", f"![benchmark plot]({png})"]
    return "\n".join(parts)


def comparison(columns: list[tuple[str, dict]]) -> str:
    """The numbers the targets name, side by side for several runs (e.g. before the fixes, now, patched)."""
    mx, fr = "max_throughput", "fixed_rate"

    def lat(s: dict) -> str:
        return _lat(s[fr]["500"]["mutate"])

    measures = [
        ("/noop max rps", lambda s: f"{s[mx]['noop']['throughput_rps']['median']:.0f}"),
        ("/validate max rps (× no-op)", lambda s: f"{s[mx]['validate']['throughput_rps']['median']:.0f} "
                                                  f"({s[mx]['validate']['ratio_to_noop']['median']:.2f}×)"),
        ("/mutate max rps (× no-op)", lambda s: f"{s[mx]['mutate']['throughput_rps']['median']:.0f} "
                                                f"({s[mx]['mutate']['ratio_to_noop']['median']:.2f}×)"),
        ("/noop p50 / p99 / p99.9 @500 rps (ms)", lambda s: _lat(s[fr]["500"]["noop"])),
        ("/mutate p50 / p99 / p99.9 @500 rps (ms)", lat),
        ("/mutate CPU µs/req @500 rps",
         lambda s: f"{s[fr]['500']['mutate']['server_cpu_us_per_request']['median']:.0f}"),
        ("/validate p50 50÷1 containers", lambda s: f"{s['sweep']['growth_1_to_50']['validate']['p50']:.2f}×"),
        ("/mutate p50 50÷1 containers", lambda s: f"{s['sweep']['growth_1_to_50']['mutate']['p50']:.2f}×"),
        ("/mutate p50 at 50 containers (ms)",
         lambda s: f"{s['sweep']['by_endpoint']['mutate']['pod50']['latency_ms']['p50']:.2f}"),
        ("worker VmRSS after the run / at start (MB)",
         lambda s: f"{s['memory_mb']['worker_end']['VmRSS']} / {s['memory_mb']['worker_start']['VmRSS']}"),
        ("worker Pss after the run (MB)", lambda s: f"{s['memory_mb']['worker_end'].get('Pss')}"),
        ("full GCs in the worker: count, mean / max pause",
         lambda s: f"{s['full_gc']['count']}, {s['full_gc']['mean_ms']} / {s['full_gc']['max_ms']} ms"),
        ("max rps, new connection per request (noop / mutate)",
         lambda s: f"{s['new_connection']['max']['noop']['throughput_rps']['median']:.0f} / "
                   f"{s['new_connection']['max']['mutate']['throughput_rps']['median']:.0f}"),
        ("request behind 8 idle TLS connections",
         lambda s: f"{s['idle_connection_probe']['status']} in {s['idle_connection_probe']['ms']:.0f} ms"),
        ("targets met", lambda s: f"{sum(t['met'] for t in s['targets'])} of {len(s['targets'])}"),
    ]
    rows = ["| measure | " + " | ".join(label for label, _ in columns) + " |", "|---|" + "---|" * len(columns)]
    for name, get in measures:
        cells = []
        for _, s in columns:
            try:
                cells.append(get(s))
            except (KeyError, TypeError):
                cells.append("–")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    notes = [f"- {label}: {s['code']['commit']}, {s['code']['source']}, run {s['started']}" for label, s in columns]
    return "\n".join(rows + [""] + notes)


def update_readme(readme: Path, body: str, start: str = START, end: str = END) -> None:
    """Replace what stands between the ``start`` and ``end`` markers of ``readme`` with ``body``."""
    text = readme.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{readme} lacks the {start} ... {end} markers")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{body}\n{end}{tail}")
