"""The report of :mod:`bench.gpu`: its BENCHMARKS.md section, from the JSON a run printed.

Pure formatting (no torch, no process): ``python -m bench.gpu --from-json FILE --markdown
BENCHMARKS.md`` rewrites the section from a saved run.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

BEGIN, END = "<!-- gpu:begin -->", "<!-- gpu:end -->"
HEADING = "GPU: the in-place path on NCCL"


def _s(cell: Any, digits: int = 3) -> str:
    """A spread (median, min-max) in seconds, or what stood in for it."""
    if not isinstance(cell, dict):
        return "–"
    if "skipped" in cell or "error" in cell:
        return cell.get("skipped") or f"failed: {cell['error']}"
    if cell.get("median") is None:
        return "–"
    if cell["min"] == cell["max"]:
        return f"{cell['median']:.{digits}f} s"
    return f"{cell['median']:.{digits}f} s ({cell['min']:.{digits}f}–{cell['max']:.{digits}f})"


def _why(part: Any) -> str | None:
    if not isinstance(part, dict):
        return "not run"
    if "skipped" in part:
        return str(part["skipped"])
    if "error" in part:
        return f"failed: {part['error']}"
    return None


def stale_rows(r: dict[str, Any]) -> list[str]:
    rows = []
    for world in (1, 2):
        part: Any = r.get(f"stale/world{world}")
        why = _why(part)
        if why or not part.get("observable", False):
            rows.append(f"| world {world} | {why or part.get('why', 'not observable')} | | |")
            continue
        for way, how in (("fixed", "future done → `work.wait()` → read (now)"),
                         ("naive", "future done → `value()` → read")):
            c = part[way]
            rows.append(f"| world {world}, {how} | {c['stale_reads']} of {c['trials']} | "
                        f"{c['early']} of {c['trials']} | {c['wrong_final']} |")
    return rows


def section(r: dict[str, Any], command: str) -> str:
    """The BENCHMARKS.md section for one run (``r`` as ``--json`` printed it)."""
    date = r.get("date") or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if "skipped" in r:
        return "\n".join([BEGIN, f"Not measured ({date}, `{command}`): {r['skipped']}.", END])
    lines = [BEGIN, f"Measured {date} on {r.get('machine', 'unknown')}, with `{command}`"
             f"{' (CPU/gloo check: no GPU figure)' if r.get('backend') == 'gloo' else ''}.", ""]
    size = next((p["bytes"] for p in (r.get("stale/world1"), r.get("stale/world2"))
                 if isinstance(p, dict) and "bytes" in p), None)
    lines += [f"Stale reads: an async all-reduce{f' of {size / 2**20:g} MiB' if size else ''}, "
              "then a host read of its last element (`inplace._Pending.wait`, each way in "
              "alternate trials):", "",
              "| how the result is read | stale reads | read before the work ended | wrong "
              "after a full sync |", "|---|---|---|---|", *stale_rows(r), ""]
    lines += ["| what | world 1 | world 2 |", "|---|---|---|"]

    def both(part: str, kind: str | None, key: str) -> str:
        cells = []
        for world in (1, 2):
            p: Any = r.get(f"{part}/world{world}")
            why = _why(p)
            if why:
                cells.append(why)
                continue
            cells.append(_s((p[kind] if kind else p).get(key)))
        return " | ".join(cells)

    lines += [
        f"| eager communicator (`device_id`): init | {both('communicator', 'eager', 'init_s')} |",
        f"| eager: first all-reduce | {both('communicator', 'eager', 'first_allreduce_s')} |",
        f"| lazy communicator: init | {both('communicator', 'lazy', 'init_s')} |",
        f"| lazy: first all-reduce | {both('communicator', 'lazy', 'first_allreduce_s')} |",
        f"| re-form: destroy the group | {both('reform', None, 'destroy_s')} |",
        f"| re-form: init a new one (eager) | {both('reform', None, 'init_s')} |",
        f"| re-form: its first all-reduce | {both('reform', None, 'first_allreduce_s')} |",
        f"| re-form pause (all three) | {both('reform', None, 'pause_s')} |",
        f"| abandon: let the group go (abort on NCCL) | {both('reform', None, 'let_go_s')} |",
        f"| abandon: let go + new group + all-reduce | "
        f"{both('reform', None, 'abandon_reform_s')} |",
        f"| **beside**: new group + all-reduce, the old one shut down in a thread | "
        f"{both('reform', None, 'side_pause_s')} |",
        f"| beside: the old group's shut-down, in its thread | "
        f"{both('reform', None, 'side_teardown_s')} |",
        f"| beside: all-reduces on the new group during it | "
        f"{both('reform', None, 'side_overlap_ops').replace(' s', '')} |",
        f"| **beside, abandon**: new group + all-reduce, the abort in a thread (NCCL) | "
        f"{both('reform', None, 'bg_abandon_pause_s')} |",
        f"| beside, abandon: the abort, in its thread (NCCL) | "
        f"{both('reform', None, 'bg_abort_s')} |", ""]
    el: Any = r.get("elastic/world1")
    why = _why(el)
    if why:
        lines += [f"`inplace.Elastic` driven by membership files: {why}.", ""]
    else:
        lines += ["`inplace.Elastic` at world 1, driven by membership files as the launcher "
                  f"does: process start → ready {el['ready_s']:.1f} s, membership → first step "
                  f"{el['first_step_after_membership_s']:.2f} s; planned re-form: pause "
                  f"{_s(el['planned']['pause_s'])}, Elastic's reform_s "
                  f"{_s(el['planned']['reform_s'])}; abandon re-form: pause "
                  f"{_s(el['abandon']['pause_s'])}, reform_s {_s(el['abandon']['reform_s'])} "
                  f"(a step every {el['planned']['step_interval_s'] or 0:.3f} s, "
                  + (f"epochs of at least {el['min_epoch_s']:g} s" if el.get("min_epoch_s")
                     else "epochs back to back: a re-form may wait for the last group's "
                     "let-go") + "). The old "
                  f"group, let go in a thread: shut-down {_s(el.get('let_go_shutdown_s'))}, "
                  f"abort {_s(el.get('let_go_abort_s'))}.", ""]
        for kind in ("planned", "abandon"):
            ph = el[kind].get("phases") or {}
            if any((v or {}).get("median") is not None for v in ph.values()):
                article = "an" if kind == "abandon" else "a"
                lines += [f"Where {article} {kind} re-form's reform_s goes: " + "; ".join(
                    f"{name} {_s(ph.get(key))}" for name, key in (
                        ("waiting for the last group's let-go", "wait_retiring_s"),
                        ("meeting at the store", "store_s"),
                        ("store and group init", "form_s"),
                        ("hand-over", "hand_over_s"))) + ".", ""]
    lk: Any = r.get("leak")
    why = _why(lk)
    if why:
        lines += [f"Leak check: {why}.", ""]
    else:
        fp = lk.get("footprint") or {}
        grew = "; ".join(f"{k} {v['from']:g} → {v['to']:g}" for k, v in fp.items()
                         if isinstance(v, dict))
        lines += [f"Leak check, {fp.get('to_epoch', '?')} planned re-forms of one Elastic "
                  f"process, from epoch {fp.get('from_epoch', '?')} to the last: {grew} "
                  f"({'GROWTH' if lk.get('leaked') else 'no growth'}); planned pause "
                  f"{_s(lk['planned']['pause_s'])}, back to back (two steps apart), so each "
                  "re-form first waits for the last group's let-go"
                  + (f": waiting {_s(lk['planned']['phases'].get('wait_retiring_s'))}"
                     if lk["planned"].get("phases") else "") + ".", ""]
        if lk.get("rss_mb_by_epoch"):
            lines += ["Resident memory (MB) at the first step of every 20th epoch: " + ", ".join(
                f"{e}: {v:g}" for e, v in lk["rss_mb_by_epoch"].items()) + ".", ""]
    j: Any = r.get("joiner")
    why = _why(j)
    if why:
        lines += [f"Joiner start-up: {why}.", ""]
    else:
        parts = [("interpreter", "interpreter_s"), ("`import torch`", "import_torch_s"),
                 ("first CUDA context", "cuda_context_s"),
                 ("model (the NAS example's module and a cell)", "model_s"),
                 ("`import torch._dynamo` (the first optimizer's import)", "dynamo_import_s"),
                 ("first optimizer, the rest", "optimizer_s"), ("first step", "first_step_s"),
                 ("second step", "second_step_s"), ("start → ready (optimizer built)",
                                                     "ready_s")]
        lines += ["Joiner start-up, a fresh process: "
                  + "; ".join(f"{name} {_s(j.get(key))}" for name, key in parts) + ".", ""]
        d = j.get("deferred")
        if isinstance(d, dict):
            loaded = (d.get("dynamo_loaded") or {}).get("max")
            lines += ["The same as a MalleTrain training process starts "
                      "(`worker.startup.defer_dynamo`, no `import torch._dynamo`): the "
                      f"deferral {_s(d.get('defer_s'))}, first optimizer "
                      f"{_s(d.get('optimizer_s'))}, first step {_s(d.get('first_step_s'))}; "
                      f"**start → ready {_s(d.get('ready_s'))}**, start → second step "
                      f"{_s(d.get('total_s'))}"
                      f"{' (torch._dynamo was imported after all)' if loaded else ''}.", ""]
    ex: Any = r.get("examples")
    why = _why(ex)
    if why:
        lines += [f"Examples: {why}.", ""]
    else:
        lines += ["| example (world 1, alone) | step (median after 10) | first step | exit |",
                  "|---|---|---|---|"]
        for key, v in ex.items():
            if "skipped" in v:
                lines.append(f"| {key} | {v['skipped']} | | |")
            elif key.startswith("byo/"):
                lines.append(f"| {key} | ran {v['wall_s']:.0f} s | | {v['exit_code']} |")
            else:
                step = f"{v['step_s'] * 1000:.1f} ms" if v.get("step_s") is not None else "–"
                first = (f"{v['first_interval_s']:.2f} s" if v.get("first_interval_s")
                         is not None else "–")
                lines.append(f"| {key} | {step} | {first} | {v['exit_code']} |")
        lines.append("")
    if r.get("failed"):
        lines += [f"Failed parts: {', '.join(r['failed'])}.", ""]
    lines.append(END)
    return "\n".join(lines)
