"""specpilot.runtime: everything that knows an engine (args, metrics, processes)."""
