"""Rendering: an optimize result as console lines."""

from __future__ import annotations


def row_notes(p: dict) -> str:
    """What a problem's row adds to its outcome: why each unit with a campaign stayed PyTorch, and a tolerance
    other than the default (the CLI's table and bench_optimize's page)."""
    by_reason: dict[str, list[str]] = {}
    for u, why in (p.get("kept") or {}).items():
        by_reason.setdefault(why, []).append(u)
    # equal blocks share one winner, hence one reason: said once (BERT's twelve attention blocks filled a cell)
    out = "".join(f"; {us[0] if len(us) == 1 else f'{len(us)} subgraphs'}: {why}" for why, us in by_reason.items())
    if p.get("tolerance"):
        out += f"; judged at atol {p['tolerance'][0]:g}, rtol {p['tolerance'][1]:g}"
    return out


def print_result(r: dict) -> None:
    """The optimize report as tables (``kernellab optimize`` without ``--json``)."""
    from rich.table import Table

    from kernellab.views import console

    pct = lambda v: "-" if v is None else f"{v:.1%}"  # noqa: E731
    t = Table(title=f"{r['name']}: {len(r['problems'])} problem(s) from {len(r['units'])} subgraph(s), "
                    f"{r['candidates_spent']}/{r['budget']} candidates")
    for col in ("subgraphs", "share before", "share after", "winner", "vs eager", "lineage", "outcome"):
        t.add_column(col, overflow="fold")
    for p in r["problems"]:
        w = p.get("winner")
        vs = "-" if not w or w["speedup_eager"] is None else f"{w['speedup_eager']:.2f}x"
        lineage = " > ".join(step["action"] for step in w["lineage"]) if w else "-"
        state = "kernel" if p["patched"] else "PyTorch"
        t.add_row(", ".join(p["units"]), pct(p["share"]), pct(p["share_after"]) if p["patched"] else "-",
                  w["candidate"][:12] if w else "-", vs, lineage, f"{state}; {p['outcome']}{row_notes(p)}")
    console.print(t)
    if "patched_share" in r:
        carried = ("what our kernels carry is not measured on the interpreter" if r["covered_share"] is None else
                   f"our kernels carry {r['covered_share']:.1%} (each winner's own-kernel share of its time)")
        console.print(f"{r['patched_share']:.1%} of the model's time runs a winner; {carried}")
    for s in r["skipped"]:
        console.print(f"{s['unit']}: PyTorch ({s['reason']})")
    c = r.get("check")
    if c:
        console.print(f"end-to-end check ({c['mode']} mode, {c['trials']} fresh inputs, atol {c['atol']:g} rtol "
                      f"{c['rtol']:g}): {'passed' if c['ok'] else 'FAILED'}, max abs err {c['max_abs_err']:.3g}"
                      + (f"; {c['note']}" if c.get("note") else ""))
    else:
        console.print("end-to-end check: nothing patched")
    tm = r.get("timing")
    if tm:
        line = "  ".join(f"{k} {tm[k]['median_ms']:.4g} ms" for k in ("eager", "patched", "compile") if k in tm)
        console.print(f"end to end on {tm['device']}: {line}")
        if tm["interpreted"]:
            console.print(tm["note"])
        else:
            console.print(f"patched vs eager {tm['speedup_vs_eager']:.2f}x, vs torch.compile "
                          f"{tm['speedup_vs_compile']:.2f}x")
