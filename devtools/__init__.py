"""Development tools, not installed with the package: the local test clusters (Slurm,
OpenPBS) and the demo. Imported from the checkout by the tests, bench/ and scripts/."""
