"""The demo summary from canned squeue/sinfo samples, scontrol records and counter files."""

from __future__ import annotations

import json
import time

import pytest

from devtools.demo import summary, timeline

NODES = 4
SINFO_UP = "\n".join(f"n0{i}|idle" for i in range(1, 5))

# t=0: prod on n01; elastic job 10 runs on n02, n03; n04 idle.
SQ0 = """5|5|N/A|prod|RUNNING|n01
10_0|10|0|preemptable|RUNNING|n02
10_1|10|1|preemptable|RUNNING|n03
10_[2]|10|N/A|preemptable|PENDING|"""
# t=2: job 10 grows to n04 (a rescale); a prod job waits.
SQ1 = """5|5|N/A|prod|RUNNING|n01
7|7|N/A|prod|PENDING|
10_0|10|0|preemptable|RUNNING|n02
10_1|10|1|preemptable|RUNNING|n03
10_2|10|2|preemptable|RUNNING|n04"""
# t=6: prod job 7 took n03 and n04 back (two preemptions, job 10 shrinks to 1: a rescale);
# n01 is down.
SQ2 = """7|7|N/A|prod|RUNNING|n[03-04]
10_0|10|0|preemptable|RUNNING|n02
10_1|10|1|preemptable|PENDING|
10_2|10|2|preemptable|PENDING|"""
SINFO_DOWN = "n01|down*\nn02|allocated\nn03|allocated\nn04|allocated"
# t=10: everything ended.
SQ3 = ""


def stamp(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


T0 = 1_800_000_000.0


def record(job, name, nodes, submit, start, end, state="COMPLETED", eligible=None):
    return (f"JobId={job} JobName={name} UserId=root(0) JobState={state} Reason=None "
            f"Restarts=0 SubmitTime={stamp(T0 + submit)} "
            f"EligibleTime={stamp(T0 + (submit if eligible is None else eligible))} "
            f"AccrueTime=Unknown StartTime={stamp(T0 + start)} EndTime={stamp(T0 + end)} "
            f"Partition=prod AllocNode:Sid=localhost:1 ReqNodeList={nodes} NodeList={nodes} "
            f"NumNodes=2 Command=(null) WorkDir=/tmp Comment=a b c")


@pytest.fixture
def samples():
    return [summary.Sample.parse(T0, SQ0, SINFO_UP), summary.Sample.parse(T0 + 2, SQ1, SINFO_UP),
            summary.Sample.parse(T0 + 6, SQ2, SINFO_DOWN),
            summary.Sample.parse(T0 + 10, SQ3, SINFO_UP)]


def test_samples_classify_nodes(samples):
    s0, s1, s2, _ = samples
    assert s0.prod == {"n01"} and s0.harvested == {"n02": "10", "n03": "10"}
    assert s0.jobs == {"10": 2} and s0.pending_prod == 0
    assert s1.pending_prod == 1 and s1.jobs == {"10": 3}
    assert s2.prod == {"n03", "n04"} and s2.down == {"n01"} and s2.jobs == {"10": 1}


def test_node_seconds_and_scale_changes(samples):
    idle, harvested = summary.node_seconds(samples, NODES)
    # idle: 3 nodes × 2 s + 3 × 4 s + (4 - 3 prod/down) × 4 s
    assert idle == pytest.approx(3 * 2 + 3 * 4 + 1 * 4)
    assert harvested == pytest.approx(2 * 2 + 3 * 4 + 1 * 4)
    assert summary.scale_changes(samples) == (2, 2)
    # one queued elastic job: at most cap nodes of the idle ones could be held
    assert summary.idle_within_cap(samples, NODES, 1) == pytest.approx(1 * 2 + 1 * 4 + 1 * 4)
    assert summary.idle_within_cap(samples, NODES, 2) == pytest.approx(2 * 2 + 2 * 4 + 1 * 4)


def test_prod_start_delay_measures_from_the_release_of_the_last_node():
    records = "\n".join([
        record(5, "prod-fill-000", "n01", 0, 0, 8),
        record(6, "prod-fill-001", "n02", 0, 1, 4),
        # big job 7: submitted at 2, n02 free at 4, n01 at 8: startable at 8, started at 11
        record(7, "prod-big-002", "n[01-02]", 2, 11, 20),
        # fill 8 on an idle node: submitted at 5, eligible at 5, started at 6
        record(8, "prod-fill-003", "n03", 5, 6, 30, state="RUNNING"),
        # still pending: planned start only, not counted
        record(9, "prod-big-004", "n[03-04]", 9, 30, 90, state="PENDING"),
    ])
    elastic = ("JobId=12 ArrayJobId=10 ArrayTaskId=0 JobName=nas JobState=RUNNING "
               f"StartTime={stamp(T0)} EndTime={stamp(T0 + 99)} Partition=preemptable "
               "NodeList=n04")
    recs = summary.prod_records(records + "\n" + elastic)
    assert [r["JobId"] for r in recs] == ["5", "6", "7", "8", "9"]
    starts = {p.name: p.delay_s for p in summary.prod_starts(recs)}
    assert starts == {"prod-fill-000": 0, "prod-fill-001": 1, "prod-big-002": 3,
                      "prod-fill-003": 1}


def test_counters_and_the_whole_summary(samples, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "counters.json").write_text(json.dumps(
        {"job": "10", "samples": 480, "steps": 20, "restarts": 2, "world_sizes": [2, 3, 1],
         "cell": "ops=maxpool3x3"}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "counters.json").write_text('{"job": "11", "samp')  # torn: skipped
    counters = summary.read_counters(sorted(tmp_path.glob("*/counters.json")))
    assert list(counters) == ["10"]
    recs = summary.prod_records(record(7, "prod-big-002", "n[03-04]", 2, 5, 9))
    out = summary.summarize(samples, recs, counters, NODES, cap_per_job=2)
    assert list(out)[:len(summary.KEYS)] == list(summary.KEYS)
    assert out["samples"] == 480 and out["rescales"] == 2 and out["preemptions"] == 2
    assert out["harvested_share"] == pytest.approx(20 / 22, abs=1e-4)
    assert out["prod_start_delay_s"] == 3.0 and out["prod_jobs_started"] == 1
    assert out["jobs"]["10"]["max_running_tasks"] == 3 and out["worker_restarts"] == 2
    assert out["idle_node_seconds_within_cap"] == 16.0
    logged = summary.summarize(samples, recs, counters, NODES, logged_preemptions=5)
    assert logged["preemptions"] == 5 and logged["preemptions_seen_in_samples"] == 2
    table = summary.markdown(out, "bash scripts/demo.sh")
    assert "| samples trained (workers' counters) | 480 |" in table
    assert "| preemptions (slurmctld log) | 2 |" in table
    text = summary.format_summary(out)
    assert "90.9 % of idle" in text and "job 10: 480 samples" in text
    again = [summary.Sample.from_json(json.loads(json.dumps(s.to_json()))) for s in samples]
    assert again == samples


def test_no_prod_job_and_no_idle_time():
    s = [summary.Sample.parse(T0, "5|5|N/A|prod|RUNNING|n[01-04]"),
         summary.Sample.parse(T0 + 2, "5|5|N/A|prod|COMPLETING|n[01-04]")]
    out = summary.summarize(s, [], {}, NODES)
    assert out["idle_node_seconds"] == 0 and out["harvested_share"] == 0.0
    assert out["prod_start_delay_s"] is None and out["samples"] == 0
    assert "n/a" in summary.format_summary(out)


def test_preemptions_logged_by_slurmctld():
    log = ("[2026-11-21T10:00:01.000] _preempt_jobs: preempted JobId=12 has been requeued to "
           "reclaim resources for JobId=7\n[2026-11-21T10:00:02.000] sched: Allocate JobId=7")
    assert summary.count_preemptions_in_log(log) == 1


def test_timeline_png(samples, tmp_path):
    path = timeline.draw(samples, NODES, tmp_path / "timeline.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    with pytest.raises(ValueError):
        timeline.draw([], NODES, tmp_path / "empty.png")


def test_live_view_plain_and_terminal(samples):
    import io

    from devtools.demo import live

    plain = io.StringIO()
    view = live.LiveView([f"n0{i}" for i in range(1, 5)], out=plain, tty=False)
    view.show(2.0, samples[1], 1, 0)
    view.show(6.0, samples[2], 2, 2)
    lines = plain.getvalue().splitlines()
    assert len(lines) == 2 and "\x1b" not in plain.getvalue()
    assert "prod  1  idle  3  harvested  3" in lines[0] and "a=10:3" in lines[0]
    assert "preemptions 2" in lines[1] and "a=10:1" in lines[1]
    term = io.StringIO()
    view = live.LiveView([f"n0{i}" for i in range(1, 5)], out=term, tty=True)
    assert view.strip(samples[0]) == "Paa." and view.strip(samples[2]) == "xaPP"
    view.show(0.0, samples[0], 0, 0)
    view.show(2.0, samples[1], 1, 0)
    assert "\x1b[3F" in term.getvalue()  # redrawn in place


def write_steps(folder, node, spans, torn=False):
    (folder / "steps").mkdir(parents=True, exist_ok=True)
    text = "".join(f"{T0 + a:.3f} {T0 + b:.3f}\n" for a, b in spans)
    (folder / "steps" / f"{node}.log").write_text(text + ("1800000001.5 18000" if torn else ""))


def test_harvest_counts_only_time_inside_completed_steps(samples, tmp_path):
    job = tmp_path / "checkpoints-10"
    # n02 trains from 0.5 s to 9.5 s in 0.5 s steps (a few ms of bookkeeping between them)
    write_steps(job, "n02", [(0.5 + 0.5 * i, 0.995 + 0.5 * i) for i in range(18)], torn=True)
    # n03 trains 1-3 s, pauses 2 s (a re-form: not counted), trains 5-8 s; prod takes it at 6 s
    write_steps(job, "n03", [(1 + 0.5 * i, 1.5 + 0.5 * i) for i in range(4)]
                + [(5 + 0.5 * i, 5.5 + 0.5 * i) for i in range(6)])
    # n04 held an elastic task from 2 s to 6 s (squeue) but never completed a step: nothing
    steps = summary.read_step_logs(sorted(tmp_path.glob("checkpoints-*/steps/*.log")))
    assert sorted(steps) == ["n02", "n03"] and len(steps["n02"]) == 18  # torn line skipped
    assert summary.training_stretches(steps["n03"]) == [(T0 + 1, T0 + 3), (T0 + 5, T0 + 8)]
    assert summary.stepping_node_seconds(samples, steps) == pytest.approx(9.0 + 2.0 + 1.0,
                                                                          abs=0.01)
    out = summary.summarize(samples, [], {}, NODES, steps=steps)
    assert out["idle_node_seconds"] == 22.0 and out["held_node_seconds"] == 20.0
    assert out["harvested_node_seconds"] == pytest.approx(12.0, abs=0.1)
    assert out["harvested_share"] == pytest.approx(12 / 22, abs=1e-3)
    assert out["harvest_counted_from"].startswith("workers' step logs")
    assert (out["idle_not_held_node_seconds"], out["held_not_training_node_seconds"]) == (
        2.0, pytest.approx(8.0, abs=0.1))  # idle = harvested + both
    assert "where the rest went    2 node-seconds idle" in summary.format_summary(out)
    # a node in prod work or down counts nothing, whatever its log says
    write_steps(job, "n01", [(0.0, 10.0)])
    steps = summary.read_step_logs(sorted(tmp_path.glob("checkpoints-*/steps/*.log")))
    assert summary.stepping_node_seconds(samples, steps) == pytest.approx(12.0, abs=0.01)
    # without step logs the held node-seconds are what is counted, and said so
    held = summary.summarize(samples, [], {}, NODES)
    assert held["harvested_node_seconds"] == 20.0
    assert held["harvest_counted_from"].startswith("squeue")


def log_stamp(t):
    return f"[{stamp(T0 + t)}.{round((t % 1) * 1000):03d}]"


SLURMCTLD_LOG = "\n".join([
    f"{log_stamp(-10)} sched: Allocate JobId=5 NodeList=n01 #CPUs=2 Partition=prod",
    f"{log_stamp(-9)} sched: Allocate JobId=9 NodeList=n02 #CPUs=2 Partition=preemptable",
    f"{log_stamp(1.5)} _job_complete: JobId=5 WEXITSTATUS 0",
    f"{log_stamp(1.5)} _job_complete: JobId=5 done",
    f"{log_stamp(5.2)} sched/backfill: _start_job: Started JobId=7 in prod on n[03-04]",
    f"{log_stamp(5.3)} sched/backfill: _start_job: Started JobId=10_1(12) in preemptable on n02",
    "a line of another shape",
])


def test_exact_idle_time_from_slurmctlds_log(samples, tmp_path):
    busy = summary.prod_busy_from_log(SLURMCTLD_LOG)
    assert busy == {"n01": [(pytest.approx(T0 - 10), pytest.approx(T0 + 1.5))],
                    "n03": [(pytest.approx(T0 + 5.2), float("inf"))],
                    "n04": [(pytest.approx(T0 + 5.2), float("inf"))]}
    job = tmp_path / "checkpoints-10"
    write_steps(job, "n02", [(0.5 + 0.5 * i, 0.995 + 0.5 * i) for i in range(18)])
    write_steps(job, "n03", [(1 + 0.5 * i, 1.5 + 0.5 * i) for i in range(4)]
                + [(5 + 0.5 * i, 5.5 + 0.5 * i) for i in range(6)])
    steps = summary.read_step_logs(sorted(tmp_path.glob("checkpoints-*/steps/*.log")))
    names = ["n01", "n02", "n03", "n04"]
    # n01 is free from 1.5 s (the samples show its job at 0 s and 2 s: no idle time before
    # 6 s) until it is down at the 6 s sample: 4.5; n02 free
    # throughout: 10; n03 and n04 until prod takes them at 5.2 s: 5.2 each
    idle, harvested = summary.exact_node_seconds(samples, names, busy, steps)
    assert idle == pytest.approx(4.5 + 10 + 5.2 + 5.2, abs=1e-3)
    # n02's one stretch 0.5-9.495 s; n03's stretches 1-3 s and 5-8 s up to 5.2 s
    assert harvested == pytest.approx(8.995 + 2.0 + 0.2, abs=1e-3)
    out = summary.summarize(samples, [], {}, NODES, steps=steps, prod_busy=busy,
                            node_names=names)
    assert out["idle_node_seconds"] == pytest.approx(24.9, abs=0.05)
    assert out["harvested_share"] == pytest.approx(11.195 / 24.9, abs=1e-3)
    assert out["idle_counted_from"].startswith("slurmctld.log")
    assert out["idle_node_seconds_sampled"] == 22.0  # the samples' view stays beside it
    # no prod line in the log (or no log): the samples are all there is, and it says so
    fallback = summary.summarize(samples, [], {}, NODES, steps=steps,
                                 prod_busy=summary.prod_busy_from_log("nothing"),
                                 node_names=names)
    assert fallback["idle_node_seconds"] == 22.0
    assert "idle_node_seconds_sampled" not in fallback
    assert fallback["idle_counted_from"] == "squeue every 4 s"  # the samples' median interval


def test_prod_start_delay_to_the_millisecond_from_slurmctlds_log():
    """Slurm's records give whole seconds (job 6: submitted at 0.3, started at 1.1 reads as a
    1 s delay); the log gives submission, start and end to the millisecond. A begin time
    later than the submission still counts (job 10), and a job the log lacks keeps its
    record's times (job 11)."""
    recs = summary.prod_records("\n".join([
        record(5, "prod-fill-000", "n01", 0, 0, 8),
        record(6, "prod-fill-001", "n02", 0, 1, 4),
        record(7, "prod-big-002", "n[01-02]", 2, 11, 20),
        record(10, "prod-fill-005", "n04", 3, 12, 40, eligible=10),
        record(11, "prod-fill-006", "n05", 3, 5, 40),
    ]))
    log = "\n".join([
        f"{log_stamp(0.2)} _slurm_rpc_submit_batch_job: JobId=5 InitPrio=4294901759 usec=1",
        f"{log_stamp(0.25)} sched: Allocate JobId=5 NodeList=n01 #CPUs=2 Partition=prod",
        f"{log_stamp(0.3)} _slurm_rpc_submit_batch_job: JobId=6 InitPrio=4294901758 usec=1",
        f"{log_stamp(1.1)} sched: Allocate JobId=6 NodeList=n02 #CPUs=2 Partition=prod",
        f"{log_stamp(2.1)} _slurm_rpc_submit_batch_job: JobId=7 InitPrio=4294901757 usec=1",
        f"{log_stamp(3.2)} _slurm_rpc_submit_batch_job: JobId=10 InitPrio=4294901756 usec=1",
        f"{log_stamp(4.6)} _job_complete: JobId=6 done",
        f"{log_stamp(8.4)} _job_complete: JobId=5 done",
        f"{log_stamp(11.3)} sched/backfill: _start_job: Started JobId=7 in prod on n[01-02]",
        f"{log_stamp(12.4)} sched: Allocate JobId=10 NodeList=n04 #CPUs=2 Partition=prod",
    ])
    coarse = {p.name: p.delay_s for p in summary.prod_starts(recs)}
    assert coarse == {"prod-fill-000": 0, "prod-fill-001": 1, "prod-big-002": 3,
                      "prod-fill-005": 2, "prod-fill-006": 2}
    fine = {p.name: p.delay_s for p in summary.prod_starts(recs, log)}
    assert fine == {"prod-fill-000": pytest.approx(0.05), "prod-fill-001": pytest.approx(0.8),
                    "prod-big-002": pytest.approx(11.3 - 8.4),  # n01 released at 8.4
                    "prod-fill-005": pytest.approx(2.4), "prod-fill-006": 2}
    first = recs[:3]  # delays 0.05, 0.8, 2.9 s; 0, 1, 3 s on the records alone
    out = summary.summarize([], first, {}, NODES, prod_log=log)
    assert out["prod_start_delay_s"] == pytest.approx(0.8)
    assert out["prod_start_delay_counted_from"].startswith("slurmctld.log")
    assert summary.summarize([], first, {}, NODES)["prod_start_delay_s"] == 1


def test_step_logs_read_as_they_were(tmp_path):
    write_steps(tmp_path, "n02", [(0.0, 0.5), (0.5, 1.0), (1.0, 1.5)])
    paths = list(tmp_path.glob("steps/*.log"))
    assert len(summary.read_step_logs(paths)["n02"]) == 3
    assert summary.read_step_logs(paths, until=T0 + 1.0)["n02"] == [(T0, T0 + 0.5),
                                                                    (T0 + 0.5, T0 + 1.0)]


def test_worker_start_ups_are_read_from_the_tasks_output(tmp_path):
    line = ("standin: node n{n:02d} first step {t:.2f} s after the task started: launcher "
            "{a:.2f} s, torch and model {b:.2f} s, ready to placed and formed {c:.2f} s "
            "(re-form 0.01 s)\n")
    (tmp_path / "nas-17_0.out").write_text(
        "malletrain-run: training process started ahead of its epoch\n"
        + line.format(n=1, t=1.2, a=0.1, b=0.9, c=0.2) + line.format(n=2, t=3.0, a=0.2, b=2.5,
                                                                     c=0.3))
    (tmp_path / "nas-17_1.out").write_text(line.format(n=3, t=2.0, a=0.1, b=1.7, c=0.2)
                                           + "standin: node n04 first step 1.0 s after")
    got = summary.read_startups(sorted(tmp_path.glob("nas-*.out")) + [tmp_path / "gone.out"])
    assert [s["total"] for s in got] == [1.2, 3.0, 2.0]  # the cut line is skipped
    st = summary.startup_summary(got)
    assert st == {"count": 3, "median_s": 2.0, "p90_s": 3.0,
                  "parts_median_s": {"launcher": 0.1, "torch_and_model": 1.7,
                                     "placed_and_formed": 0.2}}
    assert summary.startup_summary([]) == {"count": 0}
    text = summary.format_summary({**summary.summarize([], [], {}, 4), "startups": st})
    assert "worker start-ups       3, task start → first step median 2.00 s" in text
    assert "torch import and model 1.70 s" in summary.markdown(
        {**summary.summarize([], [], {}, 4), "startups": st}, "make demo")


def test_idle_breakdown_cuts_each_idle_stretch_and_adds_up_to_the_idle_total() -> None:
    samples = [summary.Sample(0.0, frozenset(), {}), summary.Sample(100.0, frozenset(), {})]
    prod = {"n1": [(0.0, 10.0), (60.0, 100.0)], "n2": [(0.0, 90.0)], "n3": [(0.0, 80.0)]}
    starts = {"n1": [10.5], "n3": [81.0]}  # n2's stretch got no task; n3's never trained
    steps = {"n1": [(12.0, 20.0), (20.1, 30.0), (31.0, 50.0)]}  # 0.1 s apart: one stretch
    got = summary.idle_breakdown(samples, ["n1", "n2", "n3"], prod, starts, steps)
    assert got == {"harvested": 37.0, "start_up": 1.5, "start_never_reached_a_step": 19.0,
                   "grant": 1.5, "no_task_granted": 10.0, "between_steps": 1.0,
                   "last_step_to_prod": 10.0}
    idle, harvested = summary.exact_node_seconds(samples, ["n1", "n2", "n3"], prod, steps)
    assert sum(got.values()) == idle == 80.0 and got["harvested"] == harvested


def test_elastic_starts_reads_both_schedulers_and_array_tasks() -> None:
    log = ("[2026-11-28T13:22:32.504] sched: Allocate JobId=20_0(29) NodeList=n11 #CPUs=2 "
           "Partition=preemptable\n"
           "[2026-11-28T13:22:48.436] sched/backfill: _start_job: Started JobId=19_1(34) in "
           "preemptable on n[11-12]\n"
           "[2026-11-28T13:22:49.000] sched/backfill: _start_job: HETJOB: Started JobId=19_2(35)"
           " in preemptable on n13\n"
           "[2026-11-28T13:22:50.000] sched: Allocate JobId=51 NodeList=n11 #CPUs=2 "
           "Partition=prod\n")
    got = summary.elastic_starts(log)
    assert sorted(got) == ["n11", "n12", "n13"] and len(got["n11"]) == 2
    assert got["n11"][1] - got["n11"][0] == pytest.approx(15.932)
