"""The planner's tables as text, and as a plot (matplotlib, imported only
when a plot is asked for)."""

from .bytes import phase_kinds
from .units import format_bytes


def _ms(seconds):
    return f"{seconds * 1e3:.1f}"


def bytes_cell(r, which="bytes") -> str:
    """The bytes of each kind of step of the configuration's schedule
    (bytes.phase_kinds): one number, or warmup / compressed (/ local);
    `which`: "bytes" (all sent) or "cross_bytes" (across nodes)."""
    sb = getattr(r, which)
    return " / ".join(f"{getattr(sb, kind):,}" for kind in phase_kinds(r.config))


def table(records, model=None) -> str:
    """The table; with a column of the bytes across nodes when any
    configuration sends some (a cluster of several nodes), and with
    `model` one of the caller's memory per rank (`planner.caller_memory`)."""
    from .planner import caller_memory
    cross = any(r.cross_bytes is not None and any(v for v in vars(r.cross_bytes).values()) for r in records)
    head = ["configuration", "bytes/rank/step", "avg bytes/step", "memory/rank", "state/rank",
            "compute ms", "update ms", "compress ms", "exposed comm ms", "step ms", "avg step ms", "x AdamW"]
    if cross:
        head[2:2] = ["across nodes/rank/step"]
    if model is not None:
        head[-7:-7] = ["caller/rank"]
    rows = [head]
    for r in records:
        t = r.time
        row = [r.name, bytes_cell(r), f"{r.run_bytes_per_step:,.0f}", format_bytes(r.memory.total),
               format_bytes(r.memory.state), _ms(t.compute), _ms(t.update), _ms(t.compression),
               _ms(t.exposed), _ms(t.total), _ms(r.average_time), f"{r.speedup:.2f}"]
        if cross:
            row[2:2] = [bytes_cell(r, "cross_bytes")]
        if model is not None:
            row[-7:-7] = [format_bytes(caller_memory(r, model))]
        rows.append(row)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = []
    for k, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(cells))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


NOTES = """bytes/rank/step: info.bytes_sent of a step after the third (1-bit Adam/LAMB: warmup / compressed;
  0/1 Adam: full / 1-bit or sync / local); avg: over the run, the first steps' checks included;
  across nodes: info.bytes_inter_node of the same steps (shown for several nodes).
memory/rank: dsopt_memory_usage in the steady state (the caller's parameters and gradients not counted);
  state: dsopt_state_memory_usage. step ms: a steady (compressed) step; avg: over the run's schedule."""

CALLER_NOTE = """caller/rank (--fsdp2): the caller's parameters and gradients on a rank: the whole model's, or under
  FSDP2/HSDP the rank's shards and the largest module's unsharded ones; --memory-limit counts it too."""


def plot(records, path, title=""):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.name for r in records]
    parts = [("compute", "tab:gray"), ("update", "tab:blue"), ("compression", "tab:orange"),
             ("exposed", "tab:red")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 0.32 * len(records) + 1.8), sharey=True)
    left = [0.0] * len(records)
    for attr, color in parts:
        vals = [getattr(r.time, attr) * 1e3 for r in records]
        ax1.barh(names, vals, left=left, color=color, label=attr if attr != "exposed" else "exposed comm")
        left = [a + b for a, b in zip(left, vals)]
    ax1.set_xlabel("predicted step time, ms (steady step)")
    ax1.invert_yaxis()
    ax1.legend(loc="lower right", fontsize=8)
    ax2.barh(names, [r.run_bytes_per_step / 2 ** 20 for r in records], color="tab:green")
    ax2.set_xlabel("bytes sent per rank per step, MiB (run average)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
