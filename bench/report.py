"""Machine information, the targets (reported, never asserted) and the printed tables."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any

__all__ = ["evaluate_targets", "fmt_ns", "format_report", "machine_info"]


def machine_info() -> dict[str, Any]:
    """CPU model, cores, load, and the versions that matter for the figures."""
    import cffi
    import numpy

    import scissorhands

    cpu, physical = None, set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            phys = core = None
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and cpu is None:
                    cpu = value
                elif key == "physical id":
                    phys = value
                elif key == "core id":
                    core = value
                elif not key and core is not None:
                    physical.add((phys, core))
                    phys = core = None
            if core is not None:
                physical.add((phys, core))
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover
        load = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__)), timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {
        "cpu_model": cpu or platform.processor() or None,
        "logical_cores": os.cpu_count(),
        "physical_cores": len(physical) or None,
        "usable_cores": usable,
        "load_average": load,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "numpy": numpy.__version__,
        "cffi": cffi.__version__,
        "scissorhands": scissorhands.__version__,
        "git_commit": commit,
        "executable": sys.executable,
    }


# ---------------------------------------------------------------------------- targets


#: The policies whose scores the targets on votes and scores are about.
_HEAVY = ("scissorhands", "h2o")


def _target(text: str, measured: Any, met: bool | None, detail: str = "") -> dict[str, Any]:
    return {"target": text, "measured": measured, "met": met, "detail": detail}


def _call_targets(results: list[dict[str, Any]], by: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The decode step against numpy and the reference, and the call against the no-op."""
    out = []
    d = by.get("decode/scissorhands/512")
    if d is not None:
        v = d["ratios"].get("numpy/c")
        out.append(_target("decode step at budget 512 via the Python API >= 5x faster than numpy",
                           v, None if v is None else v >= 5, "numpy/C"))
        v = d["ratios"].get("reference/c")
        out.append(_target("decode step at budget 512 via the Python API >= 50x faster than the reference",
                           v, None if v is None else v >= 50, "reference/C"))
    small = {r["name"]: r["ratios"].get("c/noop") for r in results
             if r["group"] == "decode" and r["budget"] <= 512 and "c/noop" in r.get("ratios", {})}
    if small:
        out.append(_target("per-call cost at budgets <= 512 within 2x of the no-op cffi call", small,
                           all(v <= 2 for v in small.values()), "C/noop per decode case"))
    raw_small = {r["name"]: r["ratios"].get("c_raw/noop") for r in results
                 if r["group"] == "decode" and r["budget"] <= 512 and "c_raw/noop" in r.get("ratios", {})}
    if raw_small:
        out.append(_target("(the same, for the C call alone: lib.sh_policy_step without the Python API)", raw_small,
                           all(v <= 2 for v in raw_small.values()), "raw C/noop per decode case"))
    return out


def _bandwidth_targets(results: list[dict[str, Any]], by: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The batched and serving shapes against the bandwidth floor and numpy."""
    out = []
    big = {r["name"]: r["ratios"].get("c/bandwidth") for r in results
           if r["group"] == "batch" and r.get("weights", 0) >= 1 << 20 and "c/bandwidth" in r.get("ratios", {})}
    if big:
        out.append(_target("batched calls over >= 1M weights within 2x of the bandwidth floor", big,
                           all(v <= 2 for v in big.values()), "C/bandwidth"))
        raw_big = {r["name"]: round(r["impls"]["c_raw"]["median_ns"] / r["impls"]["bandwidth"]["median_ns"], 3)
                   for r in results if r["name"] in big and r["impls"].get("c_raw") and r["impls"].get("bandwidth")}
        out.append(_target("(the same, for the C call alone)", raw_big,
                           all(v <= 2 for v in raw_big.values()), "raw C/bandwidth"))
    one = {r["name"]: r["ratios"].get("numpy/c") for r in results
           if r["group"] == "serving" and r["heads"] == 1 and r["budget"] == 8192 and r["policy"] in _HEAVY
           and "numpy/c" in r.get("ratios", {})}
    if one:
        out.append(_target("single row at 8192: step with one victim >= 3x faster than the preallocated numpy policy",
                           one, all(v >= 3 for v in one.values()), "numpy/C"))
    wide = {r["name"]: r["ratios"].get("c/bandwidth") for r in results
            if r["group"] == "serving" and r["heads"] == 256 and r["budget"] == 8192 and r["policy"] in _HEAVY
            and "c/bandwidth" in r.get("ratios", {})}
    if wide:
        out.append(_target("256 x 8192 fused step with eviction within 1.3x of the bandwidth floor", wide,
                           all(v <= 1.3 for v in wide.values()), "C/bandwidth"))
        raw_wide = {k: by[k]["ratios"].get("c_raw/bandwidth") for k in wide}
        out.append(_target("(the same, for the C call alone)", raw_wide,
                           all(v is not None and v <= 1.3 for v in raw_wide.values()), "raw C/bandwidth"))
    return out


def _lean_and_thread_targets(results: list[dict[str, Any]], machine: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The heavy-hitter policies' step against the no-op, and two threads against one."""
    out = []
    lean = {r["name"]: r["ratios"].get("c/noop") for r in results
            if r["group"] == "decode" and r["budget"] == 512 and r["policy"] in _HEAVY
            and "c/noop" in r.get("ratios", {})}
    if lean:
        out.append(_target("decode step at budget 512 through the Python API <= 3x the no-op cffi call", lean,
                           all(v <= 3 for v in lean.values()), "C/noop"))
    split = {r["name"]: r["ratios"].get("c/c_threads") for r in results
             if r["group"] == "serving" and r["heads"] == 256 and r["budget"] == 32768 and r["policy"] in _HEAVY
             and "c/c_threads" in r.get("ratios", {})}
    if split:
        m = machine or {}
        out.append(_target("256 x 32768 with 2 threads >= 1.6x faster than with 1 (only meaningful on a quiet "
                           f"machine: {m.get('usable_cores')} usable cores, load {m.get('load_average')} at the start)",
                           split, all(v >= 1.6 for v in split.values()), "1 thread / 2 threads"))
    return out


def _slot_targets(results: list[dict[str, Any]], by: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Evict time per kept slot across budgets, and bytes per slot."""
    out = []
    flat = {}
    for group in ("evict-one", "evict-bulk"):
        for r in results:
            if r["group"] == group and r["budget"] == 8192:
                lo = by.get(f"{group}/{r['policy']}/512")
                if lo and lo.get("c_work_ns_per_slot") and r.get("c_work_ns_per_slot") is not None:
                    flat[r["name"].rsplit("/", 1)[0]] = round(r["c_work_ns_per_slot"] / lo["c_work_ns_per_slot"], 3)
    if flat:
        out.append(_target("evict time per kept slot flat from 512 to 8192 (C work ns/slot, 8192 over 512, <= 1.5)",
                           flat, all(v <= 1.5 for v in flat.values()), "ratio of C work per slot"))
    mem = by.get("memory")
    if mem is not None:
        per = {}
        for row in mem["rows"]:
            per.setdefault(row["policy"], set()).add(row["c_bytes_per_slot"])
        measured = {k: sorted(v) for k, v in per.items()}
        promised = {row["policy"]: row["promised_bytes_per_slot"] for row in mem["rows"]}
        out.append(_target("9 / 13 / 4 bytes per slot (Scissorhands / H2O / StreamingLLM)", measured,
                           all(v == [promised[k]] for k, v in measured.items()), "(memory_bytes - 64) / capacity"))
    return out


def evaluate_targets(results: list[dict[str, Any]], machine: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The design's performance targets, as measured in this run (reported only);
    ``machine`` (:func:`machine_info`) qualifies the thread target."""
    by = {r["name"]: r for r in results}
    return (_call_targets(results, by) + _bandwidth_targets(results, by)
            + _lean_and_thread_targets(results, machine) + _slot_targets(results, by))


# ---------------------------------------------------------------------------- formatting


def fmt_ns(ns: float | None) -> str:
    """A duration in ns, µs or ms with three significant digits."""
    if ns is None:
        return "-"
    a = abs(ns)
    if a < 1e3:
        return f"{ns:.0f} ns"
    if a < 1e6:
        return f"{ns / 1e3:.3g} µs"
    if a < 1e9:
        return f"{ns / 1e6:.3g} ms"
    return f"{ns / 1e9:.3g} s"


def _fmt_ratio(v: float | None) -> str:
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def _stat(r: dict[str, Any], impl: str) -> dict[str, Any] | None:
    return (r.get("impls") or {}).get(impl)


def _med(r: dict[str, Any], impl: str) -> float | None:
    s = _stat(r, impl)
    return None if s is None else s["median_ns"]


def _iqr(r: dict[str, Any], impl: str) -> str:
    s = _stat(r, impl)
    if s is None:
        return "-"
    return f"{fmt_ns(s['q1_ns'])}\u2013{fmt_ns(s['q3_ns'])}"  # an en dash


def _table(headers: list[str], rows: list[list[str]], align: str | None = None) -> list[str]:
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(headers)]
    align = align or "l" + "r" * (len(headers) - 1)

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(cells, widths, align)).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


_SECTIONS: list[tuple[str, str]] = [
    ("decode", "Decode step: step(pos, attn) in the steady state, one victim (single head, float32)"),
    ("evict-one", "Evict in the steady state: evict(budget) with budget + 1 held, one victim"),
    ("evict-bulk", "Evict in bulk: evict(budget - budget // 4) with budget held, a quarter at once"),
]


def _step_rows(results: list[dict[str, Any]], group: str) -> list[list[str]]:
    rows = []
    for r in results:
        if r["group"] != group:
            continue
        q = r.get("ratios", {})
        rows.append([
            r["name"], fmt_ns(_med(r, "c")), _iqr(r, "c"), fmt_ns(_med(r, "c_raw")), fmt_ns(_med(r, "noop")),
            _fmt_ratio(q.get("numpy/c")), _fmt_ratio(q.get("reference/c")), _fmt_ratio(q.get("c/noop")),
            _fmt_ratio(q.get("c_raw/noop")), fmt_ns(r.get("api_overhead_ns")),
            "-" if r.get("c_work_ns_per_slot") is None else f"{r['c_work_ns_per_slot']:.3f}",
            "-" if r.get("c_ns_per_slot") is None else f"{r['c_ns_per_slot']:.3f}",
        ])
    return rows


def _header(report: dict[str, Any]) -> list[str]:
    """The machine, how times are taken and what each column means."""
    m = report["machine"]
    return [
        f"scissorhands bench — {m.get('cpu_model')}, {m.get('usable_cores')} usable cores, "
        f"Python {m.get('python')}, numpy {m.get('numpy')}, cffi {m.get('cffi')}, "
        f"load {m.get('load_average')}{' (--quick)' if report['quick'] else ''}",
        f"Times are per call: the median over up to {report['settings']['repeats']} repeats of "
        f">= {report['settings']['target_ns'] / 1e6:g} ms, implementations interleaved (IQR beside it); ratios "
        f"compare medians. Empty-loop ({report['loop_overhead_ns']:.1f} ns/iter) and timer "
        f"({report['timer_overhead_ns']:.0f} ns) overheads are subtracted.",
        "C = the Python API; raw C = lib.sh_policy_step with the same arguments; noop = lib.sh_noop_step "
        "(the call floor); API-raw = the Python API's own overhead; C work/slot = (raw C - noop) / held slots.",
    ]


def _step_sections(results: list[dict[str, Any]]) -> list[str]:
    """The decode and evict tables."""
    out: list[str] = []
    step_headers = ["case", "C", "C IQR", "raw C", "noop", "numpy/C", "ref/C", "C/noop", "raw/noop", "API-raw",
                    "C work ns/slot", "C ns/slot"]
    for group, title in _SECTIONS:
        rows = _step_rows(results, group)
        if rows:
            out += ["", f"== {title} =="] + _table(step_headers, rows)
    return out


def _batch_section(results: list[dict[str, Any]]) -> list[str]:
    """A layer's heads in one call against separate policies and the bandwidth floor."""
    batch = [r for r in results if r["group"] == "batch"]
    if not batch:
        return []
    rows = []
    for r in batch:
        q = r.get("ratios", {})
        rows.append([
            r["name"], f"{r['weights']:,}", fmt_ns(_med(r, "c")), _iqr(r, "c"), fmt_ns(_med(r, "c_raw")),
            fmt_ns(_med(r, "noop")),
            fmt_ns(_med(r, "separate")), _fmt_ratio(q.get("separate/c")), _fmt_ratio(q.get("numpy/c")),
            _fmt_ratio(q.get("reference/c")), _fmt_ratio(q.get("c/noop")), fmt_ns(_med(r, "bandwidth")),
            _fmt_ratio(q.get("c/bandwidth")),
            "-" if r.get("c_ns_per_slot") is None else f"{r['c_ns_per_slot']:.3f}",
        ])
    out = ["", "== A layer's heads in one call: step(pos, attn[H, n]) vs H single-head policies "
               "(separate); bandwidth = np.add.reduce(attn) + copy of the state bytes =="]
    return out + _table(["case", "weights", "C", "C IQR", "raw C", "noop", "separate", "separate/C", "numpy/C",
                         "ref/C", "C/noop", "bandwidth", "C/bw", "C ns/slot"], rows)


def _serving_section(results: list[dict[str, Any]]) -> list[str]:
    """Serving shapes: a model's rows or one row, one victim per row."""
    serving = [r for r in results if r["group"] == "serving"]
    if not serving:
        return []
    rows = []
    for r in serving:
        q = r.get("ratios", {})
        rows.append([
            r["name"], f"{r['weights']:,}", fmt_ns(_med(r, "c")), _iqr(r, "c"), fmt_ns(_med(r, "c_raw")),
            fmt_ns(_med(r, "numpy")), _fmt_ratio(q.get("numpy/c")), fmt_ns(_med(r, "bandwidth")),
            _fmt_ratio(q.get("c/bandwidth")), _fmt_ratio(q.get("c_raw/bandwidth")),
            fmt_ns(_med(r, "c_threads")), _fmt_ratio(q.get("c/c_threads")),
            "-" if r.get("c_ns_per_slot") is None else f"{r['c_ns_per_slot']:.3f}",
            "yes" if r.get("impls_same_victims") else "NO",
        ])
    out = ["", "== Serving shapes: step(pos, attn) with one victim per row, a model's rows (256 = 32 layers "
               "x 8 KV heads) or one row; bandwidth = np.add.reduce(attn) + one copy of the state; "
               "2 thr = the same API call with threads = 2 =="]
    return out + _table(["case", "weights", "C", "C IQR", "raw C", "numpy", "numpy/C", "bandwidth", "C/bw",
                         "raw/bw", "C 2 thr", "1/2 thr", "C ns/slot", "agree"], rows)


def _replay_section(results: list[dict[str, Any]]) -> list[str]:
    """The decode-4096 replay through the harness: the policy's share of each step."""
    replay = [r for r in results if r["group"] == "replay" and "impls" in r]
    if not replay:
        return []
    rows = []
    for r in replay:
        c = r["impls"]["c"]
        rows.append([
            r["name"], fmt_ns(c["policy_ns_per_step"]["median_ns"]),
            _fmt_ratio(r["ratios"].get("numpy/c")), _fmt_ratio(r["ratios"].get("reference/c")),
            fmt_ns(c["replay_ns_per_step"]["median_ns"]), f"{100 * c['policy_share']:.1f}%",
            f"{c['retained_mass']:.6f}", f"{c['heavy_hitter_recall']:.6f}",
            "yes" if r.get("same_metrics") else "NO",
        ])
    out = ["", "== decode-4096 replay at budget 512 through scissorhands.commands.harness (policy = "
               "on_decode_step + evict, per step; share = policy / whole replay step) =="]
    return out + _table(["case", "C policy/step", "numpy/C", "ref/C", "replay/step", "policy share",
                         "retained mass", "HH recall", "impls agree"], rows)


def _memory_section(results: list[dict[str, Any]]) -> list[str]:
    """Bytes per slot in the steady state, C against the reference and numpy."""
    mem = next((r for r in results if r["group"] == "memory"), None)
    if mem is None:
        return []
    rows = []
    for row in mem["rows"]:
        rows.append([
            row["policy"], str(row["budget"]), str(row["capacity"]), f"{row['c_memory_bytes']:,}",
            f"{row['c_bytes_per_slot']:g}", str(row["promised_bytes_per_slot"]),
            f"{row['c_bytes_per_held_slot']:.3f}",
            f"{row['reference_formula_bytes_per_held_slot']:.3f}" if "reference_memory_bytes" in row else "-",
            f"{row['reference_traced_bytes_per_held_slot']:.1f}" if "reference_traced_bytes" in row else "-",
            f"{row['numpy_traced_bytes_per_held_slot']:.1f}",
        ])
    out = ["", "== Memory in the steady state: memory_bytes() = 64 + capacity x bytes/slot; "
               "traced = what tracemalloc sees Python allocate, per held slot =="]
    return out + _table(["policy", "budget", "capacity", "C bytes", "C B/slot", "promised", "C B/held",
                         "ref formula B/held", "ref traced B/held", "numpy traced B/held"], rows)


def _overhead_section(results: list[dict[str, Any]]) -> list[str]:
    """Where the Python API's time per step goes, piece by piece."""
    ov = next((r for r in results if r["group"] == "overhead"), None)
    if ov is None:
        return []
    out = ["", f"== Where the Python API's time goes (Scissorhands, budget {ov['budget']}): step "
               f"{fmt_ns(ov['step_ns'])}, raw C {fmt_ns(ov['raw_ns'])}, floor {fmt_ns(ov['noop_ns'])}, "
               f"API overhead {fmt_ns(ov['api_overhead_ns'])}; each piece timed alone, interleaved, "
               f"per occurrence =="]
    out += _table(["piece", "ns", "min ns"], [[p["piece"], f"{p['ns']:.1f}", f"{p['min_ns']:.1f}"]
                                               for p in ov["pieces"]])
    calls = ov.get("calls_per_step") or {}
    if calls:
        out += ["calls per step (cProfile): " + ", ".join(f"{k} x{v:g}" for k, v in calls.items())]
    return out


def _targets_section(report: dict[str, Any]) -> list[str]:
    """Each target, met or not (reported, never asserted), then the notes."""
    out: list[str] = []
    if report["targets"]:
        out += ["", "== Targets (reported, never asserted) =="]
        for t in report["targets"]:
            verdict = {True: "MET", False: "NOT MET", None: "n/a"}[t["met"]]
            measured = t["measured"]
            if isinstance(measured, dict):
                measured = ", ".join(f"{k}: {v}" for k, v in measured.items())
            out.append(f"[{verdict:7s}] {t['target']}: {t['detail']} = {measured}")
    if report["notes"]:
        out += ["", "Notes:"] + [f"- {n}" for n in report["notes"]]
    return out


def format_report(report: dict[str, Any]) -> str:
    """The human-readable tables of a report (as built by :func:`bench.cli.run`)."""
    results = report["results"]
    out = _header(report) + _step_sections(results)
    for section in (_batch_section, _serving_section, _replay_section, _memory_section, _overhead_section):
        out += section(results)
    out += _targets_section(report)
    out += ["", f"Total run time {report['elapsed_s']:.1f} s."]
    return "\n".join(out)
