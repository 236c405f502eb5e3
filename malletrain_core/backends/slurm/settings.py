"""The Slurm settings ``malletrain admin check`` reads: ``scontrol show config``,
``slurm.conf``, one-line ``scontrol -o`` records and the site settings of our
job_submit.lua."""

from __future__ import annotations

import re

LUA_MARKER = "MalleTrain job_submit.lua"
EPILOG_MARKER = "MalleTrain's EpilogSlurmctld"
NULL = ("", "(null)", "none", "None")


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config`` → key → value (the first of each key). From 24.11 on a key
    that takes several scripts is printed once per script (``EpilogSlurmctld[0] = ...``): the
    values are joined with commas under the plain key."""
    out: dict[str, str] = {}
    listed: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w[\w/.-]*)(\[\d+\])?\s*=\s?(.*)$", line)
        if m and m.group(2):
            listed.setdefault(m.group(1), []).append(m.group(3).strip())
        elif m:
            out.setdefault(m.group(1), m.group(3).strip())
    for key, values in listed.items():
        out.setdefault(key, ",".join(values))
    return out


def parse_slurm_conf(text: str) -> dict[str, str]:
    """Top-level ``Key=Value`` lines of slurm.conf (keys lower-cased; nodes and partitions
    skipped)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep and " " not in key.strip() and key.strip().lower() not in (
                "nodename", "partitionname", "nodeset", "frontendname", "downnodes"):
            out[key.strip().lower()] = value.strip()
    return out


def parse_records(text: str) -> list[dict[str, str]]:
    """One-line ``scontrol -o`` records (``Key=Value`` separated by spaces)."""
    return [dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
            for line in text.splitlines() if line.strip()]


def lua_settings(text: str) -> dict[str, str]:
    """The site settings at the top of our job_submit.lua (``local NAME = value``)."""
    return {m.group(1): m.group(2).strip().strip('"') for m in
            re.finditer(r"^local\s+(QOS_NAME|KEEP_QOS|PARTITION|MAX_NODES)\s*=\s*(\S+)",
                        text, re.MULTILINE)}


def uid_of(value: str) -> int | None:
    m = re.search(r"\((\d+)\)", value)
    return int(m.group(1)) if m else None


def int_of(value: str | None) -> int | None:
    try:
        return int(str(value).split()[0])
    except (ValueError, IndexError):
        return None
