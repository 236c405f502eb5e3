"""The trace-driven simulator: the production Engine on a simulated cluster.

* :mod:`.traces`, :mod:`.sources` — idle-node traces (Summit per-node trace, SWF logs,
  synthetic);
* :mod:`.workloads` — job sets from the measured scaling profiles;
* :mod:`.perfmodel` — how a job progresses: true curve, noise, rescale and preemption costs;
* :mod:`.backend` — :class:`~.backend.SimBackend`, the Backend protocol over a trace;
* :mod:`.replay` — the virtual clock and event loop around one Engine;
* :mod:`.policies` — what each compared policy is told about the jobs;
* :mod:`.bounds` — UB_oracle and UB_lin;
* :mod:`.compare`, :mod:`.report` — several policies and seeds, the table, JSON and plots.
"""
