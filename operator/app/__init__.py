"""The application: the `specpilot` command line, the demo and the bench commands."""
