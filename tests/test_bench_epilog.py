"""bench/epilog.py's summary and section from a canned run (no cluster)."""

from __future__ import annotations

from bench.epilog import BEGIN, END, section, summary


def canned() -> dict[str, object]:
    def row(margin: str, limit: str, end: float, free: float, start: float) -> dict[str, object]:
        return {"margin": margin, "epilog_margin_s": 35.0 if margin == "on" else 0.0,
                "node": "n02", "limit": limit, "task_end_s": end, "node_free_s": free,
                "prod_start_s": start}
    return {"epilog_s": 5.0, "nodes": 4, "submissions": 3, "pairs": 1, "rounds": 2,
            "prod_start_s": {"with_malletrain": [5.9, 6.1, 5.7], "without": [0.4, 0.6, 0.5]},
            "planned": [row("off", "2:00", -0.6, 4.4, 4.5), row("off", "2:00", 0.1, 5.2, 5.2),
                        row("on", "1:00", -60.4, -55.5, 0.9), row("on", "1:00", -61.0, -56.0, 0.7)],
            "date": "2026-11-27 23:59 UTC", "machine": "a CPU", "load_before": "1.00",
            "command": "python -m bench.epilog"}


def test_summary_medians_and_epilogs_done_in_time() -> None:
    s = summary(canned())
    assert s["with_malletrain"] == {"n": 3, "median": 5.9, "p95": 6.1}
    assert s["without"]["median"] == 0.5
    off, on = s["planned_off"], s["planned_on"]
    assert (off["n"], off["limits"], off["prod_start_s_median"], off["prod_start_max_s"]) == \
        (2, ["2:00"], 4.85, 5.2)
    assert (off["epilog_done_before_start"], on["epilog_done_before_start"]) == (0, 2)
    assert on["epilog_margin_s"] == 35.0 and on["node_free_s_median"] == -55.75


def test_section_names_the_difference_and_the_margin() -> None:
    text = section(canned())
    assert text.startswith(BEGIN) and text.endswith(END)
    assert "workers on the node minus idle node = +5.40 s" in text
    assert "`slurm.epilog_margin_s = 35` (limit 1:00)" in text
    assert "on 0/2 nodes off and 2/2 on" in text
