"""The engine: pool, Job Monitor, Job Profiling Advisor and allocator behind one pure
``handle(event) -> actions`` interface, and a router for several engines side by side."""

from .config import EngineConfig, EngineStats, JobPhase, JobView, Policy
from .engine import Engine
from .monitor import Monitor
from .planner import Planner
from .router import Router

__all__ = ["Engine", "EngineConfig", "EngineStats", "JobPhase", "JobView", "Monitor", "Planner",
           "Policy", "Router"]
