"""Readers of what a run leaves behind (the workers' step lines, the daemon's epoch lines),
shared by the tests that assert on a real run and the benches that time one."""
