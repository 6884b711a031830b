"""The tuner's maths (private): acceptance chains, the roofline, step cost, the surrogate
and schedule synthesis. Callers use the public face, `specpilot.tuner`."""
