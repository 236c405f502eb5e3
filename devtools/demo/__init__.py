"""The demo's pieces: the Summit-gap main-queue workload, the summary from Slurm's records and
the workers' counters, the live view and the timeline (``scripts/demo.py`` runs them)."""
