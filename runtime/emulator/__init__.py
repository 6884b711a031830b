"""GPU-less engine emulator: performance model, acceptance, engine core, drivers."""
