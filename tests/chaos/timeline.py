"""timeline.png: acknowledgements and failures per second, produce latency, and every
partition's acknowledgements over time, with the fault windows shaded (matplotlib)."""

COLORS = {"kill": "#d62728", "pause": "#ff7f0e", "partition": "#1f77b4", "netem": "#9467bd", "clock": "#8c564b",
          "disk": "#e377c2", "power": "#17becf", "degrade": "#bcbd22"}


def render(path, sends, faults, anomalies, t0, t_end, partitions, title, extra=None):
    """extra: {"groups": {"commits": [t], "polls": [t], "churn": [{"t", "what"}]},
    "metadata": {"ops": [(t1, kind, res)]}}: a fourth panel with those, when given."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    span = max(1.0, t_end - t0)
    nbins = int(span) + 1
    ok_per_s = [0] * nbins
    fail_per_s = [0] * nbins
    lat_t, lat_v, lat_c = [], [], []
    ack_t, ack_p = [], []
    fail_t, fail_v = [], []
    for s in sends:
        t1 = s.get("t1")
        if t1 is None:
            continue
        b = min(nbins - 1, max(0, int(t1 - t0)))
        if s.get("ok") is True:
            ok_per_s[b] += 1
            lat_t.append(t1 - t0)
            lat_v.append(max(1e-4, t1 - (s.get("t0") or t1)))
            lat_c.append(s["p"])
            ack_t.append(t1 - t0)
            ack_p.append(s["p"])
        elif s.get("ok") is False:
            fail_per_s[b] += 1
            fail_t.append(t1 - t0)
            fail_v.append(max(1e-4, t1 - (s.get("t0") or t1)))

    extra = {k: v for k, v in (extra or {}).items() if v}
    if extra:
        fig, axes = plt.subplots(4, 1, figsize=(14, 11.5), sharex=True,
                                 gridspec_kw={"height_ratios": [1, 1.3, 1.3, 1]})
        ax1, ax2, ax3, ax4 = axes
        _extra_panel(ax4, extra, t0, nbins)
    else:
        fig, axes = plt.subplots(3, 1, figsize=(14, 9), sharex=True,
                                 gridspec_kw={"height_ratios": [1, 1.3, 1.3]})
        ax1, ax2, ax3 = axes
    xs = list(range(nbins))
    ax1.plot(xs, ok_per_s, color="#2ca02c", lw=1, label="acknowledged / s")
    ax1.plot(xs, fail_per_s, color="#d62728", lw=1, label="failed / s")
    ax1.set_ylabel("sends / s")
    ax1.legend(loc="upper right", fontsize=8)

    if lat_t:
        ax2.scatter(lat_t, lat_v, c=lat_c, cmap="tab10", s=2, vmin=0, vmax=max(9, partitions - 1), linewidths=0)
    if fail_t:
        ax2.scatter(fail_t, fail_v, color="#d62728", marker="x", s=8, linewidths=0.6, label="failed")
        ax2.legend(loc="upper right", fontsize=8)
    ax2.set_yscale("log")
    ax2.set_ylabel("produce latency (s)")

    if ack_t:
        ax3.scatter(ack_t, ack_p, s=1, marker="|", color="#444444", linewidths=0.3)
    lost = anomalies.get("lost", [])
    lt = [a["acked_at"] - t0 for a in lost if "acked_at" in a]
    lp = [a["partition"] for a in lost if "acked_at" in a]
    if lt:
        ax3.scatter(lt, lp, s=30, marker="v", color="#d62728", zorder=5, label=f"lost ({len(lost)})")
        ax3.legend(loc="upper right", fontsize=8)
    ax3.set_yticks(range(partitions))
    ax3.set_ylim(-0.7, partitions - 0.3)
    ax3.set_ylabel("partition: acks")
    axes[-1].set_xlabel("seconds since the workload started")

    for f in faults:
        a = f["start"] - t0
        b = (f["stop"] if f.get("stop") is not None else t_end) - t0
        col = COLORS.get(f["nemesis"], "#7f7f7f")
        for ax in axes:
            ax.axvspan(a, b, color=col, alpha=0.15, lw=0)
        ax1.text(a, 1.0, f"{f['nemesis'][0]}{f['id']}", transform=ax1.get_xaxis_transform(), fontsize=6,
                 va="bottom", color=col)
    handles = [Patch(color=c, alpha=0.3, label=n) for n, c in COLORS.items() if any(f["nemesis"] == n for f in faults)]
    if handles:
        fig.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 0.955), ncol=len(handles), fontsize=8,
                   frameon=False)
    ax1.set_xlim(0, span)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _per_s(ts, t0, nbins):
    out = [0] * nbins
    for t in ts:
        if t is not None:
            out[min(nbins - 1, max(0, int(t - t0)))] += 1
    return out


def _extra_panel(ax, extra, t0, nbins):
    """Metadata operations per second by outcome, the group's commits per second, and the
    group members' departures and returns."""
    xs = list(range(nbins))
    md = extra.get("metadata") or {}
    if md.get("ops"):
        for res, col, label in (("ok", "#2ca02c", "metadata ok / s"), ("fail", "#7f7f7f", "metadata 404/409 / s"),
                                ("info", "#ff7f0e", "metadata indeterminate / s")):
            ys = _per_s([t for t, _, r in md["ops"] if r == res], t0, nbins)
            if any(ys):
                ax.plot(xs, ys, color=col, lw=1, label=label)
    gr = extra.get("groups") or {}
    if gr.get("commits"):
        ax.plot(xs, _per_s(gr["commits"], t0, nbins), color="#1f77b4", lw=1, label="group commits / s")
    marks = {"crash": ("x", "#d62728"), "leave": ("v", "#9467bd"), "rejoin": ("^", "#2ca02c")}
    for what, (m, col) in marks.items():
        ts = [e["t"] - t0 for e in gr.get("churn") or [] if e["what"].startswith(what)]
        if ts:
            ax.scatter(ts, [0] * len(ts), marker=m, color=col, s=30, zorder=5, label=f"member {what}")
    ax.set_ylabel("admin ops, group")
    ax.legend(loc="upper right", fontsize=7, ncol=2)
